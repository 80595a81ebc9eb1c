"""How long each episode's calls were held back by a weight sync: the engine's time, never the agent's.

While the serving weights change, a :class:`~clawgym_env.policy.replicas.VersionGate` holds every new call
back (the calls in flight finish on the old weights, then the engines reload). That wait is the engine's:
the agent neither causes it nor can shorten it, so the episode runner does not charge it against the
harness's wall-clock limit (:class:`~clawgym_env.sandbox.deadline.AgentTimeout`), and the record keeps it
(``EpisodeRecord.sync_wait_s``).

:class:`SyncWaits` is the ledger the gate writes and the episode runner reads. Invariants:

* an episode's wait is the **union** of the intervals during which at least one of its calls was held at
  the gate: calls held at the same time count once, so an agent that sends more calls in parallel during a
  sync gains nothing; it never exceeds the wall time the episode spent while the gate was closed;
* only the gate writes it, and only while a writer (a weight update) is waiting or running: nothing the
  agent sends can open an interval;
* :meth:`SyncWaits.waited_s` counts an interval still open up to ``now``, so a live deadline read during a
  long sync already includes it;
* the ledger forgets an episode when its runner is done with it (:meth:`SyncWaits.forget`), and keeps at most
  ``max_episodes`` episodes that nobody forgot (oldest dropped first), so it stays bounded.

Thread safe.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator


@dataclasses.dataclass
class _Waits:
    """One episode's account: the closed intervals' total, and the open one (``held`` calls since ``since``)."""

    closed_s: float = 0.0
    held: int = 0
    since: float = 0.0


class SyncWaits:
    """Per-episode time held at a weight-sync gate (see the module invariants). ``clock``: seconds, monotonic."""

    def __init__(self, *, max_episodes: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_episodes = int(max_episodes)
        self._clock = clock
        self._lock = threading.Lock()
        self._episodes: collections.OrderedDict[str, _Waits] = collections.OrderedDict()

    def begin(self, episode_id: str) -> None:
        """A call of ``episode_id`` starts waiting at the gate (pair with :meth:`end`)."""
        if not episode_id:
            return
        with self._lock:
            acct = self._episodes.get(episode_id)
            if acct is None:
                acct = self._episodes[episode_id] = _Waits()
                self._trim()
            if acct.held == 0:
                acct.since = self._clock()
            acct.held += 1

    def end(self, episode_id: str) -> None:
        """A call of ``episode_id`` that :meth:`begin` counted leaves the gate (admitted, or given up)."""
        if not episode_id:
            return
        with self._lock:
            acct = self._episodes.get(episode_id)
            if acct is None or acct.held == 0:  # forgotten meanwhile: nobody reads it any more
                return
            acct.held -= 1
            if acct.held == 0:
                acct.closed_s += max(0.0, self._clock() - acct.since)

    @contextlib.contextmanager
    def waiting(self, episode_id: str) -> Iterator[None]:
        """``begin`` on entry, ``end`` on exit (whatever ends the wait)."""
        self.begin(episode_id)
        try:
            yield
        finally:
            self.end(episode_id)

    def waited_s(self, episode_id: str, now: float | None = None) -> float:
        """Seconds during which at least one call of ``episode_id`` was held, an open wait counted up to ``now``."""
        with self._lock:
            acct = self._episodes.get(episode_id)
            if acct is None:
                return 0.0
            total = acct.closed_s
            if acct.held:
                total += max(0.0, (self._clock() if now is None else now) - acct.since)
            return total

    def holding(self, episode_id: str) -> bool:
        """Whether a call of ``episode_id`` is held at the gate right now."""
        with self._lock:
            acct = self._episodes.get(episode_id)
            return acct is not None and acct.held > 0

    def forget(self, episode_id: str) -> None:
        """Drop ``episode_id``'s account (its runner is done with it)."""
        with self._lock:
            self._episodes.pop(episode_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._episodes)

    def _trim(self) -> None:
        while len(self._episodes) > self.max_episodes:
            self._episodes.popitem(last=False)


def sync_waits_of(policy: object) -> SyncWaits | None:
    """The ledger a policy's weight-sync gate writes (its ``sync_waits`` attribute), None when it has none:
    such a policy never holds calls back for a sync, or does so where the episode runner cannot see it."""
    waits = getattr(policy, "sync_waits", None)
    return waits if isinstance(waits, SyncWaits) else None
