"""``clawgym train`` end to end: a tiny Qwen3 through the real mini harness in the bwrap sandbox.

The task is a fixture whose verifier scores the parity of the final answer's length, so even a
random policy gets groups with different rewards (and updates happen); the assertions do not
depend on that luck: they check the metrics, the checkpoint and that a second run resumes at
step 3 with the saved weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from clawgym_cli.main import main  # noqa: E402
from trainers.scale.checkpoint import checkpoint_tensors, stored_keys  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/install.sh)")

REWARD_SH = """#!/usr/bin/env bash
set -euo pipefail
python3 -c 'import json, os
p = json.load(open(os.environ["OPENCLAW_REWARD_PAYLOAD"]))
m = p.get("final_message") or ""
print(1.0 if len(m) % 2 == 0 else 0.0)'
"""


def make_suite(root: Path) -> Path:
    suite = root / "parity"
    for i in range(2):
        d = suite / f"parity_{i}"
        (d / "reward").mkdir(parents=True)
        (d / "data_entry.json").write_text(json.dumps({
            "task_id": f"parity_{i}", "user_query": f"Say something ({i}).",
            "input_mount_dir": "/root/.openclaw/workspace", "metadata": {"grading_type": "automated"},
            "limits": {"timeout_s": 60, "max_turns": 2, "reward_timeout_s": 30}}))
        (d / "reward" / "reward.sh").write_text(REWARD_SH)
    return suite


def write_config(path: Path, out: Path, suite: Path, steps: int) -> Path:
    path.write_text(f"""# a two-step GRPO run on the tiny policy
algo: grpo
out_dir: {out}
suite: {suite}
steps: {steps}
groups_per_step: 1
group_size: 3
concurrency: 3
max_tokens: 8
learning_rate: 0.001
log:
  progress: false
policy:
  model: tiny
  seed: 1
