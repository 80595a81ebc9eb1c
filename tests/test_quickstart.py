"""The quickstart's task family and a shrunken end-to-end run of ``clawgym quickstart``.

The family checks: the committed suites are exactly what the generator writes, held-out logs are
never in the train split, every task has the expert command scoring 1.0 and the ``wrong`` one
scoring below 1.0 in the real grader. The run checks the pipeline (evaluate → expert through mini →
SFT → GRPO → evaluate) on a few tasks; whether the full-size run learns is measured by running
``clawgym quickstart`` itself (its figures are in the README), not asserted here.
"""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tasks.families import count_errors

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/install.sh)")

FAMILY = Path(count_errors.__file__).resolve().parent


def _same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.diff_files or cmp.funny_files:
        return False
    mismatch = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)[1]
    return not mismatch and all(_same_tree(a / d, b / d) for d in cmp.common_dirs)


def test_committed_family_is_what_the_generator_writes(tmp_path):
    roots = count_errors.generate({"train": tmp_path / "train", "heldout": tmp_path / "heldout"})
    assert _same_tree(roots["train"], FAMILY / "count_errors_train")
    assert _same_tree(roots["heldout"], FAMILY / "count_errors_heldout")
    logs = {split: {(p / "input_files" / "app.log").read_text() for p in root.iterdir()}
            for split, root in roots.items()}
    assert len(logs["train"]) == 48 and len(logs["heldout"]) == 16
    assert not logs["train"] & logs["heldout"]


def test_every_task_grades_expert_one_and_wrong_below_one(tmp_path):
    for split in ("count_errors_train", "count_errors_heldout"):
        for task_dir in sorted((FAMILY / split).iterdir()):
            meta = json.loads((task_dir / "data_entry.json").read_text())["metadata"]
            log = (task_dir / "input_files" / "app.log").read_text()
            assert meta["expected"] == sum("ERROR" in line for line in log.splitlines())
            for command, want in ((count_errors.COMMAND, 1.0), (count_errors.WRONG_COMMAND, 0.5)):
                ws = tmp_path / "ws"
                shutil.rmtree(ws, ignore_errors=True)
                ws.mkdir()
                (ws / "app.log").write_text(log)
                subprocess.run(["bash", "-c", command], cwd=ws, check=False)
                scores = json.loads(subprocess.run(["python3", str(task_dir / "reward" / "check.py"), str(ws)],
                                                   capture_output=True, text=True, check=True).stdout)
                assert sum(scores.values()) / len(scores) == want, (task_dir.name, command, scores)


def test_verdict_says_plainly_what_happened():
    from trainers.quickstart import _verdict

    def ev(passed, n):
        return {"passed": passed, "episodes": n, "pass_rate": passed / n if n else None}

    assert _verdict(ev(40, 128), ev(80, 128)).startswith("RL improved over SFT")
    assert "within noise" in _verdict(ev(40, 128), ev(44, 128))
    assert _verdict(ev(60, 128), ev(50, 128)).startswith("RL did NOT improve")
    assert _verdict(ev(60, 128), ev(60, 128)).startswith("RL did NOT improve")
    assert "not comparable" in _verdict(ev(0, 0), ev(1, 2))


def test_quickstart_runs_end_to_end_on_a_few_tasks(tmp_path):
    pytest.importorskip("torch")
    from trainers import quickstart

    suites = {}
    for split, n in (("train", 4), ("heldout", 2)):
        src = FAMILY / f"count_errors_{split}"
        suites[split] = tmp_path / split
        for name in sorted(p.name for p in src.iterdir())[:n]:
            shutil.copytree(src / name, suites[split] / name)
    lines: list[str] = []
    cfg = quickstart.Config(out_dir=str(tmp_path / "out"), train_suite=str(suites["train"]),
                            heldout_suite=str(suites["heldout"]), concurrency=2, eval_samples=2, sft_steps=3,
                            sft_batch=2, rl_steps=2, rl_groups=1, rl_group_size=2)
    report = quickstart.run(cfg, echo=lines.append)
    for key in ("before_sft", "after_sft", "after_rl"):
        ev = report["eval"][key]
        assert ev["episodes"] + ev["infra_failures"] == 4 and ev["infra_failures"] == 0
        assert 0 <= ev["passed"] <= ev["episodes"]
    assert report["eval"]["before_sft"]["passed"] == 0  # a random-init model does not solve the task
    out = tmp_path / "out"
    saved = json.loads((out / "quickstart.json").read_text())
    assert saved["verdict"] == report["verdict"] and saved["verdict"].startswith("RL ")
    for png in ("quickstart.png", "sft/curves.png", "rl/curves.png"):
        assert (out / png).stat().st_size > 1000, png
    text = "\n".join(lines)
    assert "before SFT: 0.0% (0/4 episodes)" in text and report["verdict"] in text


