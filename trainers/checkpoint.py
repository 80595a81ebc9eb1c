"""Checkpoints: save and resume a training run (model, optimiser, step, RNG, config).

Layout under a run's ``out_dir``::

    checkpoints/step_000002/model.pt        the trained module's state dict (LoRA: base + adapters)
    checkpoints/step_000002/optimizer.pt    the optimiser's state dict
    checkpoints/step_000002/state.json      {"step", "version", "rng", "config", "extra", "saved_at"}
    checkpoints/latest                      the name of the newest complete checkpoint folder

Invariants: a checkpoint folder is complete before ``latest`` names it (files are written into a
temporary folder that is renamed into place, then ``latest`` is replaced atomically), so a run
killed mid-save resumes from the previous checkpoint; ``step`` is the number of optimiser steps
done, so a resumed run continues at ``step + 1``; restoring the RNG states (Python, NumPy, torch
CPU and CUDA) makes the resumed run draw what the uninterrupted run would have drawn, given the
same rollouts. ``keep`` prunes all but the newest ``keep`` checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clawgym_env.errors import PolicyError

CKPT_DIR = "checkpoints"
LATEST = "latest"


def rng_state() -> dict[str, Any]:
    """Every RNG a trainer draws from, as JSON-ready lists."""
    np_state: tuple[Any, ...] = np.random.get_state(legacy=True)  # type: ignore[assignment]
    py = random.getstate()
    out = {"python": [py[0], list(py[1]), py[2]],
           "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
           "torch": torch.get_rng_state().tolist()}
    if torch.cuda.is_available():
        out["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the Python, NumPy and torch RNG states of :func:`rng_state`."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def _jsonable(config: Any) -> Any:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return config


def save_checkpoint(out_dir: str | Path, step: int, policy, optimizer: torch.optim.Optimizer | None, *,
                    config: Any = None, version: int | None = None, extra: dict[str, Any] | None = None,
                    keep: int = 2) -> Path:
    """Write ``checkpoints/step_<step>/`` under ``out_dir`` and point ``latest`` at it; returns the folder."""
    root = Path(out_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(policy.state_dict(), tmp / "model.pt")
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    state = {"step": int(step), "version": int(step if version is None else version), "rng": rng_state(),
             "config": _jsonable(config), "extra": extra or {}, "saved_at": time.time()}
    (tmp / "state.json").write_text(json.dumps(state))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(name + "\n")
    pointer.replace(root / LATEST)
    if keep > 0:
        done = sorted(p for p in root.glob("step_*") if p.is_dir())
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder of a run, or None."""
    root = Path(out_dir) / CKPT_DIR
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    folder = root / pointer.read_text().strip()
    return folder if (folder / "state.json").is_file() else None


def load_checkpoint(path: str | Path, policy=None, optimizer: torch.optim.Optimizer | None = None, *,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Load weights (and optimiser state) into the given objects; returns ``state.json``'s content.

    ``path`` is a checkpoint folder or a run's ``out_dir`` (then its latest checkpoint).
    """
    path = Path(path)
    if not (path / "state.json").is_file():
        found = latest_checkpoint(path)
        if found is None:
            raise PolicyError(f"no checkpoint in {path} (expected state.json or {CKPT_DIR}/{LATEST})")
        path = found
    state = json.loads((path / "state.json").read_text())
    if policy is not None:
        device = getattr(policy, "device", "cpu")
        policy.load_state_dict(torch.load(path / "model.pt", map_location=device, weights_only=True))
    if optimizer is not None:
        opt_file = path / "optimizer.pt"
        if not opt_file.is_file():
            raise PolicyError(f"{path} holds no optimizer.pt; resume needs one")
        optimizer.load_state_dict(torch.load(opt_file, map_location="cpu", weights_only=True))
    if restore_rng:
        set_rng_state(state["rng"])
    state["path"] = str(path)
    return state
