"""The serving layout: the trainer's state dict as a checkpoint of the model has it on disk, in the serving dtype.

A serving engine (vLLM) loads a model folder, and takes broadcast weights, under the names and shapes of the
model's Hugging Face checkpoint: what ``save_pretrained`` writes. Transformers 5 trains some architectures in
another layout: a Qwen3-MoE layer keeps its experts fused, ``mlp.experts.gate_up_proj`` [E, 2I, H] and
``mlp.experts.down_proj`` [E, H, I], where its checkpoint has ``mlp.experts.<e>.gate_proj.weight`` [I, H],
``mlp.experts.<e>.up_proj.weight`` [I, H] and ``mlp.experts.<e>.down_proj.weight`` [H, I] (transformers'
checkpoint conversion: the per-expert tensors stacked along a new dim 0, gate and up concatenated along dim 1,
no transpose; its forward splits ``gate_up_proj[e] @ x`` into gate, then up).

:data:`LAYOUTS` is the one table of these conversions, a row per ``config.model_type`` trained: dense
architectures keep their names (an empty row); each :class:`FusedExperts` entry names a fused expert parameter
and the per-expert tensors it is split into. :func:`to_serving` converts trainer names to serving names (and the
floating-point tensors to a serving dtype), :func:`to_trainer` converts back.

Invariants: ``to_trainer(to_serving(s, t), t) == s`` exactly (same names, order and values) when no dtype is
given; a dense architecture's tensors pass through unchanged (the same objects, dtype aside); a 3-D ``experts``
tensor of an architecture without a row is a :class:`ConfigError` (served under the trainer's names it would
load no experts); the split tensors own their storage (a safetensors file refuses tensors sharing memory).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from clawgym_env.errors import ConfigError, PolicyError

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass(frozen=True)
class FusedExperts:
    """One fused expert parameter of the trainer (``<prefix>.experts.<fused>``, [E, rows, cols]) and the
    per-expert checkpoint tensors (``<prefix>.experts.<e>.<part>``) it is the concatenation of along its rows."""

    fused: str
    """the fused parameter's name after ``experts.`` (e.g. ``gate_up_proj``)"""
    parts: tuple[str, ...]
    """each expert's checkpoint tensors after ``experts.<e>.``, in the order they are concatenated"""


QWEN_MOE_EXPERTS = (FusedExperts("gate_up_proj", ("gate_proj.weight", "up_proj.weight")),
                    FusedExperts("down_proj", ("down_proj.weight",)))

LAYOUTS: dict[str, tuple[FusedExperts, ...]] = {
    "qwen3": (),
    "qwen2": (),
    "llama": (),
    "qwen3_moe": QWEN_MOE_EXPERTS,
    "qwen2_moe": QWEN_MOE_EXPERTS,
}
"""``config.model_type`` → its fused expert parameters (empty: the trainer's names are the checkpoint's)"""

EXPERTS = ".experts."
SERVING_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                  "half": "float16", "float32": "float32", "fp32": "float32", "float": "float32"}
"""the dtype names a serving dtype (or an engine's ``--dtype``) may be given by → the canonical name"""
DEFAULT_SERVING_DTYPE = "bfloat16"


def layout_of(model_type: str, state: Mapping[str, torch.Tensor] | None = None) -> tuple[FusedExperts, ...]:
    """The :data:`LAYOUTS` row of ``model_type``; an architecture without one is served under the trainer's names
    unless ``state`` has a fused (3-D) ``experts`` tensor: then :class:`ConfigError` (it would load no experts)."""
    row = LAYOUTS.get(model_type)
    if row is not None:
        return row
    fused = next((k for k, v in (state or {}).items() if EXPERTS in k and v.dim() == 3), None)
    if fused is not None:
        raise ConfigError(f"model_type {model_type!r} trains fused experts ({fused}) but has no serving layout: "
                          "add its row (fused name -> per-expert checkpoint names) to LAYOUTS in "
                          "trainers.scale.serving_names, so engines load its experts")
    return ()