def test_seeds_report_every_seed_and_their_mean(tmp_path, monkeypatch):
    from trainers import quickstart

    passed = {0: (0, 40, 50), 1: (0, 60, 55), 2: (1, 20, 44)}  # per seed: before SFT, after SFT, after RL (/64)
    seen = []

    def fake_run(cfg, echo=print):
        seen.append((cfg.seed, cfg.out_dir, cfg.seeds))
        ev = {k: {"pass_rate": p / 64, "passed": p, "episodes": 64, "infra_failures": 0}
              for k, p in zip(("before_sft", "after_sft", "after_rl"), passed[cfg.seed])}
        return {"eval": ev, "times": {"total_s": 60.0}}

    monkeypatch.setattr(quickstart, "run", fake_run)
    lines: list[str] = []
    summary = quickstart.run_seeds(quickstart.Config(out_dir=str(tmp_path), seeds="0,1,2"), echo=lines.append)
    assert seen == [(s, str(tmp_path / f"seed_{s}"), "") for s in (0, 1, 2)]
    assert summary["eval"]["after_rl"]["per_seed"] == [50 / 64, 55 / 64, 44 / 64]
    assert summary["eval"]["after_sft"]["mean"] == pytest.approx(40 / 64)
    assert summary["rl_gain"]["seeds_improved"] == 3 - 1  # seed 1 got worse: reported, not dropped
    text = "\n".join(lines)
    assert "per seed: 40/64, 60/64, 20/64" in text and quickstart.WHAT_IT_MEASURES in text
    assert json.loads((tmp_path / "quickstart_seeds.json").read_text())["seeds"] == [0, 1, 2]
    with pytest.raises(SystemExit, match="distinct integers"):
        quickstart.run_seeds(quickstart.Config(out_dir=str(tmp_path), seeds="1,1"))


def test_quickstart_rl_norm_gives_tokens_every_episode_sampled_no_net_push():
    """Why the quickstart's RL sank (issue 24, point 12): near convergence most sampled tokens are shared by
    every episode of a group, and a failure is a single slipped token, often ending the episode early. Under
    ``loss_norm="episode"`` a shared token's net weight ``Σ_e W[t,e]·A_e = Σ_e A_e / (G·N_e)`` is not 0 when
    the episodes' lengths differ: shorter failures push the correct shared tokens *down*, and four clipped
    epochs a step did so every step. Under ``"token"`` (the quickstart's norm) the weights are equal, the
    advantages sum to 0 in a group, and a token every episode sampled gets no net push."""
    torch = pytest.importorskip("torch")
    from clawgym_env.capture.records import CallRecord, EpisodeRecord
    from clawgym_env.episodes.run import EpisodeResult
    from trainers import quickstart
    from trainers.batch.tree_batch import make_groups, pack_groups

    def episode(eid: str, reward: float, out: list[int]) -> EpisodeResult:
        c = CallRecord(episode_id=eid, call_index=0, dialect="openai_chat", path="/v1/chat/completions",
                       stream=False, request={}, prompt_token_ids=[1, 2, 3], output_token_ids=out,
                       output_logprobs=[-0.01] * len(out), finish_reason="stop", policy_version=0)
        return EpisodeResult(EpisodeRecord(episode_id=eid, task_id="t", suite="unit", harness="mini", policy="tiny",
                                           status="ok", reward=reward, num_calls=1), [c])

    shared = [10, 11, 12]  # sampled by every episode; the failures slip after it and stop short
    eps = [episode(f"ok{i}", 1.0, shared + [20, 21, 22, 23, 24, 25]) for i in range(6)]
    eps += [episode(f"bad{i}", 0.0, shared + [90 + i]) for i in range(2)]

    def net_push_on_shared(norm: str) -> float:
        pack, = pack_groups(make_groups(eps), loss_norm=norm)
        on_shared = torch.isin(pack.packed.input_ids[pack.pair_token], torch.tensor(shared))
        return float((pack.pair_weight * pack.pair_adv)[on_shared].sum())

    assert quickstart.Config().rl_loss_norm == "token"
    assert abs(net_push_on_shared("token")) < 1e-7
    assert net_push_on_shared("episode") < -0.05  # the correct shared tokens were trained as if wrong


@pytest.mark.parametrize("bad", [{"rl_loss_norm": "tokens"}, {"sft_stop_nll": -1.0}])
def test_a_mistyped_option_is_refused_before_anything_runs_or_is_cleared(tmp_path, bad):
    pytest.importorskip("torch")
    from clawgym_env.errors import ConfigError
    from trainers import quickstart

    earlier = tmp_path / "out" / "rl" / "metrics.jsonl"  # an earlier run's output in the same folder
    earlier.parent.mkdir(parents=True)
    earlier.write_text('{"step": 1}\n')
    lines: list[str] = []
    with pytest.raises(ConfigError, match=next(iter(bad)).removeprefix("rl_").removeprefix("sft_")):
        quickstart.run(quickstart.Config(out_dir=str(tmp_path / "out"), **bad), echo=lines.append)
    assert lines == []  # refused before the policy was built or any stage ran
    assert earlier.read_text() == '{"step": 1}\n'
