"""Weight sync: after each optimiser step the serving backend must sample from the new weights.

The seam is :class:`WeightSync`: ``push(policy, version) -> served version``. ``policy`` is a
:class:`trainers.policy.TrainablePolicy` (or anything with ``serving_state_dict()``); ``version`` is
the trainer's count of optimiser steps so far. Implementations:

* :class:`InProcessSync` — the serving :class:`~clawgym_env.policy.transformers_backend.TransformersPolicy`
  lives in this process. ``share=False`` (default) copies the merged weights into the serving model
  (``update_weights``), so serving and training models are separate objects and rollouts could run
  while the trainer computes; ``share=True`` serves the training module itself (no copy, no second
  model in memory; full fine-tuning only) and only bumps the version. Either way the serving
  policy's ``version`` is bumped under its lock, so every call sampled afterwards records it.
* :class:`DirectorySync` — writes the merged weights as a model directory per version
  (``<root>/v<version>/``) and calls ``notify(path, version)``: the hook for a separate inference
  server (e.g. a vLLM server told to reload its weights from that path over its admin API).

Invariants: after ``push(p, v)`` returns, every generation that starts later uses the pushed
weights; versions served are strictly increasing; a push that fails raises
:class:`~clawgym_env.errors.PolicyError` and leaves the served weights unchanged (the in-process
backend checks names and shapes before copying anything).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from clawgym_env.errors import PolicyError


@runtime_checkable
class WeightSync(Protocol):
    """How a trainer hands new weights to the serving policy."""
    def push(self, policy: Any, version: int) -> int:
        """Make the serving backend use ``policy``'s current weights; returns the version it now serves."""


class InProcessSync:
    """Sync into an in-process ``TransformersPolicy`` (see the module docstring)."""

    def __init__(self, serving, share: bool = False) -> None:
        self.serving = serving
        self.share = share

    @classmethod
    def for_policy(cls, policy, share: bool = False, name: str = "trainee"):
        """Build the serving ``TransformersPolicy`` for ``policy`` and a sync into it."""
        from clawgym_env.policy.transformers_backend import TransformersPolicy

        if share and policy.lora:
            raise PolicyError("share=True serves the training module itself, which needs full fine-tuning; "
                              "with LoRA use share=False (merged weights are copied)")
        model = policy.causal_lm if share else policy.serving_copy()
        serving = TransformersPolicy(model, policy.tokenizer, name=name)
        if share:
            policy.module.train()  # TransformersPolicy put the shared module in eval mode
        return cls(serving, share=share)

    def push(self, policy, version: int) -> int:
        """Copy ``policy``'s weights into the serving module and serve them as ``version``."""
        if version <= self.serving.version:
            raise PolicyError(f"weight sync to version {version} but version {self.serving.version} is already "
                              "served; versions must increase")
        if self.share:
            if policy.causal_lm is not self.serving.model:
                raise PolicyError("share=True but the serving model is not the training module")
        else:
            self.serving.update_weights(policy.serving_state_dict())  # checked before anything is copied
        while self.serving.version < version:  # e.g. after a resume: catch up with the trainer's count
            self.serving.update_weights({})  # copies nothing, bumps the version under the policy's lock
        return self.serving.version


class DirectorySync:
    """Write each version as a model directory and notify an external server (see the module docstring)."""

    def __init__(self, root: str | Path, notify: Callable[[Path, int], None] | None = None, keep: int = 2) -> None:
        self.root = Path(root)
        self.notify = notify
        self.keep = keep
        self.version = 0

    def push(self, policy, version: int) -> int:
        """Save ``policy`` as the model directory ``v<version>`` under the root and notify the server."""
        if version <= self.version:
            raise PolicyError(f"weight sync to version {version} after {self.version}; versions must increase")
        out = policy.save_pretrained(self.root / f"v{version}")
        (out / "clawgym_version.json").write_text(json.dumps({"version": version}))
        if self.notify is not None:
            self.notify(out, version)
        self.version = version
        old = sorted((p for p in self.root.glob("v*") if p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
        for p in old[:-self.keep] if self.keep > 0 else []:
            import shutil

            shutil.rmtree(p, ignore_errors=True)
        return version
