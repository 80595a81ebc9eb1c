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
from collections.abc import Callable
from typing import Any

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
        """A one-line summary for a progress bar's postfix: queue depth, running, infra-failed, rates, then
        ``name=running/done[!infra_failed]`` per node (and per harness when the batch mixes several)."""
        def part(counts: dict[str, Counts]) -> str:
            return " ".join(f"{n}={c.running}/{c.done}" + (f"!{c.infra_failed}" if c.infra_failed else "")
                            for n, c in sorted(counts.items()))

        mixed = f" | {part(self.harnesses)}" if len(self.harnesses) > 1 else ""
        return (f"q={self.queued} run={self.running} infra={self.infra_failed} "
                f"{self.episodes_per_s:.2f} ep/s {self.calls_per_s:.1f} calls/s {part(self.nodes)}{mixed}")

    def metrics(self, prefix: str = "fleet") -> dict[str, float | int]:
        """The snapshot as flat metrics: ``fleet/running``, ``fleet/queue_depth``, ``fleet/calls_per_s``, ...,
        then ``fleet/node/<node>/<count>`` and ``fleet/harness/<harness>/<count>`` for running, done,
        infra_failed and retried."""
        out: dict[str, float | int] = {
            f"{prefix}/total": self.total, f"{prefix}/done": self.done, f"{prefix}/running": self.running,
            f"{prefix}/queue_depth": self.queued, f"{prefix}/infra_failed": self.infra_failed,
            f"{prefix}/retried": self.retried, f"{prefix}/calls": self.calls,
            f"{prefix}/episodes_per_s": round(self.episodes_per_s, 4),
            f"{prefix}/calls_per_s": round(self.calls_per_s, 4),
            f"{prefix}/live_workers": self.live_workers, f"{prefix}/elapsed_s": round(self.elapsed_s, 3)}
        for kind, table in (("node", self.nodes), ("harness", self.harnesses)):
            for name, c in sorted(table.items()):
                for field in ("running", "done", "infra_failed", "retried"):
                    out[f"{prefix}/{kind}/{name}/{field}"] = getattr(c, field)
        return out


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


def fleet_metrics(fleet: object) -> dict[str, float | int]:
    """Flat metrics of a fleet's current (or last) batch (:meth:`FleetProgress.metrics`), for a metrics file.

    ``fleet``: a :class:`~clawgym_env.fleet.RayFleet`, an object holding one as ``.fleet`` (a trainer's
    rollout fleet), a :class:`FleetProgress`, or ``None``; empty when there is no fleet or no batch yet."""
    if isinstance(fleet, FleetProgress):
        return fleet.metrics()
    inner = getattr(fleet, "fleet", None)
    if inner is not None and not isinstance(inner, FleetStats):
        fleet = inner
    stats = getattr(fleet, "stats", None)
    return stats.snapshot().metrics() if isinstance(stats, FleetStats) else {}


def bar_postfix(bar: Any, every_s: float = 0.5) -> Callable[[FleetProgress], None]:
    """A fleet progress callback that shows :meth:`FleetProgress.line` in a tqdm ``bar``'s postfix, redrawn at
    most every ``every_s`` seconds (and at the batch's end); the bar's count is its owner's to update."""
    last: list[float | None] = [None]  # when it last redrew; None: never (the first call always redraws)

    def show(p: FleetProgress) -> None:
        now = time.monotonic()  # counts from an arbitrary point (boot on Linux): only differences mean anything
        previous = last[0]
        redraw = previous is None or p.done >= p.total or now - previous >= every_s
        bar.set_postfix_str(p.line(), refresh=redraw)
        if redraw:
            last[0] = now

    return show
