"""Per-harness resource needs and mixed-harness batches on the Ray fleet.

What is checked: a node runs episodes only while the sum of their declared needs (``adapter.resources``:
CPUs and memory) fits its budget and their count its cap, harnesses mixed; a large episode is not
starved by small ones; an episode that fits no node is refused up front with an error naming the
harness, its needs and the largest node; the fleet's counts become flat metrics and a tqdm postfix.
On a 2-node local Ray cluster with small fake budgets (1 GiB and 3 GiB of Ray ``memory``): a mixed batch
keeps every node within its budget (from the scheduler's books at every progress snapshot and from the
records' start/end times), large episodes run only on the large node, and a trainer's step through two
harnesses (:class:`trainers.rollouts.sync.RolloutFleet`) runs them in one batch, their episodes overlapping
in time.
"""

from __future__ import annotations

import collections
import sys
from unittest import mock

import pytest

from clawgym_env.fleet import FleetConfig, FleetError, FleetProgress, FleetStats, WorkerInfo, fleet_metrics
from clawgym_env.fleet.config import EpisodeJob
from clawgym_env.fleet.placement import WorkerSlots, pick, too_large, unplaceable
from clawgym_env.fleet.stats import bar_postfix
from clawgym_env.harness import EpisodeResources
from clawgym_env.task import Task
from clawgym_env.testing import EchoHarness, echo_suite

SMALL = EpisodeResources(cpus=0.5, memory_mb=384)
BIG = EpisodeResources(cpus=1.0, memory_mb=2048)
HUGE = EpisodeResources(cpus=0.5, memory_mb=4096)


class SmallEcho(EchoHarness):
    name = "echo-small"
    resources = SMALL


class BigEcho(EchoHarness):
    name = "echo-big"
    resources = BIG


class HugeEcho(EchoHarness):
    name = "echo-huge"
    resources = HUGE


# -- without Ray --------------------------------------------------------------------------------

def _worker(index: int, cpus: float, memory_mb: int, cap: int = 8) -> WorkerSlots:
    return WorkerSlots(WorkerInfo(index=index, node_id=f"n{index}", node=f"node{index}", capacity=cap, cpus=cpus,
                                  memory_mb=memory_mb), handle=None)


def _queue(*needs: EpisodeResources):
    task = Task(id="t", instruction="x")
    return collections.deque((EpisodeJob(index=i, task=task, sample=0, harness=f"h{i}", needs=n), 1, frozenset())
                             for i, n in enumerate(needs))


def _drain(queue, workers):
    """Dispatch until nothing fits: [(job index, worker index)]."""
    placed = []
    while (chosen := pick(queue, workers)) is not None:
        worker, pos = chosen
        job = queue[pos][0]
        del queue[pos]
        worker.take(job.needs)
        placed.append((job.index, worker.info.index))
    return placed


def test_needs_are_the_adapters_unless_overridden():
    cfg = FleetConfig(policy="scripted:expert")
    assert cfg.needs(BigEcho()) == BIG and cfg.needs(None) == EpisodeResources()
    assert FleetConfig(policy="x", episode_memory_mb=100).needs(BigEcho()) == EpisodeResources(1.0, 100)
    assert cfg.node_budget({"CPU": 4.0, "memory": 3 * 2**30}) == (4.0, 3072)
    assert FleetConfig(policy="x", node_cpus=1.5, node_memory_mb=512).node_budget({"CPU": 4.0, "memory": 2**32}) == \
        (1.5, 512)
    assert cfg.node_capacity(8, 2**30, BIG) == 0 and cfg.node_capacity(8, 2**30, SMALL) == 2


def test_mixed_needs_fill_each_node_within_its_budget():
    small_node, big_node = _worker(0, 2.0, 1024), _worker(1, 2.0, 3072)
    workers = [small_node, big_node]
    placed = _drain(_queue(BIG, SMALL, SMALL, SMALL, SMALL, SMALL, BIG), workers)
    assert (0, 1) in placed and 6 not in dict(placed)           # the second big one waits for the big node
    for w in workers:
        assert w.cpus <= w.info.cpus and w.memory_mb <= w.info.memory_mb
    assert small_node.running == 2  # memory binds: 2 x 384 MiB of 1024, though the CPUs would take 4
    assert big_node.memory_mb == 2048 + 384 * 2 and big_node.cpus == 2.0