def dtype_name(name: str, field: str = "serving_dtype") -> str:
    """The canonical name (``bfloat16``, ``float16``, ``float32``) of a serving dtype; ``ValueError`` (naming
    ``field``) otherwise."""
    canonical = SERVING_DTYPES.get(str(name).removeprefix("torch."))
    if canonical is None:
        raise ValueError(f"{field} {name!r} is not one of bfloat16, float16, float32")
    return canonical


def serving_dtype(requested: str | None, engine: str = "auto") -> str:
    """The dtype weights are served in and engines run in: ``requested``, else the engines' ``engine`` dtype
    when it names one, else bfloat16. Both named and different: ``ValueError`` (the engine would cast them)."""
    named_engine = None if engine in ("auto", "", None) else dtype_name(engine, "the engines' dtype")
    if requested is None:
        return named_engine or DEFAULT_SERVING_DTYPE
    wanted = dtype_name(requested)
    if named_engine is not None and named_engine != wanted:
        raise ValueError(f"generation.serving_dtype {requested!r} differs from the engines' dtype {engine!r}; "
                         "set one of them (the engines run in the serving dtype)")
    return wanted


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def to_serving(state: Mapping[str, torch.Tensor], model_type: str, *,
               dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """``state`` (trainer names) under the checkpoint's names, floating-point tensors cast to ``dtype``
    (None: kept); a fused expert tensor is split per expert in place of its name (see the module doc)."""
    row = {f.fused: f for f in layout_of(model_type, state)}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        prefix, _, fused = name.rpartition(EXPERTS)
        spec = row.get(fused) if prefix else None
        if spec is None:
            out[name] = _cast(tensor, dtype)
            continue
        if tensor.dim() != 3 or tensor.shape[1] % len(spec.parts):
            raise PolicyError(f"{name} has shape {tuple(tensor.shape)}; a fused experts tensor [E, rows, cols] with "
                              f"rows a multiple of {len(spec.parts)} was expected")
        for expert in range(tensor.shape[0]):
            for part, piece in zip(spec.parts, tensor[expert].chunk(len(spec.parts), dim=0)):
                cast = _cast(piece, dtype)
                out[f"{prefix}{EXPERTS}{expert}.{part}"] = cast.clone() if cast is piece else cast.contiguous()
    return out


def to_trainer(state: Mapping[str, torch.Tensor], model_type: str) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_serving` (dtypes kept): per-expert checkpoint tensors stacked back into the
    fused parameters, each in the place of its expert 0's first part; a missing expert is a :class:`PolicyError`."""
    row = layout_of(model_type)
    owner = {part: spec for spec in row for part in spec.parts}
    pattern = re.compile(r"^(.*" + re.escape(EXPERTS) + r")(\d+)\.(.+)$")
    groups: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor | None] = {}
    for name, tensor in state.items():
        match = pattern.match(name) if owner else None
        spec = owner.get(match.group(3)) if match else None
        if match is None or spec is None:
            out[name] = tensor
            continue
        fused = match.group(1) + spec.fused
        out.setdefault(fused, None)  # placed where the checkpoint first mentions it
        groups.setdefault(fused, {}).setdefault(int(match.group(2)), {})[match.group(3)] = tensor
    import torch

    for fused, experts in groups.items():
        spec = row[[s.fused for s in row].index(fused.rpartition(EXPERTS)[2])]
        if sorted(experts) != list(range(len(experts))):
            raise PolicyError(f"{fused}: experts {sorted(experts)} are not 0..{len(experts) - 1}")
        rows = []
        for e in range(len(experts)):
            missing = [p for p in spec.parts if p not in experts[e]]
            if missing:
                raise PolicyError(f"{fused}: expert {e} lacks {missing}")
            rows.append(torch.cat([experts[e][p] for p in spec.parts], dim=0))
        out[fused] = torch.stack(rows)
    return {k: v for k, v in out.items() if v is not None}
