"""Exec deadlines: a fixed wall-clock limit, or one on the agent's own time that the engine may extend.

:meth:`~clawgym_env.sandbox.base.Sandbox.exec` takes ``timeout`` in seconds. An :class:`AgentTimeout` is such
a number (a ``float``: a backend that knows nothing of it reads its seconds, as before) that also says how
many seconds so far were **not the agent's**: ``excused_s()``, e.g. the time its model calls were held back
while the serving weights changed (:mod:`clawgym_env.policy.sync_wait`). The backends here turn ``timeout``
into a :class:`Deadline` at the exec's start.

Invariants of :class:`Deadline`:

* a plain ``timeout`` gives the fixed deadline ``start + timeout``, exactly as before;
* an :class:`AgentTimeout` gives ``start + seconds + excused_s()``, read afresh at every check: the process is
  killed once the wall time minus the excused time reaches ``seconds``, never earlier. The agent's own
  slowness (its tools, its harness, its model's generation) is never excused, so it still times out;
* ``excused_s()`` must never decrease; a value it gives that is negative, NaN or raises counts as 0 excused
  (a broken source never grants time, and never kills early either);
* :meth:`Deadline.poll_s` never asks a waiter to sleep past the deadline as known now, and, for an extendable
  deadline, not less than :data:`MIN_POLL_S` (a deadline pushed along by an open wait would otherwise make a
  waiter spin): such an exec may be killed up to that much after its deadline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

MIN_POLL_S = 0.05
"""The shortest sleep between two checks of an extendable deadline."""


class AgentTimeout(float):
    """``seconds`` of the agent's own time: wall time minus ``excused_s()`` (see the module invariants)."""

    excused_s: Callable[[], float]

    def __new__(cls, seconds: float, excused_s: Callable[[], float]) -> AgentTimeout:
        """``seconds`` > 0; ``excused_s``: seconds so far that are not the agent's (non-decreasing)."""
        if not seconds > 0:
            raise ValueError(f"an AgentTimeout needs seconds > 0, got {seconds}")
        obj = super().__new__(cls, seconds)
        obj.excused_s = excused_s
        return obj


class Deadline:
    """When an exec started at ``start`` (monotonic seconds) must be killed (see the module invariants)."""

    def __init__(self, start: float, seconds: float, excused_s: Callable[[], float] | None = None) -> None:
        self.start = float(start)
        self.seconds = float(seconds)
        self._excused = excused_s

    @classmethod
    def of(cls, timeout: float | None, start: float) -> Deadline | None:
        """The deadline of an exec started at ``start`` with ``timeout`` (None: no deadline)."""
        if timeout is None:
            return None
        return cls(start, float(timeout), timeout.excused_s if isinstance(timeout, AgentTimeout) else None)

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """A fixed deadline ``seconds`` from now (e.g. the grace to drain a killed process's output)."""
        return cls(time.monotonic(), seconds)

    @property
    def extendable(self) -> bool:
        """Whether excused time may still push this deadline later."""
        return self._excused is not None

    def excused(self) -> float:
        """Seconds excused so far (0 for a fixed deadline, or when the source misbehaves)."""
        if self._excused is None:
            return 0.0
        try:
            value = float(self._excused())
        except Exception:  # noqa: BLE001 - a broken source grants nothing and kills nothing early
            return 0.0
        return value if math.isfinite(value) and value > 0 else 0.0

    def at(self) -> float:
        """The deadline as known now (monotonic seconds)."""
        return self.start + self.seconds + self.excused()

    def left(self) -> float:
        """Seconds left before the deadline as known now (<= 0: passed)."""
        return self.at() - time.monotonic()

    def expired(self) -> bool:
        """Whether the deadline, as known now, has passed."""
        return self.left() <= 0

    def poll_s(self) -> float:
        """How long a waiter may sleep before it must check again (0: the deadline passed)."""
        left = self.left()
        if left <= 0:
            return 0.0
        return max(left, MIN_POLL_S) if self.extendable else left
