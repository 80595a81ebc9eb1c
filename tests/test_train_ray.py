"""``clawgym train`` with ``scale.rollout.backend=ray``: GRPO whose episodes run on a 2-node local Ray cluster.

The trainer serves its in-process tiny Qwen3 over HTTP (``remote:http://IP:PORT`` in every rollout
worker), the real mini harness runs in bubblewrap on the workers, and the call records come back
through Ray. The fixture suite's verifier prints a random reward, so every group has distinct
rewards and every step makes an update: the run must end at version 2 after 2 steps.

What is checked: the run trains and writes its summary; each step's episodes ran on the fleet (both
nodes), one result per requested episode; every call's recorded ``policy_version`` is the trainer's
version when that step sampled (0, then 1), as the served policy reported it, and token-exact.
Without Ray: the ``scale.rollout`` section validates and documents itself for GRPO and PPO, and a step's
jobs through several harnesses come back from the fleet in job order, ``group_size`` per job.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/install.sh)")

REWARD_SH = """#!/usr/bin/env bash
set -euo pipefail
python3 -c 'import random; print(random.random())'
"""


def make_suite(root: Path) -> Path:
    suite = root / "noise"
    for i in range(2):
        d = suite / f"noise_{i}"
        (d / "reward").mkdir(parents=True)
        (d / "data_entry.json").write_text(json.dumps({
            "task_id": f"noise_{i}", "user_query": f"Say something ({i}).",
            "input_mount_dir": "/root/.openclaw/workspace", "metadata": {"grading_type": "automated"},
            "limits": {"timeout_s": 60, "max_turns": 2, "reward_timeout_s": 30}}))
        (d / "reward" / "reward.sh").write_text(REWARD_SH)
    return suite


# -- without Ray --------------------------------------------------------------------------------

def test_rollout_section_validates_and_documents_itself():
    from trainers.config_doc import ConfigError, describe, validate
    from trainers.grpo import train as grpo
    from trainers.ppo import train as ppo
    from trainers.rollouts.sync import RolloutConfig, rollout_fleet

    for algo in (grpo, ppo):
        args = validate(algo.Args, {"scale": {"rollout": {"backend": "ray", "ray_address": "auto",
                                                          "max_attempts": 2}}})
        assert args.scale.rollout == RolloutConfig(backend="ray", ray_address="auto", max_attempts=2)
        assert algo.Args().scale.rollout.backend == "threads"
        text = describe(algo.Args)
        assert "scale.rollout.max_episodes_per_node: int = 4" in text and "(undocumented)" not in text
        with pytest.raises(ConfigError, match="config.scale.rollout.backend"):
            validate(algo.Args, {"scale": {"rollout": {"backend": "k8s"}}})
        with pytest.raises(ConfigError, match="did you mean max_attempts"):
            validate(algo.Args, {"scale": {"rollout": {"max_attemps": 2}}})
        with pytest.raises(ConfigError, match="`rollout` moved to `scale.rollout`"):
            validate(algo.Args, {"rollout": {"backend": "ray"}})
    with rollout_fleet(RolloutConfig(), policy=None) as fleet:  # type: ignore[arg-type]
        assert fleet is None  # threads: nothing is served, Ray is not touched


class _FakeRayFleet:
    """Answers each (task, sample, adapter) job at once, in reverse order, through ``on_result``."""

    def __init__(self):
        self.batches = []

    def run_mixed(self, jobs, *, on_result=None, **kwargs):
        from clawgym_env.episodes.run import EpisodeResult
        from clawgym_env.fleet.worker import infra_result

        self.batches.append(([(t.id, s, a) for t, s, a in jobs], kwargs))
        results: list[EpisodeResult] = []
        for i, (task, sample, adapter) in reversed(list(enumerate(jobs))):
            r = infra_result(task, adapter, "fake", "internal", f"{task.id}#{sample}")
            results.append(r)
            on_result(i, r)
        return results[::-1]


def test_jobs_through_several_harnesses_come_back_in_job_order():
    from clawgym_env.task import Task
    from trainers.rollouts.sync import RolloutConfig, RolloutFleet, run_jobs

    tasks = [Task(id=f"t{i}", instruction="x") for i in range(3)]
    jobs = [(tasks[0], "a"), (tasks[1], "b"), (tasks[2], "a")]
    rf = RolloutFleet(RolloutConfig(backend="ray"), policy=None)  # type: ignore[arg-type]
    rf.fleet = fake = _FakeRayFleet()  # type: ignore[assignment]
    seen: list = []
    results = run_jobs(None, jobs, group_size=2, policy_version=7, adapters={"a": "a", "b": "b"}, fleet=rf,
                       progress=seen.append, sampling={"max_tokens": 8})
    assert [r.record.error for r in results] == ["t0#0", "t0#1", "t1#0", "t1#1", "t2#0", "t2#1"]
    assert [r.record.harness for r in results] == ["a", "a", "b", "b", "a", "a"]
    assert [jobs for jobs, _ in fake.batches] == [[("t0", 0, "a"), ("t0", 1, "a"), ("t1", 0, "b"), ("t1", 1, "b"),
                                                   ("t2", 0, "a"), ("t2", 1, "a")]]  # one batch, harnesses mixed
    assert all(kw["policy_version"] == 7 and kw["sampling"].max_tokens == 8 for _, kw in fake.batches)
    assert len(seen) == 6


# -- on a 2-node local Ray cluster ---------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="the ray rollout backend needs Ray: pip install 'clawgym[ray]'")
    from ray.cluster_utils import Cluster

    cl = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cl.add_node(num_cpus=2)
    ray.init(address=cl.address, log_to_driver=False)
    try:
        yield cl
    finally:
        ray.shutdown()
        cl.shutdown()


@pytest.mark.slow
@needs_bwrap
def test_grpo_trains_on_the_ray_fleet_with_the_step_version_on_every_call(cluster, tmp_path, monkeypatch):
    import trainers.grpo.train as grpo
    from clawgym_cli.main import main

    out = tmp_path / "run"
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(f"""algo: grpo
out_dir: {out}
suite: {make_suite(tmp_path)}
steps: 2
groups_per_step: 1
group_size: 4
max_tokens: 8
learning_rate: 0.001
log:
  progress: false
  plot: false
