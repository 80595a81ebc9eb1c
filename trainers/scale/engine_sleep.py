"""Colocated vLLM engines asleep through the trainer's update (``scale.generation.sleep: true``).

:class:`SleepingEngines` is what :class:`~trainers.scale.weight_sync.VLLMSync` uses around each update when the
engines share the trainer's GPU: :meth:`SleepingEngines.sleep` takes the write side of the serving
:class:`~clawgym_env.policy.replicas.ReplicaPolicy`'s version gate (calls in flight finish; new calls wait at the
gate, so the wait is noted as the sync's and not charged to the agent) and keeps it while every engine sleeps (vLLM
sleep mode level 1: weights offloaded to host memory, KV cache dropped); :meth:`SleepingEngines.update` wakes them
and pushes the new weights inside that same hold, then lets calls through; :meth:`SleepingEngines.wake` wakes them
and lets calls through without a push (an update that ended early or failed).

Invariants: no call reaches an engine between its sleep and its wake (the gate is held; each
:class:`~clawgym_env.policy.vllm.backend.VLLMPolicy` also holds its own calls while asleep); the wake comes before
the push; after :meth:`wake` or :meth:`update` returns or raises, no engine counts as asleep by this object's doing
unless its own wake failed, and the gate is released.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clawgym_env.policy.replicas import ReplicaPolicy
    from clawgym_env.policy.vllm.backend import VLLMPolicy


class SleepingEngines:
    """Sleep/wake of ``engines`` (the replicas of ``serving``, one per vLLM server) around an update."""

    def __init__(self, serving: ReplicaPolicy, engines: Sequence[VLLMPolicy]) -> None:
        self.serving = serving
        self.engines = list(engines)
        self.asleep = False
        self.slept_s = 0.0
        """how long the last :meth:`sleep` took (its calls in flight finishing included)"""
        self._hold: contextlib.ExitStack | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the serving gate (from :meth:`sleep` until :meth:`wake` or :meth:`update`)."""
        return self._hold is not None

    def sleep(self) -> None:
        """Hold the gate's write side, then put every engine to sleep (a no-op while held)."""
        if self._hold is not None:
            return
        t0 = time.monotonic()
        hold = contextlib.ExitStack()
        hold.enter_context(self.serving.gate.write())
        self._hold = hold
        self.asleep = True  # before the first engine sleeps: wake() then wakes those that did
        for engine in self.engines:
            engine.sleep()
        self.slept_s = time.monotonic() - t0

    def _wake_engines(self) -> float:
        if not self.asleep:
            return 0.0
        t0 = time.monotonic()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the update's activations and gradients leave room for the engines' weights
        for engine in self.engines:
            engine.wake_up()
        self.asleep = False
        return time.monotonic() - t0

    def wake(self) -> float:
        """Wake every engine and release the gate (a no-op when awake and not held); the seconds waking took."""
        try:
            return self._wake_engines()
        finally:
            if self._hold is not None:
                hold, self._hold = self._hold, None
                hold.close()

    def update(self, apply: Callable[[], str], version: int) -> tuple[int, float]:
        """Wake the engines, run ``apply`` (pushes the weights; returns the method's name) and serve ``version``, all
        inside the hold taken by :meth:`sleep` (so no call slips in between wake and push; ``gate.version`` is set
        inside the write side, as :class:`~clawgym_env.policy.replicas.VersionGate` allows), then release the gate.
        Returns (the version served, seconds waking took)."""
        try:
            woken = self._wake_engines()
            t0 = time.monotonic()
            method = apply()
            self.serving.gate.version = int(version)
            self.serving.last_sync = {"method": method, "seconds": time.monotonic() - t0, "version": int(version)}
            return int(version), woken
        finally:
            self.wake()
