"""Did the serving engine sample the weights the trainer synced? A verdict over a run's metrics rows.

After an update the trainer pushes its weights to the serving engine; a later step that trains on rollouts
sampled after that push scores them with the same weights, so its ``kl_rollout`` (k3 of KL(rollout ‖ trained)
on the sampled tokens, :mod:`trainers.grpo.update`) is ~0 when the engine serves the synced weights and keeps
the update's change when it serves stale ones.

A step **compares** only when both hold: its rollouts were sampled after at least one sync (the version the
trainer held before the step, i.e. the previous row's ``version``, is at least ``min_version``) and it scored
them (``kl_rollout`` is a number: the step made an update). A run whose steps all made no update, or whose
only update was its last step, compares nothing: the verdict is then ``"unchecked"``, never a silent pass.

Invariants of :func:`check_synced_sampling`: ``status`` is ``"stale"`` when a compared step's ``kl_rollout``
reaches ``tol``, else ``"ok"`` when some step compared, else ``"unchecked"``; :meth:`SyncedSamplingCheck.require`
raises an ``AssertionError`` on ``"stale"`` and on ``"unchecked"`` unless told to allow it. Rows are read in
step order; a resumed run's rows (appended to one metrics file) continue from the last version logged. The
rows are those of a synchronous run (``scale.async.max_staleness`` 0): with rollouts ahead of training a
step's rollouts may be older than the previous version, and ``kl_rollout`` then also measures staleness.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

__all__ = ["SyncedSamplingCheck", "check_synced_sampling"]

SyncStatus = Literal["ok", "stale", "unchecked"]


@dataclasses.dataclass(frozen=True)
class SyncedSamplingCheck:
    """The verdict of :func:`check_synced_sampling` (module docstring)."""

    compared: list[int]
    """steps whose rollouts were sampled after a sync and scored by an update"""
    stale: list[int]
    """compared steps whose ``kl_rollout`` reached ``tol``"""
    tol: float
    """the largest ``kl_rollout`` a step sampled from the synced weights may show"""

    @property
    def status(self) -> SyncStatus:
        """``"stale"``, ``"ok"`` or ``"unchecked"`` (nothing was compared)."""
        if self.stale:
            return "stale"
        return "ok" if self.compared else "unchecked"

    def describe(self) -> str:
        """One line for a log or an assertion message."""
        if self.status == "unchecked":
            return ("engine-sampled-the-synced-weights: unchecked (no step trained on rollouts sampled after a "
                    "sync, so nothing was compared)")
        return (f"engine-sampled-the-synced-weights: {self.status} (compared steps {self.compared}, "
                f"kl_rollout >= {self.tol:g} at steps {self.stale})")

    def require(self, *, allow_unchecked: bool = False) -> None:
        """Raise an ``AssertionError`` when stale, or when unchecked unless ``allow_unchecked``."""
        if self.status == "stale" or (self.status == "unchecked" and not allow_unchecked):
            raise AssertionError(self.describe())


def check_synced_sampling(rows: Sequence[Mapping[str, object]], *, tol: float, key: str = "kl_rollout",
                          min_version: int = 1) -> SyncedSamplingCheck:
    """The verdict over ``rows`` (metrics rows with ``step``, ``version`` and ``key``; module docstring)."""
    compared: list[int] = []
    stale: list[int] = []
    before = 0  # the version the trainer held when the step's rollouts were sampled
    for row in sorted(rows, key=lambda r: _number(r.get("step"), 0.0)):
        kl = row.get(key)
        step = int(_number(row.get("step"), 0.0))
        if before >= min_version and isinstance(kl, (int, float)):
            compared.append(step)
            if not float(kl) < tol:
                stale.append(step)
        before = int(_number(row.get("version"), float(before)))
    return SyncedSamplingCheck(compared=compared, stale=stale, tol=tol)


def _number(value: object, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