policy:
  model: tiny
  seed: 1
""")
    steps: list[tuple[int | None, bool, list]] = []
    real_run_jobs = grpo.run_jobs

    def spy(runtime, jobs, **kwargs):
        results = real_run_jobs(runtime, jobs, **kwargs)
        steps.append((kwargs.get("policy_version"), kwargs.get("fleet") is not None, results))
        return results

    monkeypatch.setattr(grpo, "run_jobs", spy)
    assert main(["train", "--config", str(cfg), "--set", "scale.rollout.backend=ray",
                 "--set", f"scale.rollout.ray_address={cluster.address}",
                 "--set", "scale.rollout.max_episodes_per_node=2"]) == 0

    summary = json.loads((out / "summary.json").read_text())
    assert summary["algo"] == "grpo" and summary["version"] == 2, summary
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["version"]) for r in rows] == [(1, 1), (2, 2)]
    assert [v for v, _, _ in steps] == [0, 1] and all(on_fleet for _, on_fleet, _ in steps)
    nodes = set()
    for version, _, results in steps:
        assert len(results) == 4
        scored = [r for r in results if not r.record.is_infra_failure]
        assert len(scored) >= 2, [(r.record.status, r.record.error) for r in results]
        for r in results:
            nodes.add(r.record.logs["fleet_node"])
            assert r.record.policy_version == version
            for call in r.calls:
                assert call.policy_version == version and call.token_exact and call.policy_name == "trainee"
        assert sum(len(r.calls) for r in scored) >= 2
    assert len(nodes) == 2, "both nodes ran episodes"
