"""Async, off-policy rollouts: the next steps' episodes are generated while this step trains.

:class:`RolloutAhead` wraps a trainer's ``collect(step) -> StepBatch`` (the rollouts of one step: results,
groups, refill counts). With ``max_staleness = s > 0`` a background thread calls ``collect`` for the steps
after the one training, at most ``queue_steps`` (default ``s``) steps ahead of the trainer; the trainer asks
for each step's batch with :meth:`RolloutAhead.get` ``(step, trainer_version)``. With ``s = 0`` there is no
thread: ``get`` calls ``collect(step)`` itself, so the same ``collect`` calls happen in the same order, in the
caller's thread, as in synchronous code.

Staleness. Every :class:`~clawgym_env.capture.records.CallRecord` carries the ``policy_version`` that sampled
it (the serving backend's version at sampling time; an episode may span a weight update, each of its calls
keeping its own version). The lag of a call is ``trainer_version - call.policy_version``; the staleness of an
episode is that of its OLDEST call. Invariants of what :meth:`RolloutAhead.get` returns:

* no episode in ``batch.groups`` has a call whose lag exceeds ``max_staleness`` (the hard bound, checked on
  every call even when the schedule makes it hold by construction: one update per step, each pushed before
  the next ``get``);
* a stale episode is dropped (``stale="drop"``) or its whole group is collected again at the current version
  (``stale="regenerate"``, through ``rerun``; a regenerated episode that is still stale is dropped), counted
  either way;
* a group that lost episodes is rebuilt from its survivors by ``regroup`` (the trainer's own ``make_groups``,
  with its cleaning: a survivor is handed over as collected, rollouts the group had dropped for
  ``clean.max_leaves`` included, so the rebuilt group's cleaning and its counts are those of a group collected
  with these survivors only), so its advantages are computed among the survivors only; a group left without
  episodes is kept, skipped as ``"all_stale"``; groups untouched by the bound are returned as collected;
* an exception raised by ``collect`` in the background is re-raised by the ``get`` of that step, with its
  original traceback and a note naming the step; batches of earlier steps are still returned.

Metrics (:class:`AsyncStepMetrics`, one per ``get``; :meth:`AsyncStepMetrics.row` flattens it for the metrics
row): counts of calls by lag over every call sampled for the step (``staleness_lag_0 .. _s``, and
``staleness_lag_over`` for those past the bound), the mean lag of the calls kept, dropped and regenerated
episodes, and over the window since the previous ``get`` returned: rollout utilisation (share of the window
some ``collect`` or regeneration was running) and train utilisation (share of the window the trainer spent
outside ``get``, i.e. updating, syncing, logging).

Shutdown: :meth:`RolloutAhead.close` (or leaving the ``with`` block) sets :attr:`RolloutAhead.stopping`
(``collect`` may poll it to stop early), waits at most ``close_timeout_s`` for the thread and returns; a
producer still inside ``collect`` then finishes on its own (a daemon thread) and its batch is discarded.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from clawgym_env.capture.records import CallRecord
from clawgym_env.errors import ConfigError, PolicyError
from trainers.batch.tree_batch import EpisodePair, Group, as_episode, group_key, make_groups
from trainers.metrics import MetricValue

log = logging.getLogger(__name__)

STALE_MODES = ("drop", "regenerate")
GroupKey = tuple[str, str, str]


@dataclasses.dataclass
class AsyncConfig:
    """Overlap of rollouts and training (``scale.async.*``); the default is synchronous."""

    max_staleness: int = 0
    """the hard bound: an episode trains only if every call was sampled at most this many policy versions
    before the trainer's current one. 0: synchronous (rollouts of a step run, then it trains; no thread)"""
    stale: str = "drop"
    """an episode with a call past the bound: ``drop`` it (its group is rebuilt from the rest) or
    ``regenerate`` its whole group at the current version"""
    queue_steps: int | None = None
    """steps collected ahead of the one training (``None``: ``max_staleness``); fewer overlap less but make
    fewer stale calls; more than ``max_staleness`` is refused (the extra steps would only be dropped)"""
    close_timeout_s: float = 2.0
    """at shutdown, seconds to wait for a producer inside ``collect`` before leaving it to finish alone"""

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ConfigError(f"async.max_staleness must be >= 0, got {self.max_staleness}")
        if self.stale not in STALE_MODES:
            raise ConfigError(f"async.stale must be one of {STALE_MODES}, got {self.stale!r}")
        if self.queue_steps is not None and not 0 <= self.queue_steps <= self.max_staleness:
            raise ConfigError(f"async.queue_steps must be between 0 and max_staleness ({self.max_staleness}), "
                              f"got {self.queue_steps}; raise max_staleness to collect further ahead")

    @property
    def lookahead(self) -> int:
        """How many steps the producer may collect ahead of the trainer (0: no thread)."""
        return self.max_staleness if self.queue_steps is None else self.queue_steps