def test_a_large_episode_is_not_starved_by_small_ones():
    node = _worker(0, 2.0, 1024, cap=4)
    queue = _queue(SMALL, EpisodeResources(cpus=2.0, memory_mb=256), SMALL, SMALL)
    assert _drain(queue, [node]) == [(0, 0)]  # the 2-CPU job waits for the node; the small ones behind wait too
    node.give_back(SMALL)
    assert _drain(queue, [node]) == [(1, 0)]


def test_the_per_node_cap_holds_whatever_the_needs():
    node = _worker(0, 64.0, 2**20, cap=3)
    assert len(_drain(_queue(*[SMALL] * 5), [node])) == 3


def test_an_episode_larger_than_every_node_is_named():
    workers = [_worker(0, 2.0, 1024), _worker(1, 2.0, 3072)]
    assert too_large("echo-small", SMALL, workers) is None
    why = too_large("echo-huge", HUGE, workers)
    assert why is not None
    assert "harness echo-huge needs 0.5 CPU(s) and 4096 MiB" in why and "node1" in why and "3072 MiB" in why
    workers[1].state = "dead"  # the large node is lost: its queued big episodes cannot wait forever
    assert unplaceable(_queue(SMALL, BIG), workers) == [1]


def test_counts_become_flat_metrics_and_a_postfix():
    stats = FleetStats(3, ["n1", "n2"])
    stats.dispatched("n1", "mini")
    stats.dispatched("n2", "codex")
    stats.ended("n1", "mini", final=False, infra=True)
    m = fleet_metrics(stats.snapshot())
    assert m["fleet/running"] == 1 and m["fleet/queue_depth"] == 2 and m["fleet/infra_failed"] == 1
    assert m["fleet/node/n1/infra_failed"] == 1 and m["fleet/harness/codex/running"] == 1
    assert isinstance(m["fleet/calls_per_s"], float)
    assert fleet_metrics(None) == {}

    class Holder:  # a trainer's rollout fleet holds its RayFleet as .fleet
        fleet = type("F", (), {"stats": stats})()

    assert fleet_metrics(Holder())["fleet/harness/mini/retried"] == 1

    class Bar:
        def __init__(self):
            self.postfix: list[tuple[str, bool]] = []

        def set_postfix_str(self, s, refresh=True):
            self.postfix.append((s, refresh))

    bar = Bar()
    with mock.patch("clawgym_env.fleet.stats.time.monotonic", return_value=5.0):  # a machine up for 5 s
        show = bar_postfix(bar, every_s=3600)
        show(stats.snapshot())
        show(stats.snapshot())
    assert [r for _, r in bar.postfix] == [True, False]  # redrawn at most every every_s, whatever the uptime
    assert "q=2 run=1 infra=1" in bar.postfix[0][0] and "calls/s" in bar.postfix[0][0]
    assert "codex=1/0" in bar.postfix[0][0] and "mini=0/0!1" in bar.postfix[0][0]  # per harness when mixed


# -- on a 2-node local Ray cluster with small fake budgets ----------------------------------------

@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="the ray backend needs Ray: pip install 'clawgym[ray]'")
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test harnesses travel by value
    cl = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "memory": 2**30})
    cl.add_node(num_cpus=2, memory=3 * 2**30)
    ray.init(address=cl.address, log_to_driver=False)
    try:
        yield cl
    finally:
        ray.shutdown()
        cl.shutdown()


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return echo_suite(tmp_path_factory.mktemp("echo-suite"))


def _span(r):
    """When the episode's harness ran (epoch seconds), from its record."""
    start = r.record.resources["harness_started_at"]
    return start, start + r.record.timings["harness_s"]


def _peak(results, node, field):
    """The largest sum of ``field`` needs of episodes whose recorded run overlapped on ``node``."""
    needs = {"echo-small": SMALL, "echo-big": BIG}
    events = []
    for r in results:
        if r.record.logs.get("fleet_node") == node:
            amount = getattr(needs[r.record.harness], field)
            start, end = _span(r)
            events += [(start, 1, amount), (end, 0, -amount)]
    level = peak = 0.0
    for _, _, delta in sorted(events):  # an end sorts before a start at the same instant
        level += delta
        peak = max(peak, level)
    return peak


