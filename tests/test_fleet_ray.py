"""Rollouts on Ray: a 2-node local cluster, the echo suite and harness, the scripted expert.

What is checked: the Ray backend returns the same results as the threads backend (one per requested
episode, in order, token for token); a sandbox that cannot start on one node, an episode that hangs
there, and a worker process killed mid-batch are each recorded as infrastructure failures and retried
on the other node, every (task, sample) ending exactly once; retries are bounded and an episode that
never ran is an ``infra_error``, never a reward. The cluster-free parts (config checks, node caps,
counts) run without Ray.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
import time

import pytest

from clawgym_env.errors import SandboxError
from clawgym_env.fleet import FleetConfig, FleetProgress, FleetStats, RayFleet, WorkerInfo
from clawgym_env.sandbox.bwrap.sandbox import BwrapSandbox
from clawgym_env.task import TaskLimits
from clawgym_env.testing import EchoHarness, echo_suite

HANG_S = 28.0
"""How long the hanging sandbox blocks its worker's thread (longer than the hung tasks' deadline)."""


class _FailingSandbox(BwrapSandbox):
    def __enter__(self) -> _FailingSandbox:
        raise SandboxError("test fault: this node's sandbox cannot start")


class _HangingSandbox(BwrapSandbox):
    def __enter__(self) -> _HangingSandbox:
        time.sleep(HANG_S)
        raise SandboxError("test fault: this node's sandbox hung")


def _setup(info: WorkerInfo) -> None:
    """Runs in every worker process: fault-injecting sandboxes by name, faulty on worker 0 only."""
    from clawgym_env.plugins import sandboxes

    first = info.index == 0
    sandboxes.register("fails-on-first", _FailingSandbox if first else BwrapSandbox, replace=True)
    sandboxes.register("hangs-on-first", _HangingSandbox if first else BwrapSandbox, replace=True)
    sandboxes.register("fails-everywhere", _FailingSandbox, replace=True)


# -- without Ray --------------------------------------------------------------------------------

def test_config_names_the_field_and_the_fix():
    with pytest.raises(ValueError, match="max_episodes_per_node: must be >= 1"):
        FleetConfig(policy="scripted:expert", max_episodes_per_node=0)
    with pytest.raises(ValueError, match="policy: give a policy spec string"):
        FleetConfig(policy="")
    cfg = FleetConfig(policy="scripted:expert", max_episodes_per_node=16, episode_cpus=2.0, episode_memory_mb=1024)
    assert cfg.node_capacity(8) == 4                      # CPUs bound it
    assert cfg.node_capacity(64, 3 * 2**30) == 3          # memory bounds it
    assert cfg.node_capacity(1) == 0                      # no room for one episode
    assert FleetConfig(policy="x", max_episodes_per_node=2).node_capacity(64) == 2  # the per-node cap


def test_stats_count_each_episode_once():
    stats = FleetStats(3, ["a", "b"])
    for node in ("a", "a", "b"):
        stats.dispatched(node, "echo")
    stats.ended("a", "echo", final=False, infra=True)  # retried
    stats.dispatched("b", "echo")
    for node in ("a", "b", "b"):
        stats.ended(node, "echo", final=True, infra=False, calls=2)
    p = stats.snapshot()
    assert (p.total, p.done, p.running, p.queued, p.infra_failed, p.retried, p.calls) == (3, 3, 0, 0, 1, 1, 6)
    assert p.nodes["a"].done == 1 and p.nodes["a"].infra_failed == 1 and p.nodes["b"].done == 2
    assert p.harnesses["echo"].done == 3 and "q=0" in p.line()


def test_ray_pool_needs_a_policy_spec():
    from clawgym_env.envs.runtime import RolloutPool

    with pytest.raises(ValueError, match="spec string"):
        RolloutPool(None, backend="ray")
    pool = RolloutPool(None, backend="ray", fleet=FleetConfig(policy="scripted:expert"))
    assert pool.fleet is None and pool.fleet_config is not None  # nothing starts before run()


# -- on a 2-node local Ray cluster ---------------------------------------------------------------

@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    ray = pytest.importorskip("ray", reason="the ray backend needs Ray: pip install 'clawgym[ray]'")
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fault sandboxes travel by value
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    cfg = FleetConfig(policy="scripted:expert", out_dir=str(tmp_path_factory.mktemp("fleet-eps")),
                      max_episodes_per_node=2, episode_cpus=0.5, worker_setup=_setup, deadline_grace_s=2.0,
                      max_attempts=3, start_timeout_s=180.0, poll_s=0.2)
    try:
        with RayFleet(cfg) as started:
            assert len(started.workers) == 2 and len({w.info.node_id for w in started.workers}) == 2
            yield started
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return echo_suite(tmp_path_factory.mktemp("echo-suite"))


def _indices_once(results, tasks, samples):
    assert [r.record.task_id for r in results] == [t.id for t in tasks for _ in range(samples)]
    assert len({r.record.episode_id for r in results}) == len(results)  # no duplicates


@pytest.mark.slow
def test_ray_backend_gives_the_threads_results(fleet, suite, expert_runtime):
    from clawgym_env.envs.runtime import RolloutPool

    seen: list[FleetProgress] = []
    fleet.progress = seen.append
    try:
        on_ray = RolloutPool(None, backend="ray", fleet=fleet, progress=False).run(suite.tasks, EchoHarness())
    finally:
        fleet.progress = None
    on_threads = RolloutPool(expert_runtime, concurrency=2, progress=False).run(suite.tasks, EchoHarness())
    _indices_once(on_ray, suite.tasks, 1)
    for ray_r, thr_r in zip(on_ray, on_threads):
        assert ray_r.record.status == thr_r.record.status == "ok", (ray_r.record.error, ray_r.record.logs)
        assert ray_r.record.reward == thr_r.record.reward == 1.0
        assert [c.prompt_token_ids for c in ray_r.calls] == [c.prompt_token_ids for c in thr_r.calls]
        assert [c.output_token_ids for c in ray_r.calls] == [c.output_token_ids for c in thr_r.calls]
        assert all(c.token_exact for c in ray_r.calls)
    assert len({r.record.logs["fleet_node"] for r in on_ray}) == 2, "both nodes ran episodes"
    assert not fleet.attempts
    last = seen[-1]
    assert (last.done, last.queued, last.running, last.infra_failed) == (3, 0, 0, 0)
    assert all(c.running <= 2 for p in seen for c in p.nodes.values()), "the per-node cap holds"
    assert [p.queued for p in seen][0] == 2 and last.harnesses["echo"].done == 3 and last.episodes_per_s > 0


@pytest.mark.slow
def test_sandbox_that_cannot_start_is_retried_on_the_other_node(fleet, suite):
    results = fleet.run(suite.tasks, EchoHarness(), samples=2, sandbox="fails-on-first")
    _indices_once(results, suite.tasks, 2)
    assert all(r.record.status == "ok" and r.record.reward == 1.0 for r in results)
    first, second = fleet.workers[0].info.node, fleet.workers[1].info.node
    assert {r.record.logs["fleet_node"] for r in results} == {second}
    assert fleet.attempts and all(a.boundary == "sandbox" and a.retried and a.node == first for a in fleet.attempts)
    assert fleet.stats is not None and fleet.stats.snapshot().infra_failed == len(fleet.attempts)


@pytest.mark.slow
def test_retries_are_bounded_and_never_a_reward(fleet, suite):
    tasks = suite.tasks[:2]
    results = fleet.run(tasks, EchoHarness(), sandbox="fails-everywhere")
    _indices_once(results, tasks, 1)
    for r in results:
        assert r.record.status == "infra_error" and r.record.failure_boundary == "sandbox"
        assert r.record.is_infra_failure and r.record.logs["fleet_attempts"] == "3"
    per_index = collections.Counter(a.index for a in fleet.attempts)
    assert per_index == {0: 3, 1: 3}
    assert [a.retried for a in fleet.attempts if a.attempt == 3] == [False, False]


@pytest.mark.slow
def test_worker_killed_mid_batch_loses_nothing(fleet, suite):
    victim = fleet.workers[0]
    killed: list[int] = []

    def kill_when_busy(p: FleetProgress) -> None:
        if not killed and p.done >= 1 and p.nodes[victim.info.node].running >= 1:
            killed.append(victim.info.pid)
            os.kill(victim.info.pid, signal.SIGKILL)

    fleet.progress = kill_when_busy
    try:
        results = fleet.run(suite.tasks, EchoHarness(), samples=3)
    finally:
        fleet.progress = None
    assert killed, "the batch ended before the worker could be killed"
    _indices_once(results, suite.tasks, 3)
    assert all(r.record.status == "ok" for r in results), [(r.record.status, r.record.error) for r in results]
    assert [r.record.reward for r in results] == [1.0] * 9  # the expert solves every echo task
    died = [a for a in fleet.attempts if "died" in (a.error or "")]
    assert died and all(a.boundary == "internal" and a.retried and a.node == victim.info.node for a in died)


@pytest.mark.slow
def test_hung_episode_is_abandoned_and_retried(fleet, tmp_path):
    assert fleet.wait_ready(180) == 2, "both workers are up (the first was restarted after the kill)"
    quick = echo_suite(tmp_path / "quick", limits=TaskLimits(timeout_s=12, reward_timeout_s=6))  # deadline 20 s
    results = fleet.run(quick.tasks, EchoHarness(), sandbox="hangs-on-first")
    _indices_once(results, quick.tasks, 1)
    assert [(r.record.status, r.record.reward) for r in results] == [("ok", 1.0)] * 3
    hung = [a for a in fleet.attempts if a.node == fleet.workers[0].info.node]
    assert hung and all(a.retried and a.boundary == "internal" and "no result" in (a.error or "") for a in hung)