@dataclasses.dataclass
class AsyncStepMetrics:
    """What the staleness bound and the overlap did for one step (see the module docstring)."""

    lag_counts: list[int]
    """calls by version lag (index = lag) over every call sampled for the step, before the bound"""
    staleness_mean: float | None
    """mean lag of the calls of the episodes kept (None: no calls kept)"""
    staleness_max: int | None
    """largest episode staleness (oldest call's lag) among the episodes kept"""
    dropped: int
    """episodes removed by the bound (including regenerated ones that were still stale)"""
    regenerated_groups: int
    """groups collected again because an episode of theirs was stale"""
    regenerated_episodes: int
    """episodes those regenerations produced"""
    rollout_util: float | None
    """share of the window since the previous ``get`` during which rollouts were being collected"""
    train_util: float | None
    """share of that window the trainer spent outside ``get``"""
    wait_s: float
    """seconds this ``get`` waited for (or collected) the step's rollouts"""

    def row(self, max_staleness: int) -> dict[str, MetricValue]:
        """Flat metrics: ``staleness_lag_0 .. staleness_lag_<max_staleness>``, ``staleness_lag_over`` and the
        rest under their field names (``stale_dropped``, ``rollout_util``, ...)."""
        out: dict[str, MetricValue] = {f"staleness_lag_{i}": (self.lag_counts[i] if i < len(self.lag_counts) else 0)
                                       for i in range(max_staleness + 1)}
        out["staleness_lag_over"] = sum(self.lag_counts[max_staleness + 1:])
        out.update(staleness_mean=self.staleness_mean, staleness_max=self.staleness_max,
                   stale_dropped=self.dropped, stale_regenerated_groups=self.regenerated_groups,
                   stale_regenerated_episodes=self.regenerated_episodes, rollout_util=self.rollout_util,
                   train_util=self.train_util, rollout_wait_s=self.wait_s)
        return out


@dataclasses.dataclass
class StepBatch:
    """The rollouts of one step, as ``collect`` returns them (and :meth:`RolloutAhead.get` after the bound)."""

    step: int
    """the step these rollouts were collected for"""
    results: list[Any]
    """every episode collected for the step (``EpisodeResult`` s), infrastructure failures included"""
    groups: list[Group]
    """the step's groups, as the trainer's ``make_groups`` built them"""
    stats: dict[str, int] = dataclasses.field(default_factory=dict)
    """counts the collector reports (e.g. ``refill_groups``, ``refill_rounds``), merged into the metrics"""
    rollout_s: float = 0.0
    """wall time of ``collect`` for this step (set by :class:`RolloutAhead`)"""
    metrics: AsyncStepMetrics | None = None
    """set by :meth:`RolloutAhead.get`"""


def call_lag(call: CallRecord, trainer_version: int) -> int:
    """Versions between the call's sampler and the trainer (never negative)."""
    return max(0, trainer_version - int(call.policy_version))


def episode_staleness(calls: Sequence[CallRecord], trainer_version: int) -> int:
    """The staleness of an episode: the lag of its oldest call (0 without calls)."""
    return max((call_lag(c, trainer_version) for c in calls), default=0)


def jobs_for(keys: Sequence[GroupKey], tasks: Sequence[Any]) -> list[tuple[Any, str]]:
    """The ``(task, harness)`` jobs that re-collect the groups ``keys`` (``(suite or '-', task_id, harness)``)
    from the train suite's ``tasks``: what a trainer's ``rerun`` hands to its job runner."""
    by_id = {(t.suite or "-", t.id): t for t in tasks}
    missing = [k for k in keys if (k[0], k[1]) not in by_id]
    if missing:
        raise PolicyError(f"cannot regenerate groups {missing}: their tasks are not in the train suite")
    return [(by_id[(k[0], k[1])], k[2]) for k in keys]