@pytest.mark.slow
def test_a_mixed_batch_keeps_every_node_within_its_budget(cluster, suite, tmp_path):
    from clawgym_env.fleet import RayFleet

    cfg = FleetConfig(policy="scripted:expert", out_dir=str(tmp_path / "eps"), max_episodes_per_node=4,
                      start_timeout_s=180.0, poll_s=0.2)
    seen: list[FleetProgress] = []
    over: list[str] = []
    with RayFleet(cfg) as fleet:
        by_memory = sorted(fleet.workers, key=lambda w: w.info.memory_mb)
        assert [(w.info.cpus, w.info.memory_mb) for w in by_memory] == [(2.0, 1024), (2.0, 3072)]
        small_node, big_node = (w.info.node for w in by_memory)

        def check(p: FleetProgress) -> None:
            seen.append(p)
            over.extend(f"{w.info.node}: {w.running} eps, {w.cpus} CPUs, {w.memory_mb} MiB" for w in fleet.workers
                        if w.running > w.info.capacity or w.cpus > w.info.cpus + 1e-9
                        or w.memory_mb > w.info.memory_mb)

        fleet.progress = check
        with pytest.raises(FleetError, match=r"harness echo-huge needs 0.5 CPU\(s\) and 4096 MiB.*3072 MiB"):
            fleet.run(suite.tasks, HugeEcho())
        small, big = SmallEcho(), BigEcho()
        jobs = [(t, s, small) for t in suite.tasks for s in range(2)] + [(t, 0, big) for t in suite.tasks]
        results = fleet.run_mixed(jobs)
    assert [(r.record.task_id, r.record.harness) for r in results] == [(t.id, a.name) for t, _, a in jobs]
    assert all(r.record.status == "ok" and r.record.reward == 1.0 for r in results), \
        [(r.record.status, r.record.error) for r in results]
    assert not over, over
    assert {r.record.logs["fleet_node"] for r in results if r.record.harness == "echo-big"} == {big_node}
    assert _peak(results, small_node, "memory_mb") <= 1024 and _peak(results, big_node, "memory_mb") <= 3072
    assert _peak(results, big_node, "cpus") <= 2.0 and _peak(results, small_node, "cpus") <= 2.0
    last = seen[-1]
    assert last.done == len(jobs) and last.harnesses["echo-big"].done == 3 and last.harnesses["echo-small"].done == 6


@pytest.mark.slow
def test_a_training_step_runs_its_harnesses_in_one_overlapping_batch(cluster, suite, tmp_path):
    from clawgym_env.policy import make_policy
    from trainers.rollouts.sync import RolloutConfig, RolloutFleet, fleet_metrics, run_jobs

    adapters = {"echo-small": SmallEcho(), "echo-big": BigEcho()}
    jobs = [(suite.tasks[0], "echo-small"), (suite.tasks[1], "echo-big"), (suite.tasks[1], "echo-small")]
    policy = make_policy("scripted:expert")
    with RolloutFleet(RolloutConfig(backend="ray", max_episodes_per_node=4), policy,
                      out_dir=tmp_path / "eps") as rf:
        results = run_jobs(None, jobs, group_size=2, adapters=adapters, fleet=rf)
        metrics = fleet_metrics(rf)
    assert [r.record.harness for r in results] == ["echo-small"] * 2 + ["echo-big"] * 2 + ["echo-small"] * 2
    assert all(r.record.status == "ok" for r in results), [(r.record.status, r.record.error) for r in results]
    spans = {h: [_span(r) for r in results if r.record.harness == h] for h in adapters}
    assert any(max(a0, b0) < min(a1, b1) for a0, a1 in spans["echo-small"] for b0, b1 in spans["echo-big"]), \
        f"the harnesses' episodes did not overlap: {spans}"
    assert metrics["fleet/done"] == 6 and metrics["fleet/harness/echo-big/done"] == 2
    assert metrics["fleet/running"] == 0 and metrics["fleet/queue_depth"] == 0
