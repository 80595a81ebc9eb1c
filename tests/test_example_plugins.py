"""The example plugin package (``examples/clawgym_example_plugins``), driven as a user drives it: installed with
``pip install -e``, every plugin found through its entry point and run from the ``clawgym`` command line in a
subprocess, with no edit to this project. Skips (naming the install command) when the package is not installed."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

INSTALL = "pip install -e examples/clawgym_example_plugins"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("clawgym_example_plugins") is None,
                                reason=f"the example plugin package is not installed: {INSTALL}")

DIST = "clawgym-example-plugins"
DECLARED = {"clawgym.algorithms": "example-reinforce", "clawgym.harnesses": "example-agent",
            "clawgym.suites": "example", "clawgym.graders": "example-files"}


def clawgym(*args: str, cwd: Path, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """``clawgym ARGS`` as a subprocess in ``cwd`` (outside the checkout: nothing is imported from it by path)."""
    proc = subprocess.run([sys.executable, "-m", "clawgym_cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if check:
        assert proc.returncode == 0, f"clawgym {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def rows(path: Path) -> list[dict[str, object]]:
    """The JSON lines of ``path``."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_distribution_declares_each_plugin_as_an_entry_point():
    eps = importlib.metadata.distribution(DIST).entry_points
    found = {(ep.group, ep.name) for ep in eps}
    assert set(DECLARED.items()) <= found
    from clawgym_env import plugins

    for registry, name in ((plugins.algorithms, "example-reinforce"), (plugins.harnesses, "example-agent"),
                           (plugins.suites, "example"), (plugins.graders, "example-files")):
        assert name in registry.names(), f"{registry}: {registry.names()}"


def test_harness_list_shows_the_example_harness(tmp_path):
    listed = clawgym("harness", "list", cwd=tmp_path).stdout.split()
    assert "example-agent" in listed and "mini" in listed


def test_tasks_list_shows_the_example_suite(tmp_path):
    lines = clawgym("tasks", "list", "--suite", "example", cwd=tmp_path).stdout.splitlines()
    assert sorted(line.split("\t")[0] for line in lines) == ["example/greeting", "example/total"]


@pytest.mark.parametrize(("policy", "reward"), [("scripted:expert", 1.0), ("scripted:wrong", 0.0)])
def test_eval_scores_the_example_suite_through_the_example_harness(tmp_path, policy, reward):
    out = tmp_path / "results.jsonl"
    proc = clawgym("eval", "--suite", "example", "--harness", "example-agent", "--policy", policy,
                   "--out", str(out), "--no-progress", cwd=tmp_path)
    results = rows(out)
    assert sorted(r["task_id"] for r in results) == ["greeting", "total"]
    assert all(r["status"] == "ok" and r["reward"] == reward for r in results), results
    assert f"Pass@1 {reward:.3f}" in proc.stdout


def test_the_suite_grader_is_the_plugin_grader(tmp_path):
    episodes = tmp_path / "eps"
    proc = clawgym("run", "--harness", "example-agent", "--task", "example/greeting", "--policy", "scripted:expert",
                   "--json", "--out", str(episodes), cwd=tmp_path)
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["reward"] == 1.0
    # the grader data_entry.json names scored it: its own subscores (a reward.sh grader has none of these)
    assert record["subscores"] == {"file:greeting.txt": 1.0, "answer": 1.0}


def test_harness_check_passes_for_the_example_harness(tmp_path):
    out = clawgym("harness", "check", "example-agent", cwd=tmp_path).stdout
    assert "reward 1.00" in out
    assert "tools offered                        3: shell, write, read" in out
    assert "token-exact calls                    100%" in out


def test_train_runs_the_example_algorithm_from_a_config(tmp_path):
    config = tmp_path / "reinforce.yaml"
    config.write_text("algo: example-reinforce\nout_dir: run\nsteps: 2\ntasks_per_step: 1\ngroup_size: 2\n"
                      "max_tokens: 16\nmax_context_tokens: 4096\nmax_pack_tokens: 8192\nconcurrency: 2\n"
                      "log: {progress: false, plot: false}\n", encoding="utf-8")
    proc = clawgym("train", "--config", str(config), cwd=tmp_path)
    assert "== example-reinforce finished" in proc.stdout
    run = tmp_path / "run"
    metrics = rows(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["episodes"] == 2 and m["groups"] == 1 for m in metrics)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algo"] == "example-reinforce" and summary["steps"] == 2
    assert (tmp_path / summary["checkpoint"]).is_dir()  # relative to the directory train ran in, as configured
    assert json.loads((run / "config.json").read_text())["algo"] == "example-reinforce"


def test_help_config_lists_the_example_algorithms_fields(tmp_path):
    out = clawgym("train", "--help-config", "example-reinforce", cwd=tmp_path).stdout
    for field in ("harness", "tasks_per_step", "group_size", "policy.model"):
        assert field in out


