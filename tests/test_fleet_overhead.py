"""What each fleet episode carries through Ray: a shipped bundle's reference once per worker, small adapters by value.

What is checked (no Ray needed): the scheduler hands a bundle's object reference to each worker with its
first episode of that bundle only, later ones carry the hash alone, and a restarted worker is sent it
again; a worker keeps the references it was sent and uses them for later episodes; a worker that lacks
a reference (it restarted) ends the attempt as a retriable infrastructure failure asking for it, never as
a task failure; an adapter travels by value unless its pickle is large; every fleet record says how long
the call took on the worker (``timings.fleet_worker_s``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import pickle
import threading
from typing import Any

import pytest

from clawgym_env.fleet import FleetConfig, RayFleet, WorkerInfo
from clawgym_env.fleet import ship as ship_mod
from clawgym_env.fleet.calls import INLINE_MAX_BYTES, by_value_or_ref
from clawgym_env.fleet.config import EpisodeJob
from clawgym_env.fleet.placement import WorkerSlots
from clawgym_env.fleet.ship import BundleRefs, ShippedTask, Shipper, for_worker
from clawgym_env.fleet.stats import FleetStats
from clawgym_env.testing import EchoHarness, echo_suite


class _Store:
    """Stands in for the object store: ``put`` returns the object itself, ``fetch`` counts the gets."""

    def __init__(self) -> None:
        self.gets = 0

    def put(self, obj: Any) -> Any:
        return obj

    def fetch(self, ref: Any) -> Any:
        self.gets += 1
        return ref


def test_a_bundle_reference_goes_once_to_each_worker():
    shipped = ShippedTask("d1", ("/x",), ref=object(), layout=(("task_dir", 0, "."),))
    sent: set[str] = set()
    first, second = for_worker(shipped, sent), for_worker(shipped, sent)
    assert first is shipped and second is not None and second.ref is None and second.digest == "d1"
    assert for_worker(shipped, set()) is shipped  # another worker gets it too
    refused = ShippedTask(None, ("/x",), refused="too large")
    assert for_worker(refused, sent) is refused and for_worker(None, sent) is None


def test_a_worker_finds_a_reference_sent_with_another_episode():
    refs = BundleRefs(wait_s=5.0)
    bare = ShippedTask("d1", ("/x",))
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(refs.ref(bare)))
    waiter.start()  # the episode without the reference starts first (a threaded actor may run them out of order)
    refs.remember(dataclasses.replace(bare, ref="the-ref"))
    waiter.join(5.0)
    assert got == ["the-ref"] and refs.ref(bare) == "the-ref"
    with pytest.raises(ship_mod.BundleMissing, match="retried"):
        BundleRefs(wait_s=0.05).ref(ShippedTask("d2", ("/x",)))


class _Handle:
    """A worker actor's handle that records each ``run`` call's shipped argument."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.run = self
        self.whoami = self  # the health probe of a suspect worker

    def remote(self, *args: Any) -> object:
        if args:
            self.calls.append((args[1], args[3]))
        return object()


def _fleet(workers: int) -> RayFleet:
    fleet = RayFleet(FleetConfig(policy="scripted:expert", max_episodes_per_node=8))
    fleet.workers = [WorkerSlots(WorkerInfo(index=i, node_id=f"{i}" * 8, node=f"n{i}", capacity=8, cpus=8.0,
                                            memory_mb=8192), _Handle()) for i in range(workers)]
    fleet.stats = FleetStats(0, [w.info.node for w in fleet.workers])
    return fleet


def test_the_scheduler_sends_each_bundle_reference_once_per_worker(tmp_path):
    suite = echo_suite(tmp_path / "suite")
    store = _Store()
    shipper = Shipper(store, max_mb=1)
    shipped = {id(t): shipper.ship(t) for t in suite.tasks}
    fleet = _fleet(2)
    jobs = [EpisodeJob(index=i, task=suite.tasks[i % 3], sample=i // 3) for i in range(12)]
    queue = collections.deque((j, 1, frozenset()) for j in jobs)
    fleet._dispatch(queue, {}, ["adapter"], shipped, {})
    assert not queue
    for w in fleet.workers:
        handle = w.handle
        with_ref = collections.Counter(s.digest for _, s in handle.calls if s.ref is not None)
        assert handle.calls and all(a == "adapter" for a, _ in handle.calls)
        assert set(with_ref.values()) == {1}, "one reference per bundle per worker"
        assert set(with_ref) == {s.digest for _, s in handle.calls}, "the first episode of a bundle carries it"
        assert w.bundles_sent == set(with_ref)
    fleet._suspect(fleet.workers[0])  # its process died: a restarted one holds no reference
    assert fleet.workers[0].bundles_sent == set()


def _hide(root: str, info: WorkerInfo) -> None:
    """In a worker: this node does not see the driver's folders under ``root``."""
    seen = ship_mod.on_node
    ship_mod.on_node = lambda path: not str(path).startswith(root) and seen(path)


@pytest.mark.slow
def test_a_worker_missing_a_reference_asks_for_it_and_keeps_the_ones_it_got(tmp_path):
    from clawgym_env.fleet.worker import RolloutWorker

    suite = echo_suite(tmp_path / "driver" / "suite")
    cfg = FleetConfig(policy="scripted:expert", out_dir=str(tmp_path / "eps"), ship_cache_dir=str(tmp_path / "cache"),
                      worker_setup=functools.partial(_hide, str(suite.root)))
    seen = ship_mod.on_node
    store = _Store()
    task = suite.tasks[0]
    shipped = Shipper(store, max_mb=1).ship(task)
    assert shipped is not None and shipped.digest is not None
    bare = dataclasses.replace(shipped, ref=None)
    try:
        worker = RolloutWorker(cfg, 0, "0" * 8, 2, 2.0, 1024)
        worker._fetch = store.fetch  # type: ignore[method-assign]  # no Ray here: the "ref" is the bundle
        worker.bundles.wait_s = 0.05
        try:
            lost = worker.run(task, EchoHarness(), {}, bare)  # never sent the reference (a restarted worker)
            first = worker.run(task, EchoHarness(), {}, shipped)
            for entry in (tmp_path / "cache").iterdir():  # evicted: the next episode needs the bundle again
                ship_mod.shutil.rmtree(entry)
            later = worker.run(task, EchoHarness(), {}, bare)
        finally:
            worker.close()
    finally:
        ship_mod.on_node = seen
    assert lost.record.status == "infra_error" and lost.record.failure_boundary == "internal"
    assert lost.record.failure_boundary in cfg.retry_boundaries and lost.record.reward == 0.0
    assert lost.record.logs[ship_mod.NEED_BUNDLE] == shipped.digest
    for res in (first, later):
        assert res.record.status == "ok" and res.record.reward == 1.0, (res.record.status, res.record.error)
        assert res.record.logs["fleet_task_shipped"] == shipped.digest
        assert res.record.timings["fleet_worker_s"] >= res.record.wall_s > 0
    assert store.gets == 2  # unpacked twice: once, then again after the eviction, from the kept reference


def test_small_adapters_travel_by_value_large_ones_by_reference():
    class _Ray:
        cloudpickle = pickle

        def __init__(self) -> None:
            self.put_count = 0

        def put(self, obj: Any) -> str:
            self.put_count += 1
            return "ref"

    ray = _Ray()
    small = EchoHarness()
    assert by_value_or_ref(ray, small) is small and ray.put_count == 0
    big = EchoHarness()
    big.blob = b"x" * (INLINE_MAX_BYTES + 1)  # type: ignore[attr-defined]
    assert by_value_or_ref(ray, big) == "ref" and ray.put_count == 1
