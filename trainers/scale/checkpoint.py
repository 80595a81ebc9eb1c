"""Checkpoints: save and resume a training run (model, optimiser, step, RNG, config), sharded or not.

Layout under a run's ``out_dir``::

    checkpoints/step_000002/dcp/               torch.distributed.checkpoint: trainable weights + optimiser state
    checkpoints/step_000002/rng_rank<r>.json    each rank's RNG states
    checkpoints/step_000002/state.json          {"step", "version", "rng", "config", "extra", "saved_at", "format",
                                                 "world_size", "optimizer"}
    checkpoints/latest                          the name of the newest complete checkpoint folder

What is saved: for each module of ``policy.checkpoint_modules()`` (``{"policy": ...}``, plus ``"critic"``
for PPO) its trainable parameters only, under ``<module>.<name>`` — under LoRA the adapters, never the
frozen base, which comes from the model as it is built — and the optimiser's state keyed by the same
names (``get_state_dict``/``set_state_dict`` of ``torch.distributed.checkpoint.state_dict``).

Invariants: save and load are collectives when a process group is initialised (every rank calls
them) and plain function calls without one; a checkpoint saved on N ranks loads on M ranks (1
included, without a process group) with identical full weights and optimiser state, because DCP
stores each tensor's global shape and reshards on load. A checkpoint folder is complete before
``latest`` names it (everything is written into a temporary folder; after a barrier rank 0 renames it
into place and replaces ``latest`` atomically), so a run killed mid-save resumes from the previous
checkpoint; ``step`` is the number of optimiser steps done, so a resumed run continues at
``step + 1``; restoring the RNG states (Python, NumPy, torch CPU and CUDA; each rank its own, a rank
the saving run did not have takes rank 0's) makes the resumed run draw what the uninterrupted run
would have drawn, given the same rollouts. ``keep`` prunes all but the newest ``keep`` checkpoints.
Several nodes need ``out_dir`` on a filesystem they share. Checkpoints of the older single-file
format (``model.pt``/``optimizer.pt``) still load (their optimiser state only without sharding).
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
from torch import nn

from clawgym_env.errors import PolicyError

CKPT_DIR = "checkpoints"
LATEST = "latest"
DCP_DIR = "dcp"
LEGACY_MODEL = "model.pt"
LEGACY_OPTIMIZER = "optimizer.pt"
FORMAT = "dcp-v1"


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


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _rank() -> int:
    return d.get_rank() if (d := _dist()) else 0


def _barrier() -> None:
    if d := _dist():
        d.barrier()


def checkpoint_modules(policy) -> dict[str, nn.Module]:
    """``policy.checkpoint_modules()``; an actor-critic without one gives its policy's modules plus ``critic``."""
    own = getattr(policy, "checkpoint_modules", None)
    if callable(own):
        return dict(own())
    inner, critic = getattr(policy, "policy", None), getattr(policy, "critic", None)
    if inner is not None and callable(getattr(inner, "checkpoint_modules", None)) and isinstance(critic, nn.Module):
        return {**inner.checkpoint_modules(), "critic": critic}
    raise PolicyError(f"{type(policy).__name__} cannot be checkpointed: it needs checkpoint_modules() -> "
                      "{name: nn.Module}")


def _bundle(policy) -> nn.Module:
    return nn.ModuleDict(checkpoint_modules(policy))  # registers the modules under their names; copies nothing


def _model_state(bundle: nn.Module) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    trainable = {n for n, p in bundle.named_parameters(remove_duplicate=False) if p.requires_grad}
    state = get_model_state_dict(bundle, options=StateDictOptions(ignore_frozen_params=True))
    return {k: v for k, v in state.items() if k in trainable}  # a head tied to a frozen embedding is frozen too


def save_checkpoint(out_dir: str | Path, step: int, policy, optimizer: torch.optim.Optimizer | None, *,
                    config: Any = None, version: int | None = None, extra: dict[str, Any] | None = None,
                    keep: int = 2) -> Path:
    """Write ``checkpoints/step_<step>/`` under ``out_dir`` and point ``latest`` at it; returns the folder.

    A collective under a process group: every rank calls it with its shard of the same model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    root = Path(out_dir) / CKPT_DIR
    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f".{name}.tmp"
    rank = _rank()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    bundle = _bundle(policy)
    state: dict[str, Any] = {"model": _model_state(bundle)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(bundle, optimizer)
    dcp.save(state, checkpoint_id=tmp / DCP_DIR)
    (tmp / f"rng_rank{rank}.json").write_text(json.dumps(rng_state()))
    _barrier()
    if rank == 0:
        world = d.get_world_size() if (d := _dist()) else 1
        meta = {"step": int(step), "version": int(step if version is None else version), "rng": rng_state(),
                "config": _jsonable(config), "extra": extra or {}, "saved_at": time.time(), "format": FORMAT,
                "world_size": world, "optimizer": optimizer is not None}
        (tmp / "state.json").write_text(json.dumps(meta))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        pointer = root / f".{LATEST}.tmp"
        pointer.write_text(name + "\n")
        pointer.replace(root / LATEST)
        if keep > 0:
            done = sorted(p for p in root.glob("step_*") if p.is_dir())
            for old in done[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder of a run, or None."""
    root = Path(out_dir) / CKPT_DIR
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    folder = root / pointer.read_text().strip()
    return folder if (folder / "state.json").is_file() else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a run's ``out_dir`` → its latest checkpoint; an error names what is missing."""
    path = Path(path)
    if (path / "state.json").is_file():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise PolicyError(f"no checkpoint in {path} (expected state.json or {CKPT_DIR}/{LATEST}); pass a run's "
                          f"out_dir or one of its {CKPT_DIR}/step_* folders")
    return found