def test_a_bad_example_config_is_a_clear_error(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("algo: example-reinforce\ngroup_size: 1\n", encoding="utf-8")
    proc = clawgym("train", "--config", str(config), cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "group_size" in proc.stderr


def test_reinforce_loss_moves_the_policy_toward_the_better_episode(tmp_path):
    """The loss of the example algorithm on a real group (the expert's and the wrong script's episodes through
    the example harness, rewards 1 and 0): a few SGD steps raise the mean logprob of the expert's sampled tokens
    and lower the wrong episode's."""
    import torch
    from clawgym_example_plugins.reinforce import reinforce_loss

    from trainers.api import PolicyConfig, Runtime, TrainablePolicy, load_suite, make_groups, pack_groups, run_jobs

    task = load_suite("example").get("total")
    results = []
    for policy in ("scripted:expert", "scripted:wrong"):
        with Runtime(policy, out_dir=tmp_path / policy.replace(":", "-")) as rt:
            results += run_jobs(rt, [(task, "example-agent")], group_size=1)
    assert [r.record.reward for r in results] == [1.0, 0.0]
    groups = make_groups(results, normalize_std=False)
    assert len(groups) == 1 and groups[0].skipped is None and groups[0].advantages == [0.5, -0.5]
    (pack,) = pack_groups(groups)
    policy = TrainablePolicy(PolicyConfig(model="tiny", device="cpu"))

    def episode_means() -> list[float]:
        from trainers.api import token_logprobs

        with torch.no_grad():
            logp = token_logprobs(policy.causal_lm, pack.packed, mask=pack.trainable, vocab_limit=policy.vocab_limit)
        lp = logp[pack.pair_token]
        return [float(lp[pack.pair_episode == e].mean()) for e in range(len(pack.episodes))]

    before = episode_means()
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        reinforce_loss(policy, pack, temperature=1.0, chunk_size=1024).backward()
        optimizer.step()
    after = episode_means()
    assert after[0] > before[0] and after[1] < before[1], (before, after)


def test_the_grader_reads_no_link_and_scores_partial_work(tmp_path):
    """A link the agent planted is a failed check (never read through), and each check is a share of the reward."""
    from clawgym_example_plugins.grader import FilesGrader

    from clawgym_env.grading.grader import GradeContext
    from trainers.api import load_suite

    task = load_suite("example").get("greeting")
    outside = tmp_path / "outside.txt"
    outside.write_text("Hello, Ada!\n")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "greeting.txt").symlink_to(outside)
    linked = FilesGrader().grade(GradeContext(task=task, workspace=workspace, final_message="Hello, Ada!"))
    assert linked.status == "ok" and linked.subscores == {"file:greeting.txt": 0.0, "answer": 1.0}
    assert linked.reward == 0.5 and "file:greeting.txt" in (linked.reason or "")
    (workspace / "greeting.txt").unlink()
    (workspace / "greeting.txt").write_text("Hello, Ada!\n")
    assert FilesGrader().grade(GradeContext(task=task, workspace=workspace, final_message="hi")).reward == 0.5
    assert FilesGrader().grade(GradeContext(task=task, workspace=workspace, final_message="Hello, Ada!")).reward == 1.0
    bare = task.model_copy(update={"metadata": {}})
    assert FilesGrader().grade(GradeContext(task=bare, workspace=workspace)).status == "reward_invalid"


def test_eval_through_the_example_dialect_records_its_calls_under_its_name(tmp_path):
    """``--harness-opt wire=example``: the agent speaks the package's own dialect; the proxy serves it from the
    entry point, the expert still scores 1.0, and every call is recorded under ``example_turns``, token-exact."""
    out, episodes = tmp_path / "results.jsonl", tmp_path / "episodes"
    clawgym("eval", "--suite", "example", "--harness", "example-agent", "--harness-opt", "wire=example",
            "--policy", "scripted:expert", "--out", str(out), "--episodes-dir", str(episodes), "--no-progress",
            cwd=tmp_path)
    results = rows(out)
    assert len(results) == 2 and all(r["reward"] == 1.0 for r in results), results
    calls = [c for path in sorted(episodes.rglob("calls.jsonl")) for c in rows(path)]
    assert len(calls) >= 4
    assert {c["dialect"] for c in calls} == {"example_turns"}
    assert all(c["path"].endswith("/example/v1/turn") and c["token_exact"] for c in calls)


def test_the_example_dialect_answers_errors_side_calls_and_streams_in_its_own_shapes(tokenizer):
    import httpx

    from clawgym_env.proxy.server import ProxyServer
    from clawgym_env.testing import EchoScriptPolicy

    with ProxyServer(EchoScriptPolicy(tokenizer)) as server:
        session = server.open_episode()
        root = session.base_url(server.url).removesuffix("/v1")
        body = {"model": "m", "turns": [{"from": "user", "text": "hello there"}]}
        answer = httpx.post(f"{root}/example/v1/turn", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["turn"]["text"].startswith("Echo: hello there")
        assert answer.json()["usage"]["out"] > 0
        streamed = httpx.post(f"{root}/example/v1/turn", json={**body, "stream": True}, timeout=60).text
        events = [line.removeprefix("data: ") for line in streamed.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[0])["turn"] == answer.json()["turn"]
        bad = httpx.post(f"{root}/example/v1/turn", json={"turns": [{"from": "robot", "text": "x"}]}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "turns.0.from"
        empty = httpx.post(f"{root}/example/v1/turn", json={"turns": []}, timeout=60)
        assert empty.status_code == 400 and empty.json()["error"]["field"] == "turns"
        count = httpx.post(f"{root}/example/v1/count", json=body, timeout=60).json()
        assert count == {"tokens": len(tokenizer.encode("hello there", add_special_tokens=False))}
        calls = server.close_episode(session.token)
    assert [c.dialect for c in calls] == ["example_turns", "example_turns"]  # the two turns; no error, no side call


def test_a_misspelt_grader_is_a_load_issue_naming_the_close_name(tmp_path, monkeypatch):
    import shutil

    from clawgym_example_plugins import suite

    root = tmp_path / "suite_data"
    shutil.copytree(suite.ROOT, root)
    entry = json.loads((root / "total" / "data_entry.json").read_text())
    (root / "total" / "data_entry.json").write_text(json.dumps({**entry, "grader": "exampel-files"}))
    monkeypatch.setattr(suite, "ROOT", root)
    loaded = suite.load_example_suite()
    assert [t.id for t in loaded.tasks] == ["greeting"]
    (issue,) = loaded.issues
    assert "exampel-files" in issue.error and "did you mean example-files" in issue.error
