"""Shipping task folders to nodes that lack them (:mod:`clawgym_env.fleet.ship`).

What is checked: a bundle is the task's folders, byte for byte (exec bits kept), keyed by a content hash
(equal contents, equal key; changed contents, a new key); a node unpacks it once into its cache and the
task's paths are rewritten into it (nested folders too); a task over the shipping cap is refused with
an error naming the cap, and a full cache names its own; a rollout worker whose node does not see the
driver's folders runs the episode from the shipped copy (in process, then on a local Ray cluster), and
without a shipped copy records an ``infra_error`` at boundary ``task``, never a reward.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import sys
from pathlib import Path

import pytest

from clawgym_env.fleet import FleetConfig, ShipError, WorkerInfo
from clawgym_env.fleet import ship as ship_mod
from clawgym_env.fleet.ship import Shipper, TaskCache, pack
from clawgym_env.testing import EchoHarness, echo_suite


class _Store:
    """Stands in for the object store: ``put`` returns the object itself, ``fetch`` counts the gets."""

    def __init__(self):
        self.gets = 0

    def put(self, obj):
        return obj

    def fetch(self, ref):
        self.gets += 1
        return ref


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def suite(tmp_path):
    return echo_suite(tmp_path / "driver" / "suite")


def test_a_shipped_task_is_its_folders_unpacked_once(suite, tmp_path):
    task = suite.tasks[1]  # has input_files/ inside its task_dir
    store = _Store()
    shipped = Shipper(store, max_mb=1).ship(task)
    assert shipped is not None and shipped.digest and [f for f, _, _ in shipped.layout] == \
        ["task_dir", "input_dir", "reward_dir"]
    cache = TaskCache(tmp_path / "node-cache", max_mb=16)
    local = cache.materialise(task, shipped, store.fetch)
    entry = tmp_path / "node-cache" / shipped.digest
    assert local.task_dir == entry / "r0" and local.input_dir == entry / "r0" / "input_files"
    assert local.reward_dir == entry / "r0" / "reward"
    assert local.task_dir is not None and task.task_dir is not None and local.reward_dir is not None
    assert _files(local.task_dir) == _files(task.task_dir)
    assert os.access(local.reward_dir / "reward.sh", os.X_OK)
    assert local.expert_path == entry / "r0" / "expert.json"
    again = cache.materialise(task, shipped, store.fetch)
    assert again == local and store.gets == 1  # once per node
    cache.release(shipped)
    cache.release(shipped)


def test_the_key_is_the_content(suite, tmp_path):
    task = suite.tasks[0]
    first = pack(task, 2**20)
    copy = task.model_copy(update={"task_dir": tmp_path / "copy", "reward_dir": tmp_path / "copy" / "reward"})
    shutil.copytree(task.task_dir, tmp_path / "copy")
    assert pack(copy, 2**20).digest == first.digest  # another path, the same contents
    (tmp_path / "copy" / "expert.json").write_text('{"steps": []}')
    assert pack(copy, 2**20).digest != first.digest
    shipper = Shipper(_Store(), max_mb=1)
    one = shipper.ship(copy)
    assert shipper.ship(copy) == one  # reused while the files are unchanged
    (tmp_path / "copy" / "expert.json").write_text('{"steps": [{"final": "x"}]}')
    two = shipper.ship(copy)
    assert two is not None and one is not None and two.digest != one.digest


def test_links_inside_are_files_and_links_out_refuse_the_task(suite, tmp_path):
    task = suite.tasks[0]
    (task.task_dir / "same.json").symlink_to("expert.json")
    store = _Store()
    shipped = Shipper(store, max_mb=1).ship(task)
    assert shipped is not None
    local = TaskCache(tmp_path / "cache", 16).materialise(task, shipped, store.fetch)
    assert local.task_dir is not None
    copy = local.task_dir / "same.json"
    assert not copy.is_symlink() and copy.read_bytes() == (task.task_dir / "expert.json").read_bytes()
    (tmp_path / "secret").write_text("driver only")
    (task.reward_dir / "leak").symlink_to(tmp_path / "secret")
    refused = Shipper(store, max_mb=1).ship(task)
    assert refused is not None and refused.ref is None and "link out of its folder" in (refused.refused or "")


def test_caps_name_themselves(suite, tmp_path):
    task = suite.tasks[0]
    refused = Shipper(_Store(), max_mb=1e-6).ship(task)
    assert refused is not None and refused.ref is None
    assert "shipping cap" in (refused.refused or "") and "ship_max_mb" in (refused.refused or "")
    with pytest.raises(ShipError, match="ship_max_mb"):
        TaskCache(tmp_path / "c", 16).materialise(task, refused, lambda ref: ref)
    store = _Store()
    a, b = (Shipper(store, max_mb=1).ship(t) for t in suite.tasks[:2])
    assert a is not None and b is not None
    largest = max(pack(t, 2**20).size for t in suite.tasks[:2])
    cache = TaskCache(tmp_path / "small", max_mb=(largest + 10) / 2**20)  # room for one task at a time
    cache.materialise(suite.tasks[0], a, store.fetch)
    with pytest.raises(ShipError, match="ship_cache_max_mb"):  # a is in use: it cannot be evicted
        cache.materialise(suite.tasks[1], b, store.fetch)
    cache.release(a)
    cache.materialise(suite.tasks[1], b, store.fetch)  # a is evicted now
    assert sorted(p.name for p in (tmp_path / "small").iterdir()) == [b.digest]


def _hide(root: str, info: WorkerInfo) -> None:
    """In a worker: this node does not see the driver's folders under ``root``."""
    seen = ship_mod.on_node
    ship_mod.on_node = lambda path: not str(path).startswith(root) and seen(path)