def load_checkpoint(path: str | Path, policy=None, optimizer: torch.optim.Optimizer | None = None, *,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Load weights (and optimiser state) into the given objects; returns ``state.json``'s content.

    ``path`` is a checkpoint folder or a run's ``out_dir`` (then its latest checkpoint). A collective
    under a process group; the modules may be sharded differently from the run that saved it.
    """
    path = resolve_checkpoint(path)
    state = json.loads((path / "state.json").read_text())
    if optimizer is not None and policy is None:
        raise PolicyError("loading optimiser state needs the policy too (its parameter names key the state)")
    if (path / DCP_DIR).is_dir():
        if policy is not None:
            _load_dcp(path, policy, optimizer)
    elif (path / LEGACY_MODEL).is_file():
        _load_legacy(path, policy, optimizer)
    else:
        raise PolicyError(f"{path} holds neither {DCP_DIR}/ (a sharded checkpoint) nor {LEGACY_MODEL} (the older "
                          "single-file format); it is not a checkpoint this version can read")
    if restore_rng:
        own = path / f"rng_rank{_rank()}.json"
        set_rng_state(json.loads(own.read_text()) if own.is_file() else state["rng"])
    state["path"] = str(path)
    return state


def stored_keys(path: str | Path) -> set[str]:
    """The flattened keys a checkpoint folder's ``dcp/`` holds (``model.<module>.<name>``, ``optim.…``)."""
    import torch.distributed.checkpoint as dcp

    return set(dcp.FileSystemReader(str(Path(path) / DCP_DIR)).read_metadata().state_dict_metadata)


def checkpoint_tensors(path: str | Path) -> dict[str, dict[str, torch.Tensor]]:
    """The saved weights of a checkpoint (folder or run), read in this process without building a model:
    ``{module: {name: full tensor}}``, e.g. ``["policy"]["model.layers.0.mlp.up_proj.weight"]``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = resolve_checkpoint(path)
    if not (path / DCP_DIR).is_dir():
        raise PolicyError(f"{path} is not a sharded checkpoint (no {DCP_DIR}/)")
    meta = dcp.FileSystemReader(str(path / DCP_DIR)).read_metadata().state_dict_metadata
    flat = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()
            if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    dcp.load(flat, checkpoint_id=path / DCP_DIR)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in flat.items():
        module, name = key[len("model."):].split(".", 1)
        out.setdefault(module, {})[name] = tensor
    return out


def _load_dcp(path: Path, policy, optimizer: torch.optim.Optimizer | None) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    bundle = _bundle(policy)
    target: dict[str, Any] = {"model": _model_state(bundle)}
    stored = stored_keys(path)
    saved_model = {k[len("model."):] for k in stored if k.startswith("model.")}
    ours = set(target["model"])
    loaded_modules = {k.split(".", 1)[0] for k in ours}
    missing = sorted(ours - saved_model)
    unexpected = sorted(k for k in saved_model - ours if k.split(".", 1)[0] in loaded_modules)
    if missing or unexpected:
        raise PolicyError(f"checkpoint {path} does not fit this policy: missing {missing[:3]}, unexpected "
                          f"{unexpected[:3]} (was it saved with another model, LoRA setting or algorithm?)")
    if optimizer is not None:
        if not any(k.startswith("optim.") for k in stored):
            raise PolicyError(f"{path} holds no optimizer state; resume needs one")
        target["optim"] = get_optimizer_state_dict(bundle, optimizer)
    try:
        dcp.load(target, checkpoint_id=path / DCP_DIR)
    except Exception as exc:  # a tensor of another shape, an optimiser of another kind
        raise PolicyError(f"checkpoint {path} does not fit this policy or optimizer: {exc}") from exc
    set_model_state_dict(bundle, target["model"], options=StateDictOptions(strict=False))
    if optimizer is not None:
        set_optimizer_state_dict(bundle, optimizer, target["optim"])


def _load_legacy(path: Path, policy, optimizer: torch.optim.Optimizer | None) -> None:
    if policy is not None:
        device = getattr(policy, "device", "cpu")
        policy.load_state_dict(torch.load(path / LEGACY_MODEL, map_location=device, weights_only=True))
    if optimizer is not None:
        opt_file = path / LEGACY_OPTIMIZER
        if not opt_file.is_file():
            raise PolicyError(f"{path} holds no {LEGACY_OPTIMIZER}; resume needs one")
        if _dist() is not None:
            raise PolicyError(f"{path} is an older single-file checkpoint: its optimiser state cannot be loaded into "
                              "sharded ranks; resume it once in one process (without torchrun), which saves the "
                              "sharded format, then resume on N ranks")
        optimizer.load_state_dict(torch.load(opt_file, map_location="cpu", weights_only=True))
