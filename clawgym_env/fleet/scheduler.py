"""The fleet: rollout workers on Ray, a queue with backpressure, and retries that lose nothing.

:class:`RayFleet` starts one :class:`~clawgym_env.fleet.worker.RolloutWorker` actor per Ray node
(pinned to it, reserving the node's CPUs and memory for episodes in Ray: all of them, or
``node_cpus`` / ``node_memory_mb``) and feeds it episodes from one queue: a node runs episodes only
while the sum of their harnesses' declared needs fits its budget and their count its cap
(:mod:`~clawgym_env.fleet.placement`), so the queue, not Ray, holds the backlog. One batch may mix
harnesses (:meth:`RayFleet.run_mixed`): their episodes share the nodes and overlap in time. A task's
folders travel with its episodes (:mod:`~clawgym_env.fleet.ship`) to nodes that lack them.

Faults, each an attempt recorded as an infrastructure failure (:class:`AttemptRecord`) and retried
on another node while ``max_attempts`` allows:

  * a worker process that dies (killed, out of memory, its node lost): its in-flight episodes end
    with boundary ``internal``; Ray restarts the worker (``max_worker_restarts``) and a health probe
    decides when it takes episodes again, or gives it up;
  * an episode whose attempt ended in a retriable ``infra_error`` (a sandbox that cannot start, a
    harness with no model answer, a policy or proxy failure, :data:`RETRIABLE_BOUNDARIES`);
  * an episode with no result by its deadline (a hung harness or sandbox): abandoned (its slot stays
    taken until the worker returns), its late result ignored.

Invariants: every requested episode ends exactly once (one result per job index, in the caller's
order; a late or duplicate result of an abandoned attempt is dropped); a result is an attempt's own
record or, when the worker could not give one, an ``infra_error`` record naming the boundary, never
a reward of 0 counted as the agent's; the engine's layer rule holds (Ray is imported lazily and only
here, in :mod:`~clawgym_env.fleet.calls` and in :mod:`~clawgym_env.fleet.worker`'s actor).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clawgym_env.episodes.run import EpisodeResult
from clawgym_env.fleet import ship
from clawgym_env.fleet.calls import FleetError, by_value_or_ref, cancel, import_ray
from clawgym_env.fleet.config import (
    Attempt,
    AttemptRecord,
    EpisodeJob,
    EpisodeOptions,
    FleetConfig,
    WorkerInfo,
    episode_options,
)
from clawgym_env.fleet.placement import Queued, WorkerSlots, pick, too_large, unplaceable
from clawgym_env.fleet.ship import ShippedTask, Shipper
from clawgym_env.fleet.stats import FleetProgress, FleetStats
from clawgym_env.fleet.worker import RolloutWorker, infra_result, node_label
from clawgym_env.grading.judge import Judge
from clawgym_env.harness import HarnessAdapter
from clawgym_env.policy.base import SamplingOverrides
from clawgym_env.task import Task

__all__ = ["PROBE_EVERY_S", "FleetError", "RayFleet", "import_ray"]

log = logging.getLogger(__name__)
PROBE_EVERY_S = 1.0
"""Seconds between health probes of a worker whose process died (Ray restarts it meanwhile)."""


class RayFleet:
    """Rollout workers on a Ray cluster (see the module doc). Use as a context manager or call
    :meth:`close`; workers stay up between :meth:`run` calls."""

    def __init__(self, config: FleetConfig, *, progress: Callable[[FleetProgress], None] | None = None) -> None:
        self.config = config
        self.progress = progress
        """Called with a snapshot after every dispatch and every ended attempt (from the caller's thread)."""
        self.workers: list[WorkerSlots] = []
        self.attempts: list[AttemptRecord] = []
        """Infrastructure failures of the last batch (retried or final)."""
        self.stats: FleetStats | None = None
        self._ray: Any = None
        self._started_ray = False
        self._abandoned: dict[Any, Attempt] = {}
        """Refs of abandoned attempts: their slots (and declared needs) stay taken until the worker answers."""
        self._shipper: Shipper | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> RayFleet:
        """Connect to Ray (``config.address``), start one worker per node with room and wait until
        each serves (idempotent). A node whose worker cannot start is left out, logged."""
        if self.workers:
            return self
        ray = self._ray = import_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not ray.is_initialized():
            ray.init(address=self.config.address, ignore_reinit_error=True)
            self._started_ray = True
        actor_cls = ray.remote(RolloutWorker)
        pending: list[tuple[WorkerInfo, Any]] = []
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            res = node.get("Resources", {})
            cpus, memory_mb = self.config.node_budget(res)
            if cpus <= 0 or memory_mb <= 0:  # e.g. a head node started with --num-cpus=0
                log.info("fleet: node %s offers no CPUs or memory to episodes (resources %s)", node["NodeID"][:6],
                         res)
                continue
            index, cap = len(pending), self.config.max_episodes_per_node
            handle = actor_cls.options(
                num_cpus=cpus, memory=memory_mb * 2**20, max_concurrency=cap + 2,
                max_restarts=self.config.max_worker_restarts, max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            ).remote(self.config, index, node["NodeID"], cap, cpus, memory_mb)
            pending.append((WorkerInfo(index=index, node_id=node["NodeID"], node=node_label(node["NodeID"]),
                                       capacity=cap, cpus=cpus, memory_mb=memory_mb), handle))
        if not pending:
            raise FleetError("no Ray node offers CPUs and memory to episodes; add nodes (`ray start "
                             "--address=HEAD:6379`) or raise FleetConfig.node_cpus / node_memory_mb")
        probes = [h.whoami.remote() for _, h in pending]
        for (info, handle), probe in zip(pending, probes):
            try:
                self.workers.append(WorkerSlots(ray.get(probe, timeout=self.config.start_timeout_s), handle))
            except Exception as exc:  # noqa: BLE001 - a node whose worker cannot start is left out
                log.error("fleet: the worker on node %s did not start: %s", info.node, exc)
                ray.kill(handle, no_restart=True)
        if not self.workers:
            raise FleetError("no rollout worker started (see the log for each node's error); check that the "
                             f"policy {self.config.policy!r} and the sandbox {self.config.sandbox!r} work on the nodes")
        log.info("fleet: %d worker(s): %s", len(self.workers),
                 ", ".join(f"{w.info.node} x{w.info.capacity}" for w in self.workers))
        return self

    def close(self) -> None:
        """Stop the workers (and the local Ray this fleet started, if it started one)."""
        ray = self._ray
        if self.config.sandbox_pool and self.workers:  # destroy the warm containers now, not at the processes' end
            closing = [w.handle.close.remote() for w in self.workers if w.state == "live"]
            try:
                if closing:
                    ray.wait(closing, num_returns=len(closing), timeout=30.0)
            except Exception as exc:  # noqa: BLE001 - their lifelines end them with the processes anyway
                log.warning("fleet: closing the workers' sandbox pools: %s", exc)
        for w in self.workers:
            try:
                ray.kill(w.handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.workers = []
        if self._shipper is not None:
            self._shipper.clear()
        if self._started_ray and ray is not None and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False

    def __enter__(self) -> RayFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def capacity(self) -> int:
        """Episodes the live workers run at once."""
        return sum(w.info.capacity for w in self.workers if w.state != "dead")

    def wait_ready(self, timeout_s: float | None = None) -> int:
        """Wait until no worker is being probed after a fault (restarted or given up), at most
        ``timeout_s`` (default ``start_timeout_s``); returns the number of live workers."""
        self.start()
        end = time.monotonic() + (self.config.start_timeout_s if timeout_s is None else timeout_s)
        while any(w.state == "probing" for w in self.workers) and time.monotonic() < end:
            probes = self._probes()
            timeout = max(0.0, min(self.config.poll_s, end - time.monotonic()))
            for ref in self._wait(probes, timeout):
                self._probed(ref)
            self._check_probes(time.monotonic())
        return sum(w.state == "live" for w in self.workers)

    # -- a batch ----------------------------------------------------------------------------------
    def run(self, tasks: Sequence[Task] | Iterable[Task], adapter: HarnessAdapter, *, samples: int = 1,
            on_result: Callable[[int, EpisodeResult], None] | None = None,
            sampling: SamplingOverrides | Mapping[str, object] | None = None,
            policy_version: int | None = None, keep_workspace: bool = False, grade: bool = True,
            trace_network: bool = False, sandbox: str | None = None, out_dir: str | Path | None = None,
            judge: Judge | None = None) -> list[EpisodeResult]:
        """Run ``samples`` episodes of each task across the fleet; results come back in task order,
        exactly one per requested episode (the episode keywords are :meth:`run_mixed`'s)."""
        return self.run_pairs([(t, s) for t in tasks for s in range(samples)], adapter, on_result=on_result,
                              sampling=sampling, policy_version=policy_version, keep_workspace=keep_workspace,
                              grade=grade, trace_network=trace_network, sandbox=sandbox, out_dir=out_dir, judge=judge)

    def run_pairs(self, pairs: Sequence[tuple[Task, int]], adapter: HarnessAdapter, *,
                  on_result: Callable[[int, EpisodeResult], None] | None = None,
                  sampling: SamplingOverrides | Mapping[str, object] | None = None,
                  policy_version: int | None = None, keep_workspace: bool = False, grade: bool = True,
                  trace_network: bool = False, sandbox: str | None = None, out_dir: str | Path | None = None,
                  judge: Judge | None = None) -> list[EpisodeResult]:
        """Run one episode per ``(task, sample)`` pair through ``adapter``; results in pair order, exactly
        one each (see :meth:`run_mixed`)."""
        return self.run_mixed([(t, s, adapter) for t, s in pairs], on_result=on_result,
                              sampling=sampling, policy_version=policy_version, keep_workspace=keep_workspace,
                              grade=grade, trace_network=trace_network, sandbox=sandbox, out_dir=out_dir, judge=judge)

    def run_mixed(self, jobs: Sequence[tuple[Task, int, HarnessAdapter]], *,
                  on_result: Callable[[int, EpisodeResult], None] | None = None,
                  sampling: SamplingOverrides | Mapping[str, object] | None = None,
                  policy_version: int | None = None, keep_workspace: bool = False, grade: bool = True,
                  trace_network: bool = False, sandbox: str | None = None, out_dir: str | Path | None = None,
                  judge: Judge | None = None) -> list[EpisodeResult]:
        """Run one episode per ``(task, sample, adapter)``, harnesses mixed in one queue (their episodes
        overlap on the nodes); results in job order, exactly one each.

        ``on_result(index, result)`` is called on the calling thread as each job's final result arrives
        (after its retries), e.g. to append it to a resumable results file at once. A harness whose
        declared needs fit no node raises :class:`FleetError` before any episode starts. The other keywords
        go to :func:`~clawgym_env.episodes.run.run_episode` on the workers (``sandbox``, ``out_dir`` and
        ``judge`` None: the fleet config's)."""
        kwargs = episode_options(sampling=sampling, policy_version=policy_version, keep_workspace=keep_workspace,
                                 grade=grade, trace_network=trace_network, sandbox=sandbox, out_dir=out_dir,
                                 judge=judge)
        self.start()
        ray = self._ray
        adapters: list[HarnessAdapter] = []
        slot: dict[int, int] = {}
        for _, _, a in jobs:
            if id(a) not in slot:
                slot[id(a)] = len(adapters)
                adapters.append(a)
        needs = [self.config.needs(a) for a in adapters]
        for a, n in zip(adapters, needs):
            why = too_large(a.name, n, self.workers)
            if why:
                raise FleetError(why)
        queued = [EpisodeJob(index=i, task=t, sample=s, adapter=slot[id(a)], harness=a.name,
                             needs=needs[slot[id(a)]]) for i, (t, s, a) in enumerate(jobs)]
        shipped = self._ship([j.task for j in queued])
        results: list[EpisodeResult | None] = [None] * len(queued)
        self.attempts = []
        self.stats = FleetStats(len(queued), [w.info.node for w in self.workers])
        queue: collections.deque[Queued] = collections.deque((j, 1, frozenset()) for j in queued)
        in_flight: dict[Any, Attempt] = {}
        abandoned = self._abandoned
        adapter_refs = [by_value_or_ref(ray, a) for a in adapters]
        policy_name = self.config.policy.partition(":")[0]

        def end(attempt: Attempt, result: EpisodeResult) -> None:
            worker = self.workers[attempt.worker]
            rec = result.record
            infra = rec.status == "infra_error"
            retry = (infra and rec.failure_boundary in self.config.retry_boundaries
                     and attempt.number < self.config.max_attempts)
            if infra:
                self.attempts.append(AttemptRecord(
                    index=attempt.job.index, task_id=attempt.job.task.id, sample=attempt.job.sample,
                    attempt=attempt.number, node=worker.info.node, boundary=rec.failure_boundary, error=rec.error,
                    retried=retry))
            assert self.stats is not None
            self.stats.ended(worker.info.node, attempt.job.harness, final=not retry, infra=infra,
                             calls=len(result.calls))
            if retry:
                queue.appendleft((attempt.job, attempt.number + 1, attempt.avoid | {attempt.worker}))
                log.warning("fleet: episode %s#%d attempt %d on %s: %s (%s); retrying elsewhere",
                            attempt.job.task.id, attempt.job.sample, attempt.number, worker.info.node,
                            rec.failure_boundary, rec.error)
            else:
                rec.logs["fleet_node"] = worker.info.node
                rec.timings["fleet_s"] = time.monotonic() - attempt.started  # dispatch to result, this attempt
                if attempt.number > 1:
                    rec.logs["fleet_attempts"] = str(attempt.number)
                results[attempt.job.index] = result
                if on_result is not None:
                    on_result(attempt.job.index, result)
            self._report()

        while queue or in_flight:
            self._dispatch(queue, in_flight, adapter_refs, shipped, kwargs)
            self._give_up(queue, results, policy_name, on_result)
            if not queue and not in_flight:
                break
            waiting = list(in_flight) + list(abandoned) + self._probes()
            for ref in self._wait(waiting, self.config.poll_s):
                if ref in abandoned:
                    gone = abandoned.pop(ref)
                    self.workers[gone.worker].give_back(gone.job.needs)
                elif ref in in_flight:
                    attempt = in_flight.pop(ref)
                    self.workers[attempt.worker].give_back(attempt.job.needs)
                    end(attempt, self._collect(ref, attempt, policy_name))
                else:
                    self._probed(ref)
            now = time.monotonic()
            for ref, attempt in list(in_flight.items()):
                if now > attempt.deadline:  # hung: give the slot's result up, retry elsewhere
                    del in_flight[ref]
                    abandoned[ref] = attempt
                    cancel(ray, ref)
                    end(attempt, infra_result(
                        attempt.job.task, attempt.job.harness, policy_name, "internal",
                        f"no result from the rollout worker on {self.workers[attempt.worker].info.node} within "
                        f"{attempt.deadline - attempt.started:.0f} s (a hung harness or sandbox); abandoned"))
            self._check_probes(now)
        missing = [i for i, r in enumerate(results) if r is None]
        assert not missing, f"fleet bookkeeping lost episodes {missing}"  # a bug, never a silent loss
        return [r for r in results if r is not None]

    # -- internals --------------------------------------------------------------------------------
    def _ship(self, tasks: Sequence[Task]) -> dict[int, ShippedTask | None]:
        """Each distinct task's shipped copy (by ``id``), when shipping is on."""
        if not self.config.ship_tasks:
            return {}
        if self._shipper is None:
            self._shipper = Shipper(self._ray, self.config.ship_max_mb)
        out: dict[int, ShippedTask | None] = {}
        for task in tasks:
            if id(task) not in out:
                out[id(task)] = self._shipper.ship(task)
        return out

    def _dispatch(self, queue: collections.deque[Queued], in_flight: dict[Any, Attempt], adapter_refs: list[Any],
                  shipped: dict[int, ShippedTask | None], kwargs: EpisodeOptions) -> None:
        """Hand queued episodes to workers with room for their needs (:func:`~clawgym_env.fleet.placement.pick`)."""
        assert self.stats is not None
        while queue:
            chosen = pick(queue, self.workers)
            if chosen is None:
                return
            worker, pos = chosen
            job, number, avoid = queue[pos]
            del queue[pos]
            ref = worker.handle.run.remote(job.task, adapter_refs[job.adapter], kwargs,
                                           ship.for_worker(shipped.get(id(job.task)), worker.bundles_sent))
            now = time.monotonic()
            in_flight[ref] = Attempt(job=job, worker=worker.info.index, number=number, started=now,
                                     deadline=now + self.config.deadline_for(job.task), avoid=avoid)
            worker.take(job.needs)
            self.stats.dispatched(worker.info.node, job.harness)
            self._report()

    def _collect(self, ref: Any, attempt: Attempt, policy_name: str) -> EpisodeResult:
        ray = self._ray
        worker = self.workers[attempt.worker]
        try:
            result = ray.get(ref)
            if isinstance(result, EpisodeResult):
                if ship.NEED_BUNDLE in result.record.logs:  # the worker restarted since: send the reference again
                    worker.bundles_sent.discard(result.record.logs[ship.NEED_BUNDLE])
                return result
            raise TypeError(f"the rollout worker returned {type(result).__name__}, not an EpisodeResult")
        except ray.exceptions.RayActorError as exc:
            self._suspect(worker)
            return infra_result(attempt.job.task, attempt.job.harness, policy_name, "internal",
                                f"the rollout worker on {worker.info.node} died during the episode "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
        except Exception as exc:  # noqa: BLE001 - a lost result is an infrastructure failure, retried
            return infra_result(attempt.job.task, attempt.job.harness, policy_name, "internal",
                                f"the rollout worker on {worker.info.node} gave no result: {type(exc).__name__}: {exc}")

    def _wait(self, refs: list[Any], timeout: float) -> list[Any]:
        """The refs that are ready within ``timeout`` (at least one, unless the time runs out): every one
        already in, so that results that arrive together are all taken before more episodes are dispatched."""
        if not refs:
            time.sleep(timeout)
            return []
        ready, rest = self._ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and rest:
            more, _ = self._ray.wait(rest, num_returns=len(rest), timeout=0)
            ready = list(ready) + list(more)
        return list(ready)

    def _probes(self) -> list[Any]:
        return [w.probe for w in self.workers if w.state == "probing" and w.probe is not None]

    def _suspect(self, worker: WorkerSlots) -> None:
        """A worker's process died: take it out of rotation until a probe answers (Ray restarts it)."""
        if worker.state != "live":
            return
        worker.state, worker.probe, worker.next_probe = "probing", None, time.monotonic()
        worker.bundles_sent.clear()  # a restarted process holds no bundle reference
        worker.probe_deadline = time.monotonic() + self.config.start_timeout_s
        self._live_changed()
        self._check_probes(time.monotonic())

    def _probed(self, ref: Any) -> None:
        for w in self.workers:
            if w.state == "probing" and w.probe == ref:
                try:
                    info = self._ray.get(ref)
                    w.info, w.state = info, "live"
                    log.warning("fleet: the worker on %s is back (pid %d)", info.node, info.pid)
                    self._live_changed()
                except Exception as exc:  # noqa: BLE001 - still restarting (or gone: the deadline decides)
                    w.next_probe = time.monotonic() + PROBE_EVERY_S
                    log.debug("fleet: the worker on %s does not answer yet: %s", w.info.node, exc)
                w.probe = None

    def _check_probes(self, now: float) -> None:
        """Give up workers past their probe deadline; probe again those whose last probe failed."""
        for w in self.workers:
            if w.state != "probing":
                continue
            if now > w.probe_deadline:
                w.state, w.probe = "dead", None
                log.error("fleet: the worker on %s did not come back within %.0f s (restarts exhausted or its "
                          "node lost); its episodes go to the other workers", w.info.node, self.config.start_timeout_s)
                self._live_changed()
            elif w.probe is None and now >= w.next_probe:
                w.probe = w.handle.whoami.remote()

    def _give_up(self, queue: collections.deque[Queued], results: list[EpisodeResult | None], policy_name: str,
                 on_result: Callable[[int, EpisodeResult], None] | None = None) -> None:
        """Queued episodes that no live or restarting worker could ever hold (none left, or none large
        enough since a node was lost) end now, as infrastructure failures."""
        assert self.stats is not None
        doomed = unplaceable(queue, self.workers)
        if not doomed:
            return
        alive = any(w.state in ("live", "probing") for w in self.workers)
        items = [queue[pos] for pos in doomed]
        for pos in reversed(doomed):
            del queue[pos]
        for job, number, _ in items:
            why = (f"no live rollout worker can hold an episode of {job.harness} ({job.needs.cpus:g} CPU(s), "
                   f"{job.needs.memory_mb} MiB)" if alive else "no live rollout worker left")
            result = results[job.index] = infra_result(job.task, job.harness, policy_name, "internal",
                                                       f"{why} (after {number - 1} attempt(s))")
            self.stats.given_up(job.harness)
            if on_result is not None:
                on_result(job.index, result)
        self._report()

    def _live_changed(self) -> None:
        if self.stats is not None:
            self.stats.set_live_workers(sum(w.state == "live" for w in self.workers))
        self._report()

    def _report(self) -> None:
        if self.progress is not None and self.stats is not None:
            try:
                self.progress(self.stats.snapshot())
            except Exception as exc:  # noqa: BLE001 - a progress view never stops the batch
                log.warning("fleet: the progress callback raised: %s", exc)