class _Intervals:
    """Busy intervals of the rollout side, for the utilisation of a window (thread-safe)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._done: list[tuple[float, float]] = []
        self._open: dict[int, float] = {}
        self._next = 0

    def begin(self) -> int:
        with self._lock:
            self._next += 1
            self._open[self._next] = self.clock()
            return self._next

    def end(self, ticket: int) -> None:
        with self._lock:
            self._done.append((self._open.pop(ticket), self.clock()))

    def busy(self, lo: float, hi: float) -> float:
        """Seconds of [lo, hi] covered by at least one interval (open ones run to ``hi``); forgets older ones."""
        with self._lock:
            spans = sorted([(max(a, lo), min(b, hi)) for a, b in self._done if b > lo and a < hi]
                           + [(max(a, lo), hi) for a in self._open.values() if a < hi])
            self._done = [(a, b) for a, b in self._done if b > hi]
        total, end = 0.0, lo
        for a, b in spans:
            if b > end:
                total += b - max(a, end)
                end = b
        return total


class RolloutAhead:
    """Collects steps ``start..stop`` through ``collect``, up to ``config.lookahead`` steps ahead of the trainer.

    ``regroup(episodes) -> groups`` rebuilds a group from its surviving episodes (default: ``make_groups``
    with its defaults; pass the trainer's options). ``rerun(keys) -> results`` collects ``group_size`` fresh
    episodes of each group key, in order (needed by ``stale="regenerate"``; see :func:`jobs_for`).
    """

    def __init__(self, collect: Callable[[int], StepBatch], config: AsyncConfig, *, start: int, stop: int,
                 regroup: Callable[[list[EpisodePair]], list[Group]] | None = None,
                 rerun: Callable[[list[GroupKey]], list[Any]] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if config.stale == "regenerate" and rerun is None:
            raise ConfigError("async.stale='regenerate' needs a rerun function that collects groups again")
        self.collect = collect
        self.config = config
        self.start, self.stop = start, stop
        self.regroup = regroup or (lambda eps: make_groups(eps))
        self.rerun = rerun
        self.clock = clock
        self.stopping = threading.Event()
        """set by :meth:`close`; a long ``collect`` may poll it and return early (its batch is discarded)"""
        self._cond = threading.Condition()
        self._ready: dict[int, StepBatch] = {}
        self._error: tuple[int, BaseException] | None = None
        self._taken = start - 1  # the last step handed to the trainer
        self._thread: threading.Thread | None = None
        self._closed = False
        self._busy = _Intervals(clock)
        self._window_start: float | None = None

    # -- producer ---------------------------------------------------------------------------------------------

    def _timed_collect(self, step: int) -> StepBatch:
        ticket = self._busy.begin()
        t0 = self.clock()
        try:
            batch = self.collect(step)
        finally:
            self._busy.end(ticket)
        if not isinstance(batch, StepBatch):
            raise PolicyError(f"collect({step}) returned {type(batch).__name__}, not a StepBatch")
        batch.rollout_s = self.clock() - t0
        return batch

    def _produce(self) -> None:
        step = self.start

        def may_start() -> bool:
            return self.stopping.is_set() or step - self.config.lookahead <= self._taken

        while step <= self.stop:
            with self._cond:
                self._cond.wait_for(may_start)
                if self.stopping.is_set():
                    return
            try:
                batch = self._timed_collect(step)
            except BaseException as exc:  # noqa: BLE001 - surfaces in get() of this step
                with self._cond:
                    self._error = (step, exc)
                    self._cond.notify_all()
                return
            with self._cond:
                if self.stopping.is_set():
                    return
                self._ready[step] = batch
                self._cond.notify_all()
            step += 1

    def begin(self) -> RolloutAhead:
        """Start the producer thread (no-op when synchronous or already started)."""
        if self._window_start is None:
            self._window_start = self.clock()
        if self.config.lookahead > 0 and self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._produce, name="rollouts-ahead", daemon=True)
            self._thread.start()
        return self

    # -- consumer ---------------------------------------------------------------------------------------------

    def get(self, step: int, trainer_version: int) -> StepBatch:
        """The rollouts of ``step`` with the staleness bound applied against ``trainer_version`` (module doc)."""
        if self._closed:
            raise PolicyError("these rollouts were closed; make a new RolloutAhead")
        if step != self._taken + 1 or step > self.stop:
            raise PolicyError(f"get({step}) out of order: steps are taken one by one from {self.start} to "
                              f"{self.stop}; the next is {self._taken + 1}")
        self.begin()
        called = self.clock()
        if self.config.lookahead == 0:
            self._taken = step
            batch = self._timed_collect(step)
        else:
            batch = self._wait(step)
        batch, counts = self._bound(batch, trainer_version)
        done = self.clock()
        opened = done if self._window_start is None else self._window_start
        window = done - opened
        batch.metrics = dataclasses.replace(
            counts, rollout_util=self._busy.busy(opened, done) / window if window > 0 else None,
            train_util=(called - opened) / window if window > 0 else None, wait_s=done - called)
        self._window_start = done
        return batch

    def _wait(self, step: int) -> StepBatch:
        with self._cond:
            self._taken = step
            self._cond.notify_all()
            self._cond.wait_for(lambda: step in self._ready or self._error is not None or self._closed)
            if step in self._ready:
                return self._ready.pop(step)
            if self._error is not None and self._error[0] == step:
                exc = self._error[1]
                note = getattr(exc, "add_note", None)  # Python >= 3.11
                if note is not None:
                    note(f"raised by the background rollouts of step {step} (async.max_staleness="
                         f"{self.config.max_staleness}); the frames above are the producer thread's")
                raise exc
        raise PolicyError(f"the rollouts were closed while waiting for step {step}")

    def _bound(self, batch: StepBatch, version: int) -> tuple[StepBatch, AsyncStepMetrics]:
        """Apply the staleness bound; returns the batch to train on and its counts (module docstring)."""
        bound = self.config.max_staleness
        pairs = [as_episode(r) for r in batch.results]
        lags = [call_lag(c, version) for _, calls in pairs for c in calls]
        stale = {rec.episode_id for rec, calls in pairs
                 if rec.is_task_outcome and episode_staleness(calls, version) > bound}
        if not stale:
            return batch, self._counts(lags, batch.results, version, 0, 0, 0)
        regen_eps = 0
        keys: list[GroupKey] = []
        fresh: dict[GroupKey, list[EpisodePair]] = {}
        results = list(batch.results)
        if self.config.stale == "regenerate":
            assert self.rerun is not None
            keys = list(dict.fromkeys(group_key(rec) for rec, _ in pairs if rec.episode_id in stale))
            ticket = self._busy.begin()
            try:
                rerun = list(self.rerun(keys))
            finally:
                self._busy.end(ticket)
            regen_eps = len(rerun)
            new = [as_episode(r) for r in rerun]
            lags += [call_lag(c, version) for _, calls in new for c in calls]
            for rec, calls in new:
                fresh.setdefault(group_key(rec), [])
                if rec.is_task_outcome and episode_staleness(calls, version) > bound:
                    stale.add(rec.episode_id)
            results = [r for r, (rec, _) in zip(results, pairs) if group_key(rec) not in keys] + rerun
            pairs = [as_episode(r) for r in results]
            for rec, calls in pairs:
                if group_key(rec) in fresh:
                    fresh[group_key(rec)].append((rec, calls))
        dropped = sum(rec.episode_id in stale for rec, _ in pairs)
        results = [r for r, (rec, _) in zip(results, pairs) if rec.episode_id not in stale]
        groups: list[Group] = []
        for g in batch.groups:
            if g.key in keys:  # regenerated: the first group of the key is rebuilt from the fresh episodes
                eps = fresh.pop(g.key, [])
                infra = sum(rec.is_infra_failure for rec, _ in eps)
                survivors = [(rec, calls) for rec, calls in eps if rec.is_task_outcome and rec.episode_id not in stale]
            elif any(rec.episode_id in stale for rec, _ in g.episodes + g.dropped):
                infra = g.infra_excluded  # rollouts dropped for clean.max_leaves go back in: regroup drops them again
                survivors = [(rec, calls) for rec, calls in g.episodes + g.dropped if rec.episode_id not in stale]
            else:
                groups.append(g)
                continue
            rebuilt = [r for r in self.regroup(survivors) if r.key == g.key] if survivors else []
            if rebuilt:
                rebuilt[0].infra_excluded = infra
                groups.append(rebuilt[0])
            else:
                groups.append(Group(g.key, [], [], [], infra_excluded=infra, skipped="all_stale"))
        counts = self._counts(lags, results, version, dropped, len(keys), regen_eps)
        return dataclasses.replace(batch, results=results, groups=groups), counts

    @staticmethod
    def _counts(lags: list[int], results: list[Any], version: int, dropped: int, regen_groups: int,
                regen_eps: int) -> AsyncStepMetrics:
        hist = [0] * (max(lags) + 1 if lags else 1)
        for lag in lags:
            hist[lag] += 1
        kept = [calls for rec, calls in map(as_episode, results) if rec.is_task_outcome]
        flat = [c for calls in kept for c in calls]
        return AsyncStepMetrics(
            lag_counts=hist, staleness_mean=(sum(call_lag(c, version) for c in flat) / len(flat)) if flat else None,
            staleness_max=max((episode_staleness(calls, version) for calls in kept), default=None),
            dropped=dropped, regenerated_groups=regen_groups, regenerated_episodes=regen_eps,
            rollout_util=None, train_util=None, wait_s=0.0)

    # -- shutdown ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the producer: set :attr:`stopping`, wait at most ``close_timeout_s``, return (idempotent)."""
        self._closed = True
        self.stopping.set()
        with self._cond:
            self._ready.clear()
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.config.close_timeout_s)
            if thread.is_alive():
                log.warning("background rollouts still inside collect() after %.1f s; left to finish alone, "
                            "their batch is discarded", self.config.close_timeout_s)

    def __enter__(self) -> RolloutAhead:
        return self.begin()

    def __exit__(self, *exc: object) -> None:
        self.close()