@pytest.mark.slow
def test_a_worker_without_the_folders_runs_the_shipped_copy(suite, tmp_path):
    from clawgym_env.fleet.worker import RolloutWorker

    root = str(suite.root)
    cfg = FleetConfig(policy="scripted:expert", out_dir=str(tmp_path / "eps"), ship_cache_dir=str(tmp_path / "cache"),
                      worker_setup=functools.partial(_hide, root))
    seen = ship_mod.on_node
    store = _Store()
    try:
        worker = RolloutWorker(cfg, 0, "0" * 8, 2, 2.0, 1024)
        worker._fetch = store.fetch  # type: ignore[method-assign]  # no Ray here: the "ref" is the bundle
        try:
            task = suite.tasks[1]
            lost = worker.run(task, EchoHarness(), {})
            assert lost.record.status == "infra_error" and lost.record.failure_boundary == "task"
            assert "is not on node" in (lost.record.error or "") and lost.record.reward == 0.0
            shipped = Shipper(store, max_mb=1).ship(task)
            res = worker.run(task, EchoHarness(), {}, shipped)
        finally:
            worker.close()
    finally:
        ship_mod.on_node = seen
    assert res.record.status == "ok" and res.record.reward == 1.0, (res.record.status, res.record.error)
    assert shipped is not None and res.record.logs["fleet_task_shipped"] == shipped.digest
    assert (tmp_path / "cache" / shipped.digest / "r0" / "input_files" / "notes" / "readme.txt").exists()
    assert res.record.final_message and "ClawGym" in res.record.final_message


@pytest.mark.slow
def test_the_fleet_ships_a_suite_the_node_cannot_see(suite, tmp_path):
    ray = pytest.importorskip("ray", reason="the ray backend needs Ray: pip install 'clawgym[ray]'")
    from ray.cluster_utils import Cluster

    from clawgym_env.fleet import RayFleet

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        cfg = FleetConfig(policy="scripted:expert", out_dir=str(tmp_path / "eps"), max_episodes_per_node=2,
                          ship_cache_dir=str(tmp_path / "cache"),
                          worker_setup=functools.partial(_hide, str(suite.root)),
                          start_timeout_s=180.0, poll_s=0.2)
        with RayFleet(cfg) as fleet:
            results = fleet.run(suite.tasks, EchoHarness(), samples=2)
        with RayFleet(dataclasses.replace(cfg, ship_tasks=False)) as fleet:
            off = fleet.run(suite.tasks[:1], EchoHarness())
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert [r.record.reward for r in results] == [1.0] * 6, [(r.record.status, r.record.error) for r in results]
    digests = {r.record.logs.get("fleet_task_shipped", "") for r in results}
    assert "" not in digests and len(digests) == 3
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(digests)  # once per task on the node
    assert off[0].record.status == "infra_error" and off[0].record.failure_boundary == "task"
    assert "ship_tasks" in (off[0].record.error or "")
