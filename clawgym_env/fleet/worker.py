"""The rollout worker: one per node, owning that node's sandboxes, serving proxy and harness installs.

:class:`RolloutWorker` is a plain class; the scheduler makes it a Ray actor (threaded, at most the
node's cap of episodes at once plus room for health probes) pinned to one node. Inside, it holds one
started :class:`~clawgym_env.proxy.server.ProxyServer` around a policy built from the fleet's policy
spec, so a harness's HTTP traffic goes to a proxy in the same process on the same node and never
crosses the network; only the policy's own traffic (e.g. token ids to remote vLLM engines) does.

A task whose folders are not on this node runs from the copy shipped with its episode
(:mod:`~clawgym_env.fleet.ship`), unpacked once per node in the fleet's task cache. With
``FleetConfig.sandbox_pool`` the worker keeps its own warm Docker pool on its node (made on its first
episode, closed with the worker or ended with its process).

Invariants: :meth:`RolloutWorker.run` never raises for a failed episode: it returns exactly one
:class:`~clawgym_env.episodes.run.EpisodeResult` (a failure inside becomes an ``infra_error`` record with
its boundary); a task whose folders are neither on this node nor shipped (or too large to ship) is an
``infra_error`` with boundary ``task`` (never an empty workspace graded as the agent's); each harness
is installed at most once per worker process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from clawgym_env.capture.records import EpisodeRecord, FailureBoundary
from clawgym_env.episodes.run import EpisodeResult, run_episode
from clawgym_env.failures import exception_failure
from clawgym_env.fleet import ship
from clawgym_env.fleet.config import EpisodeOptions, FleetConfig, WorkerInfo
from clawgym_env.harness import HarnessAdapter
from clawgym_env.task import Task

if TYPE_CHECKING:
    from clawgym_env.sandbox.docker.pool import DockerPool, PoolStats

log = logging.getLogger(__name__)


def node_label(node_id: str) -> str:
    """``<host>:<first 6 hex of the node id>``: short and unique enough for progress lines."""
    return f"{socket.gethostname()}:{node_id[:6]}"


def infra_result(task: Task, harness: str, policy: str, boundary: FailureBoundary, error: str) -> EpisodeResult:
    """The one record of an episode that ended in an infrastructure failure before or around its run."""
    rec = EpisodeRecord(episode_id=uuid.uuid4().hex[:16], task_id=task.id, suite=task.suite, harness=harness,
                        policy=policy, status="infra_error", failure_boundary=boundary, error=error)
    return EpisodeResult(rec, [])


class RolloutWorker:
    """Runs episodes on its node against its own serving proxy (see the module doc)."""

    def __init__(self, config: FleetConfig, index: int, node_id: str, capacity: int, cpus: float = 0.0,
                 memory_mb: int = 0) -> None:
        from clawgym_env.policy import make_policy
        from clawgym_env.policy.tokenizer import cache_dir
        from clawgym_env.proxy.server import ProxyServer

        os.environ.update(config.env)
        self.info = WorkerInfo(index=index, node_id=node_id, node=node_label(node_id), pid=os.getpid(),
                               capacity=capacity, cpus=cpus, memory_mb=memory_mb)
        self.tasks = ship.TaskCache(config.ship_cache_dir or cache_dir() / "fleet-tasks", config.ship_cache_max_mb)
        """Shipped task folders on this node (see :mod:`~clawgym_env.fleet.ship`)."""
        if config.worker_setup is not None:
            config.worker_setup(self.info)
        self.config = config
        self.policy = make_policy(config.policy)
        self._policy_open = True  # closed once, by close()
        self.policy.tokenizer  # noqa: B018 - load it now, not first inside concurrent episodes
        self.proxy = (ProxyServer(self.policy, max_context_tokens=config.max_context_tokens)
                      if config.max_context_tokens else ProxyServer(self.policy))
        self.proxy.start()  # a ready worker is a serving one
        self._installed: dict[str, BaseException | None] = {}
        self._install_lock = threading.Lock()
        self.bundles = ship.BundleRefs()
        """References of the shipped bundles this worker was sent (each comes once per worker)."""
        self._pool: DockerPool | None = None
        self._pool_lock = threading.Lock()

    def whoami(self) -> WorkerInfo:
        """The worker's identity (also the scheduler's health probe)."""
        return self.info

    def _install(self, adapter: HarnessAdapter) -> BaseException | None:
        with self._install_lock:
            if adapter.name not in self._installed:
                try:
                    adapter.install()
                    self._installed[adapter.name] = None
                except Exception as exc:  # noqa: BLE001 - reported per episode, as the harness's infra failure
                    log.error("worker %s: installing harness %s failed", self.info.node, adapter.name, exc_info=exc)
                    self._installed[adapter.name] = exc
            return self._installed[adapter.name]

    def run(self, task: Task, adapter: HarnessAdapter, kwargs: EpisodeOptions,
            shipped: ship.ShippedTask | None = None) -> EpisodeResult:
        """One episode of ``task`` through ``adapter`` on this node (``kwargs`` go to ``run_episode``); a task
        whose folders this node lacks runs from ``shipped``, its copy in the object store (the bundle's reference
        comes with the first episode of that copy sent to this worker, later ones carry only its hash). The
        record's ``timings.fleet_worker_s`` is the time this call took on the worker (the episode and its
        bookkeeping: what ``timings.fleet_s`` minus it leaves is Ray's transport and the scheduler)."""
        t0 = time.monotonic()
        if shipped is not None:
            self.bundles.remember(shipped)
        result = self._run(task, adapter, kwargs, shipped)
        result.record.timings["fleet_worker_s"] = time.monotonic() - t0
        return result

    def _run(self, task: Task, adapter: HarnessAdapter, kwargs: EpisodeOptions,
             shipped: ship.ShippedTask | None) -> EpisodeResult:
        policy_name = getattr(self.policy, "name", "policy")
        in_cache: ship.ShippedTask | None = None
        try:
            missing = ship.missing_folders(task)
            if missing and shipped is not None and shipped.layout:
                try:
                    copy = shipped  # the closure's own name (narrowed)
                    task = self.tasks.materialise(task, copy, lambda _: self._fetch(self.bundles.ref(copy)))
                    in_cache = shipped
                except ship.BundleMissing as exc:  # not this node's fault: retried, the bundle sent again
                    result = infra_result(task, adapter.name, policy_name, "internal", str(exc))
                    result.record.logs[ship.NEED_BUNDLE] = str(shipped.digest)
                    return result
                except ship.ShipError as exc:
                    return infra_result(task, adapter.name, policy_name, "task",
                                        f"task {task.full_id} is not on node {self.info.node} and its shipped "
                                        f"copy cannot be used: {exc}")
                missing = ship.missing_folders(task)
            if missing:
                return infra_result(task, adapter.name, policy_name, "task",
                                    f"task {task.full_id}: {', '.join(missing)} is not on node {self.info.node}; "
                                    "put the suite on a filesystem every node sees at the same path, or ship it "
                                    "(FleetConfig.ship_tasks)")
            failure = self._install(adapter) if self.config.install_harnesses else None
            if failure is not None:
                return infra_result(task, adapter.name, policy_name, "harness",
                                    f"harness {adapter.name} could not be installed on node {self.info.node}: "
                                    f"{type(failure).__name__}: {failure}")
            options = EpisodeOptions(sandbox=self._sandbox(), out_dir=self.config.out_dir, judge=self.config.judge)
            options.update(kwargs)
            result = run_episode(task, adapter, self.proxy, **options)
            if in_cache is not None:
                result.record.logs["fleet_task_shipped"] = str(in_cache.digest)
            return result
        except Exception as exc:  # noqa: BLE001 - one failed rollout never sinks the batch
            log.error("worker %s: episode of %s raised", self.info.node, task.id, exc_info=exc)
            verdict = exception_failure(exc)
            return infra_result(task, adapter.name, policy_name, verdict.boundary or "internal", verdict.error or "")
        finally:
            if in_cache is not None:
                self.tasks.release(in_cache)

    def _sandbox(self) -> str:
        """The sandbox backend of this worker's episodes: its warm Docker pool's name with ``sandbox_pool``."""
        if not self.config.sandbox_pool:
            return self.config.sandbox
        with self._pool_lock:
            if self._pool is None:
                from clawgym_env.sandbox.docker.pool import DockerPool

                self._pool = DockerPool(self.config.sandbox_pool)
            return self._pool.name

    @staticmethod
    def _fetch(ref: Any) -> ship.TaskBundle:
        import ray

        bundle = ray.get(ref)
        if not isinstance(bundle, ship.TaskBundle):
            raise ship.ShipError(f"the shipped task is a {type(bundle).__name__}, not a TaskBundle")
        return bundle

    def pool_stats(self) -> PoolStats | None:
        """What this worker's warm Docker pool did so far (``None``: it has none yet)."""
        with self._pool_lock:
            return dataclasses.replace(self._pool.stats) if self._pool is not None else None

    def close(self) -> None:
        """Stop the worker's serving proxy, its warm sandbox pool and the policy it built (idempotent)."""
        self.proxy.stop()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        with self._pool_lock:
            built, self._policy_open = self._policy_open, False
        if not built:
            return
        try:
            self.policy.close()  # e.g. a passthrough's HTTP clients; built here from the config's spec
        except Exception as exc:  # noqa: BLE001 - a policy that fails to close must not fail the worker's close
            log.warning("rollout worker: closing policy %r failed: %s", self.policy.name, exc)
