"""One policy over several vLLM engines (replicas of the same weights), with episode-sticky routing.

:class:`ReplicaPolicy` is the :class:`~clawgym_env.policy.base.PolicyBackend` rollouts use when a trainer
generates on vLLM (``trainers.rollouts.generation``). Each call goes to one replica (a
:class:`~clawgym_env.policy.vllm.backend.VLLMPolicy`, or any backend for tests):

* **Sticky routing.** All calls of one episode (``GenerationContext.episode_id``) go to the replica its
  first call went to, so its growing prompt hits that engine's prefix cache. A new episode goes to the
  least-loaded replica: fewest calls in flight, then fewest episodes routed, then lowest index. Calls
  without an episode id are routed by load alone. The table remembers the last ``max_sticky``
  episodes (oldest forgotten first).
* **Versions.** ``version`` is the weights' version as the trainer counts it; every call holds a read
  slot of a :class:`VersionGate` from before its request to after its answer, and records the
  version it held. :meth:`update_weights` takes the write side: new calls wait, calls in flight
  finish on the old weights, then the engines are updated and the version set, then calls resume.
  So a call's ``policy_version`` is exactly the version whose weights sampled all its tokens, and no
  call fails because of an update.
* **The sync is not the agent's time.** While a call is held back by an update (a writer waiting or
  writing), the gate notes it in :attr:`ReplicaPolicy.sync_waits` under the call's episode
  (:class:`~clawgym_env.policy.sync_wait.SyncWaits`: the union of the episode's held intervals); the episode
  runner extends that episode's wall-clock limit by it and records it (``EpisodeRecord.sync_wait_s``), so
  an episode whose only overrun is waiting for new weights does not end as ``timeout``. A call that is
  admitted at once notes nothing.
* **Prefix-cache statistics** come from each engine's Prometheus ``/metrics`` (vLLM 0.32 counters
  ``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits``, in tokens; exported with the ``_total``
  suffix): :meth:`prefix_cache_stats` (totals) and :meth:`step_metrics` (since its last call, for a
  trainer's per-step row). A replica whose metrics cannot be read reports ``None``.

Thread safe; ``close()`` closes every replica (stopping the servers they own).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from clawgym_env.errors import PolicyError
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams, SyncReport
from clawgym_env.policy.sync_wait import SyncWaits

if TYPE_CHECKING:
    from clawgym_env.policy.hf import Tokenizer

HITS_METRIC = "vllm:prefix_cache_hits_total"
QUERIES_METRIC = "vllm:prefix_cache_queries_total"


class VersionGate:
    """A readers-writer gate with writer preference that carries the served version.

    ``with gate.read(episode_id) as v``: a call holds a read slot and ``v`` cannot change until it leaves;
    the time it is held back before that (only while a writer waits or writes) is noted in ``gate.waits``
    under ``episode_id`` (nothing without one).
    ``with gate.write()``: waits for new readers to be held back and in-flight readers to leave,
    then holds the gate alone; ``gate.version`` may be set inside it. Writers are serialised.
    """

    def __init__(self, version: int = 0, *, waits: SyncWaits | None = None) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._waiting_writers = 0
        self.version = int(version)
        self.waits = waits if waits is not None else SyncWaits()

    @property
    def readers(self) -> int:
        """Read slots held right now."""
        with self._cond:
            return self._readers

    @property
    def closed(self) -> bool:
        """Whether new readers are held back now (a writer waits or writes)."""
        with self._cond:
            return self._writing or bool(self._waiting_writers)

    @contextlib.contextmanager
    def read(self, episode_id: str = "") -> Iterator[int]:
        """Hold a read slot; yields the version, fixed while it is held. Time held back by a writer is
        noted under ``episode_id`` in :attr:`waits`."""
        with self._cond:
            if self._writing or self._waiting_writers:
                with self.waits.waiting(episode_id):
                    while self._writing or self._waiting_writers:
                        self._cond.wait()
            self._readers += 1
            version = self.version
        try:
            yield version
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """Hold the gate alone (no reader in flight, new ones held back)."""
        with self._cond:
            self._waiting_writers += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._waiting_writers -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


@dataclasses.dataclass(frozen=True)
class PrefixCacheStats:
    """One replica's prefix cache: prompt tokens looked up and found (cumulative, or over a window)."""

    replica: int
    """index of the replica"""
    queries: float | None
    """prompt tokens looked up in the cache (None: metrics unreadable)"""
    hits: float | None
    """of those, tokens found cached"""

    @property
    def rate(self) -> float | None:
        """hits / queries (None without queries)."""
        if self.queries is None or self.hits is None or self.queries <= 0:
            return None
        return self.hits / self.queries


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?$")