""")
    return path


def test_train_runs_checkpoints_and_resumes(tmp_path, capsys):
    suite = make_suite(tmp_path)
    out = tmp_path / "run"
    cfg = write_config(tmp_path / "grpo.yaml", out, suite, steps=2)
    assert main(["train", "--config", str(cfg)]) == 0
    first = capsys.readouterr().out
    assert "grpo finished" in first
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["episodes"] + r["infra_failures"] == 3 and r["mini/episodes"] == r["episodes"]
        assert r["groups"] == 1 and r["version"] == sum(x["groups_trained"] for x in rows if x["step"] <= r["step"])
    ckpt = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    assert ckpt.name == "step_000002"
    state = json.loads((ckpt / "state.json").read_text())
    assert state["step"] == 2 and state["config"]["steps"] == 2 and state["version"] == rows[-1]["version"]
    saved = checkpoint_tensors(ckpt)["policy"]
    assert any(k.startswith("optim.") for k in stored_keys(ckpt)) and (out / "curves.png").is_file()
    assert json.loads((out / "config.json").read_text())["algo"] == "grpo"

    # resume: the same config with three steps continues at step 3 from the saved weights
    import trainers.grpo.train as grpo

    seen = {}
    real_update = grpo.grpo_update

    def spy(policy, optimizer, packs, args):
        seen.setdefault("weights", {k: v.detach().clone() for k, v in policy.state_dict().items()})
        return real_update(policy, optimizer, packs, args)

    grpo.grpo_update = spy
    try:
        assert main(["train", "--config", str(cfg), "--set", "steps=3"]) == 0
    finally:
        grpo.grpo_update = real_update
    second = capsys.readouterr().out
    assert "resumed from" in second and "step 2" in second
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    state3 = json.loads((out / "checkpoints" / "step_000003" / "state.json").read_text())
    assert state3["step"] == 3 and state3["version"] == rows[-1]["version"] >= state["version"]
    if "weights" in seen:  # step 3 had a group with different rewards: it trained from the checkpoint
        assert all(torch.equal(saved[k], v) for k, v in seen["weights"].items())


def test_config_errors_name_the_key(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("algo: grpo\ngroup_sise: 4\n")
    assert main(["train", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "group_sise" in err and "group_size" in err
    cfg.write_text("algo: grpo\npolicy:\n  lora_rank: many\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "policy.lora_rank" in capsys.readouterr().err
    cfg.write_text("algo: nosuchalgo\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "nosuchalgo" in capsys.readouterr().err


def test_shipped_configs_parse():
    from trainers.train import apply_overrides, args_from_config, load_config

    root = Path(__file__).resolve().parents[1] / "trainers" / "configs"
    shipped = sorted(root.glob("*.yaml"))
    assert {"grpo.yaml", "grpo_mix.yaml", "sft.yaml", "ppo.yaml", "grpo_vllm.yaml", "qwen3_8b_lora_1gpu.yaml",
            "qwen3_30b_a3b_8gpu.yaml"} <= {p.name for p in shipped}
    for path in shipped:
        module, args = args_from_config(apply_overrides(load_config(path), []))
        assert args.__class__ is module.Args


def test_harness_plan_splits_groups_by_ratio():
    from trainers.rollouts.sync import harness_available, harness_plan

    assert harness_available("mini") == (True, "")
    assert harness_available("nosuch")[0] is False
    plan = harness_plan({"mini": 3.0, "codex": 1.0}, 8)
    assert sum(plan.values()) == 8
    assert plan == ({"mini": 6, "codex": 2} if harness_available("codex")[0] else {"mini": 8})
    assert harness_plan({"mini": 1.0}, 3) == {"mini": 3}


def test_every_config_field_is_documented_and_shown_by_help_config(capsys):
    from trainers.config_doc import undocumented
    from trainers.train import algorithm, available_algorithms

    assert set(available_algorithms()) >= {"grpo", "ppo", "sft"}
    for name in available_algorithms():
        assert undocumented(algorithm(name).Args) == [], name
    assert main(["train", "--help-config", "ppo"]) == 0
    out = capsys.readouterr().out
    assert "critic_learning_rate: float = 1e-05" in out and "AdamW learning rate of the critic" in out
    assert "policy.lora_rank: int = 0" in out and "(undocumented)" not in out


def test_config_validation_names_every_bad_key_and_runs_the_args_checks(tmp_path, capsys):
    from trainers.config_doc import ConfigError, validate
    from trainers.grpo.train import Args

    with pytest.raises(ConfigError) as err:
        validate(Args, {"steps": "many", "policy": {"lora_rnak": 4}, "learning_rate": 1})
    text = str(err.value)
    assert "config.steps" in text and "config.policy.lora_rnak" in text and "lora_rank" in text
    assert validate(Args, {"learning_rate": 1}).learning_rate == 1.0  # an int where a float is expected
    with pytest.raises(ConfigError, match="loss_norm"):
        validate(Args, {"loss_norm": "sum"})
    assert main(["train"]) == 2 and "--config FILE is required" in capsys.readouterr().err


def test_a_key_that_moved_into_a_section_is_refused_with_its_new_place(tmp_path, capsys):
    from trainers.config_doc import ConfigError, validate
    from trainers.grpo.train import Args
    from trainers.sft.train import Args as SFTArgs

    for old, new in (("generation", "scale.generation"), ("dist", "scale.dist"), ("async", "scale.async"),
                     ("rollout", "scale.rollout"), ("eval_every", "eval.every"), ("tensorboard", "log.tensorboard")):
        with pytest.raises(ConfigError, match=f"`{old}` moved to `{new}`"):
            validate(Args, {old: {} if "." not in new or new.startswith("scale") else 1})
    with pytest.raises(ValueError, match="`progress` moved to `log.progress`"):  # a ConfigError is a ValueError
        validate(SFTArgs, {"progress": False})
    args = validate(Args, {"scale": {"async": {"max_staleness": 1}, "dist": {"backend": "gloo"}},
                           "eval": {"every": 2}, "log": {"plot": False}})
    assert (args.scale.async_.max_staleness, args.scale.dist.backend, args.eval.every, args.log.plot) == (1, "gloo",
                                                                                                        2, False)
    cfg = tmp_path / "old.yaml"
    cfg.write_text("algo: grpo\nsteps: 1\n")
    assert main(["train", "--config", str(cfg), "--set", "generation.replicas=2"]) == 2
    assert "`generation` moved to `scale.generation`" in capsys.readouterr().err


def test_grpo_top_level_fields_stay_few_and_scale_out_is_one_section():
    import dataclasses

    from trainers.grpo.train import Args
    from trainers.ppo.train import Args as PPOArgs
    from trainers.run_args import RLArgs, ScaleArgs

    assert len(dataclasses.fields(Args)) <= 41  # 39, then harness_options and harness_cache_dir (issue 25)
    assert issubclass(Args, RLArgs) and issubclass(PPOArgs, RLArgs)
    names = {f.name for f in dataclasses.fields(Args)}
    assert not names & {"dist", "generation", "rollout", "async_"} and {f.name for f in dataclasses.fields(
        ScaleArgs)} == {"dist", "generation", "rollout", "async_"}
