"""Where a queued episode runs: each node's budget of CPUs and memory, filled by the episodes' declared needs.

A worker's node has a budget (:attr:`WorkerInfo.cpus`, :attr:`WorkerInfo.memory_mb`) and a per-node cap
(:attr:`WorkerInfo.capacity`); an episode needs its harness's :class:`~clawgym_env.harness.EpisodeResources`.
:func:`pick` chooses the next ``(worker, queue position)`` to dispatch, :func:`too_large` names an episode
that no node could ever hold. Plain Python (no Ray): the scheduler's policy, testable on its own.

Invariants: a worker's running episodes always fit its budget (the sum of their needs, CPUs and memory,
within the node's, their count within the cap), whatever their harnesses; the queue is served in order
except that a job which fits no worker now lets the jobs behind it use only the workers it could never
use, so a large episode is not starved by small ones; a retry avoids the workers it failed on while
another live worker could take it (see :class:`~clawgym_env.fleet.config.Attempt`).
"""

from __future__ import annotations

import collections
from typing import Any

from clawgym_env.fleet.config import EpisodeJob, WorkerInfo
from clawgym_env.harness import EpisodeResources

EPS = 1e-9
Queued = tuple[EpisodeJob, int, frozenset[int]]
"""A queued try: the job, its attempt number, the workers it already failed on."""


class WorkerSlots:
    """The scheduler's view of one worker actor: its state and what its running episodes hold."""

    def __init__(self, info: WorkerInfo, handle: Any) -> None:
        self.info = info
        self.handle = handle
        self.running = 0
        self.cpus = 0.0
        """CPUs declared by the episodes running (or abandoned but not yet returned) on the worker."""
        self.memory_mb = 0
        """Memory declared by the episodes running (or abandoned but not yet returned) on the worker."""
        self.state = "live"  # live | probing | dead
        self.bundles_sent: set[str] = set()
        """Hashes of the shipped bundles whose reference this worker's process was sent (reset when it restarts)."""
        self.probe: Any = None
        self.probe_deadline = 0.0
        self.next_probe = 0.0

    def could_hold(self, needs: EpisodeResources) -> bool:
        """Whether one episode of ``needs`` fits the node's budget at all."""
        return needs.cpus <= self.info.cpus + EPS and needs.memory_mb <= self.info.memory_mb

    def has_room(self, needs: EpisodeResources) -> bool:
        """Whether one more episode of ``needs`` fits beside the running ones now."""
        return (self.running < self.info.capacity and self.cpus + needs.cpus <= self.info.cpus + EPS
                and self.memory_mb + needs.memory_mb <= self.info.memory_mb)

    def load(self) -> float:
        """The fullest of the worker's count, CPU and memory fractions."""
        return max(self.running / max(self.info.capacity, 1), self.cpus / max(self.info.cpus, EPS),
                   self.memory_mb / max(self.info.memory_mb, 1))

    def take(self, needs: EpisodeResources) -> None:
        """An episode of ``needs`` was dispatched here."""
        self.running += 1
        self.cpus += needs.cpus
        self.memory_mb += needs.memory_mb

    def give_back(self, needs: EpisodeResources) -> None:
        """An episode of ``needs`` returned (or was abandoned and has now returned)."""
        self.running -= 1
        self.cpus = max(0.0, self.cpus - needs.cpus)
        self.memory_mb = max(0, self.memory_mb - needs.memory_mb)


def pick(queue: collections.deque[Queued], workers: list[WorkerSlots]) -> tuple[WorkerSlots, int] | None:
    """The next dispatch: ``(worker, position in queue)``, or ``None`` when nothing can start now.

    Jobs are taken in queue order; a job goes to the least loaded live worker with room for its needs
    among those it may use (not one it failed on, unless it failed on every live one). A job that cannot
    start now holds the workers that could ever take it, so no later job takes them first."""
    live = [w for w in workers if w.state == "live"]
    live_ids = {w.info.index for w in live}
    held: set[int] = set()
    for pos, (job, _, avoid) in enumerate(queue):
        allowed = [w for w in live if (w.info.index not in avoid or live_ids <= avoid) and w.could_hold(job.needs)]
        ready = [w for w in allowed if w.info.index not in held and w.has_room(job.needs)]
        if ready:
            return min(ready, key=lambda w: (w.load(), w.info.index)), pos
        held.update(w.info.index for w in allowed)
        if held >= live_ids:
            return None
    return None


def unplaceable(queue: collections.deque[Queued], workers: list[WorkerSlots]) -> list[int]:
    """Positions of queued jobs that no live or restarting worker could ever hold (to end now, not wait forever)."""
    alive = [w for w in workers if w.state in ("live", "probing")]
    return [pos for pos, (job, _, _) in enumerate(queue) if not any(w.could_hold(job.needs) for w in alive)]


def too_large(harness: str, needs: EpisodeResources, workers: list[WorkerSlots]) -> str | None:
    """Why an episode of ``harness`` fits no worker's node (naming its needs and the largest node), or None."""
    alive = [w for w in workers if w.state != "dead"]
    if not alive or any(w.could_hold(needs) for w in alive):
        return None
    best = max(alive, key=lambda w: min(w.info.cpus / needs.cpus, w.info.memory_mb / max(needs.memory_mb, 1)))
    return (f"harness {harness} needs {needs.cpus:g} CPU(s) and {needs.memory_mb} MiB per episode, more than any "
            f"node offers: the largest, {best.info.node}, offers {best.info.cpus:g} CPU(s) and "
            f"{best.info.memory_mb} MiB to episodes; add a larger node, raise FleetConfig.node_cpus / "
            "node_memory_mb, or lower the needs (FleetConfig.episode_cpus / episode_memory_mb)")