def parse_prometheus(text: str, names: Sequence[str]) -> dict[str, float]:
    """Sum of each counter in ``names`` over all its label sets, from Prometheus text format
    (``name{labels} value [timestamp]`` lines). :class:`PolicyError` when one is absent."""
    totals = dict.fromkeys(names, 0.0)
    seen: set[str] = set()
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None or match.group(1) not in totals:
            continue
        totals[match.group(1)] += float(match.group(3))
        seen.add(match.group(1))
    missing = [n for n in names if n not in seen]
    if missing:
        raise PolicyError(f"the metrics have no {missing}")
    return totals


class ReplicaPolicy(PolicyBackend):
    """Episode-sticky routing over ``replicas`` sharing one weights version (see the module invariants).

    ``metrics_urls``: each replica's server root for ``/metrics`` (default: its ``base_url``).
    ``owns_replicas``: :meth:`close` closes them.
    """

    def __init__(self, replicas: Sequence[PolicyBackend], *, name: str | None = None,
                 metrics_urls: Sequence[str | None] | None = None, owns_replicas: bool = True,
                 max_sticky: int = 100_000, version: int = 0) -> None:
        if not replicas:
            raise PolicyError("ReplicaPolicy needs at least one replica")
        self.replicas = list(replicas)
        self.name = name or f"{getattr(self.replicas[0], 'name', 'policy')}x{len(self.replicas)}"
        urls = list(metrics_urls) if metrics_urls is not None else [getattr(r, "base_url", None) for r in replicas]
        if len(urls) != len(self.replicas):
            raise PolicyError(f"{len(urls)} metrics URLs for {len(self.replicas)} replicas")
        self.metrics_urls = urls
        self.gate = VersionGate(version)
        self.sync_waits = self.gate.waits
        """Per episode, the time its calls were held back by weight updates (read by the episode runner)."""
        self.max_sticky = int(max_sticky)
        self.last_sync: SyncReport | None = None
        self._lock = threading.Lock()
        self._sticky: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._in_flight = [0] * len(self.replicas)
        self._episodes = [0] * len(self.replicas)
        self._calls = [0] * len(self.replicas)
        self._owns = owns_replicas
        self._closed = False
        self._last_stats: list[PrefixCacheStats] | None = None
        self._last_calls = [0] * len(self.replicas)

    # -- PolicyBackend ---------------------------------------------------------------------------
    @property
    def version(self) -> int:  # type: ignore[override]
        """The served weights' version."""
        return self.gate.version

    @property
    def tokenizer(self) -> Tokenizer:
        """The replicas' tokenizer (the first one's; all serve the same model)."""
        return self.replicas[0].tokenizer

    def route(self, episode_id: str) -> int:
        """The replica for a call of ``episode_id`` (assigning a new episode to the least loaded)."""
        with self._lock:
            if episode_id and episode_id in self._sticky:
                self._sticky.move_to_end(episode_id)
                return self._sticky[episode_id]
            idx = min(range(len(self.replicas)), key=lambda i: (self._in_flight[i], self._episodes[i], i))
            if episode_id:
                self._sticky[episode_id] = idx
                self._episodes[idx] += 1
                while len(self._sticky) > self.max_sticky:
                    _, old = self._sticky.popitem(last=False)
                    self._episodes[old] -= 1
            return idx

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """Sample on the episode's replica under a read slot; the generation records the held version."""
        if self._closed:
            raise PolicyError("this ReplicaPolicy was closed; build a new one")
        idx = self.route(ctx.episode_id)
        with self.gate.read(ctx.episode_id) as version:
            with self._lock:
                self._in_flight[idx] += 1
                self._calls[idx] += 1
            try:
                gen = self.replicas[idx].generate(prompt_ids, params, ctx)
            finally:
                with self._lock:
                    self._in_flight[idx] -= 1
        return dataclasses.replace(gen, policy_version=version)

    # -- weights ---------------------------------------------------------------------------------
    def update_weights(self, apply: Callable[[], str], version: int | None = None) -> int:
        """Run ``apply()`` (updates every replica's weights; returns the method's name) with no call in
        flight, then serve ``version`` (default: the current one + 1); returns it.

        On failure the version is unchanged and the error propagates (the engines may hold partly
        updated weights: update again)."""
        with self.gate.write():
            new = self.gate.version + 1 if version is None else int(version)
            if new <= self.gate.version:
                raise PolicyError(f"weight sync to version {new} but version {self.gate.version} is already "
                                  "served; versions must increase")
            t0 = time.monotonic()
            method = apply()
            self.gate.version = new
            self.last_sync = {"method": method, "seconds": time.monotonic() - t0, "version": new}
            return new

    # -- statistics ------------------------------------------------------------------------------
    def calls(self) -> list[int]:
        """Calls sent to each replica so far."""
        with self._lock:
            return list(self._calls)

    def prefix_cache_stats(self) -> list[PrefixCacheStats]:
        """Each replica's cumulative prefix-cache counters (read from its ``/metrics``)."""
        import httpx

        out = []
        for i, url in enumerate(self.metrics_urls):
            queries = hits = None
            if url:
                try:
                    resp = httpx.get(url.rstrip("/") + "/metrics", timeout=10.0)
                    resp.raise_for_status()
                    totals = parse_prometheus(resp.text, (QUERIES_METRIC, HITS_METRIC))
                    queries, hits = totals[QUERIES_METRIC], totals[HITS_METRIC]
                except (httpx.HTTPError, PolicyError, ValueError, IndexError):
                    pass
            out.append(PrefixCacheStats(i, queries, hits))
        return out

    def step_metrics(self) -> dict[str, float | None]:
        """Since the previous call: the prefix-cache hit rate overall and per replica
        (``prefix_cache_hit_rate``, ``prefix_cache_hit_rate/r<i>``) and calls per replica
        (``replica_calls/r<i>``). A counter that went down (a restarted engine) counts from zero."""
        now = self.prefix_cache_stats()
        calls = self.calls()
        before = self._last_stats or [PrefixCacheStats(s.replica, 0.0, 0.0) for s in now]
        row: dict[str, float | None] = {}
        total_q = total_h = 0.0
        for cur, old in zip(now, before, strict=True):
            window = _window(cur, old)
            row[f"prefix_cache_hit_rate/r{cur.replica}"] = window.rate
            total_q += window.queries or 0.0
            total_h += window.hits or 0.0
        row["prefix_cache_hit_rate"] = total_h / total_q if total_q > 0 else None
        for i, (c, last) in enumerate(zip(calls, self._last_calls, strict=True)):
            row[f"replica_calls/r{i}"] = float(c - last)
        self._last_stats, self._last_calls = now, calls
        return row

    def close(self) -> None:
        """Close the replicas when owned (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._owns:
            for rep in self.replicas:
                rep.close()


def _window(cur: PrefixCacheStats, old: PrefixCacheStats) -> PrefixCacheStats:
    """``cur - old`` counter by counter; ``cur`` itself after a reset; None when either is unknown."""
    if cur.queries is None or cur.hits is None or old.queries is None or old.hits is None:
        return PrefixCacheStats(cur.replica, None, None)
    if cur.queries < old.queries or cur.hits < old.hits:
        return cur
    return PrefixCacheStats(cur.replica, cur.queries - old.queries, cur.hits - old.hits)
