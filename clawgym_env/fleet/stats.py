"""Live counts of a fleet's episodes, per node and per harness, for a progress bar and the metrics file.

:class:`FleetStats` is updated by the scheduler (one thread) and read by anyone: every change goes
through its lock and :meth:`FleetStats.snapshot` returns a frozen, serialisable
:class:`FleetProgress`. Invariants: ``running`` of a node never exceeds its capacity; ``done`` counts
episodes that ended for good (one per requested episode), ``infra_failed`` attempts that ended in an
infrastructure failure (retried or not), ``retried`` the attempts that were tried again.
"""

from __future__ import annotations

import threading
import time

from pydantic import BaseModel, ConfigDict


class Counts(BaseModel):
    """Episode counts of one node or one harness."""

    model_config = ConfigDict(frozen=True)

    running: int = 0
    done: int = 0
    infra_failed: int = 0
    retried: int = 0


class FleetProgress(BaseModel):
    """One snapshot of a fleet batch (what a progress bar shows and the metrics file keeps)."""

    model_config = ConfigDict(frozen=True)

    total: int
    """Episodes requested in the batch."""
    done: int
    running: int
    queued: int
    """Queue depth: episodes (first tries and retries) waiting for a free slot."""
    infra_failed: int
    retried: int
    calls: int
    """Model calls captured by the episodes done so far."""
    elapsed_s: float
    episodes_per_s: float
    calls_per_s: float
    live_workers: int
    nodes: dict[str, Counts]
    harnesses: dict[str, Counts]

    def line(self) -> str:
        """A one-line summary for a progress bar's postfix."""
        per_node = " ".join(f"{n}={c.running}/{c.done}" + (f"!{c.infra_failed}" if c.infra_failed else "")
                            for n, c in sorted(self.nodes.items()))
        return (f"q={self.queued} run={self.running} infra={self.infra_failed} "
                f"{self.episodes_per_s:.2f} ep/s {per_node}")


class _Tally:
    __slots__ = ("running", "done", "infra_failed", "retried")

    def __init__(self) -> None:
        self.running = self.done = self.infra_failed = self.retried = 0

    def frozen(self) -> Counts:
        return Counts(running=self.running, done=self.done, infra_failed=self.infra_failed, retried=self.retried)


class FleetStats:
    """Thread-safe counters of one batch (see the module doc)."""

    def __init__(self, total: int, nodes: list[str]) -> None:
        self.total = total
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._nodes: dict[str, _Tally] = {n: _Tally() for n in nodes}
        self._harnesses: dict[str, _Tally] = {}
        self._queued = total
        self._calls = 0
        self._live = len(nodes)

    def _pair(self, node: str, harness: str) -> tuple[_Tally, _Tally]:
        return self._nodes.setdefault(node, _Tally()), self._harnesses.setdefault(harness, _Tally())

    def dispatched(self, node: str, harness: str) -> None:
        """An attempt left the queue for ``node``."""
        with self._lock:
            self._queued -= 1
            for t in self._pair(node, harness):
                t.running += 1

    def ended(self, node: str, harness: str, *, final: bool, infra: bool, calls: int = 0) -> None:
        """An attempt ended: ``final`` (the episode is done) or retried; ``infra``: an infrastructure failure."""
        with self._lock:
            for t in self._pair(node, harness):
                t.running -= 1
                t.done += final
                t.infra_failed += infra
                t.retried += not final
            if not final:
                self._queued += 1
            self._calls += calls

    def given_up(self, harness: str, count: int = 1) -> None:
        """Queued episodes ended without a try (no live worker left)."""
        with self._lock:
            self._queued -= count
            self._harnesses.setdefault(harness, _Tally()).done += count

    def set_live_workers(self, n: int) -> None:
        """How many workers take episodes now."""
        with self._lock:
            self._live = n

    def snapshot(self) -> FleetProgress:
        """The counts now, frozen."""
        with self._lock:
            elapsed = max(time.monotonic() - self._started, 1e-9)
            done = sum(t.done for t in self._harnesses.values())
            return FleetProgress(
                total=self.total, done=done, running=sum(t.running for t in self._nodes.values()),
                queued=self._queued, infra_failed=sum(t.infra_failed for t in self._nodes.values()),
                retried=sum(t.retried for t in self._nodes.values()), calls=self._calls, elapsed_s=elapsed,
                episodes_per_s=done / elapsed, calls_per_s=self._calls / elapsed, live_workers=self._live,
                nodes={n: t.frozen() for n, t in self._nodes.items()},
                harnesses={h: t.frozen() for h, t in self._harnesses.items()})
