"""Rope scaling (YaRN): one setting that stretches a model's positions, applied the same way everywhere.

A Qwen3 checkpoint covers ``max_position_embeddings`` positions (40,960 for Qwen3-8B and Qwen3-30B-A3B, trained
natively on 32,768); a longer context needs YaRN, and the trainer's model, every vLLM engine and every model folder
written for them must scale the same way, or the engine samples under one position encoding and the trainer scores
under another. :class:`RopeScaling` is that one setting (``policy.rope_scaling`` of a train config):

* :meth:`RopeScaling.apply` sets it on a transformers config (before the model is built, so the rotary embedding
  is computed from it); a folder saved from that config carries it in its ``config.json``;
* :meth:`RopeScaling.overrides` is the same change as the config keys a vLLM engine takes (``--hf-overrides``);
* both set ``rope_parameters`` = ``{rope_type: yarn, factor, original_max_position_embeddings, rope_theta}`` and
  ``max_position_embeddings`` = ``factor × original_max_position_embeddings`` (transformers 5 and vLLM 0.32 read
  a YaRN config's ``max_position_embeddings`` as the scaled length and never multiply it by ``factor`` again).

Invariants: :func:`positions` of a config (a ``config.json`` mapping or a transformers config) is its
``max_position_embeddings``, the longest context trainer and engine accept; after :meth:`RopeScaling.apply` it is
:attr:`RopeScaling.positions`. :func:`context_fix` is the exact YAML that makes a context fit. This module imports
neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

from clawgym_env.errors import ConfigError
from clawgym_env.jsontypes import JSONObject

DEFAULT_ROPE_THETA = 10000.0
"""transformers' RoPE base when a config names none"""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """YaRN rope scaling: ``positions = factor × original_max_position_embeddings`` (see the module docstring)."""

    factor: float
    """how much YaRN stretches the positions the model was trained on (> 1), e.g. ``2.0`` for 64K on Qwen3"""
    original_max_position_embeddings: int
    """the context length the model was pretrained on (Qwen3: 32768, as its model card says; at most its
    ``config.json`` ``max_position_embeddings``)"""
    type: Literal["yarn"] = "yarn"
    """the scaling method; ``yarn`` (what Qwen3 documents, and what both transformers and vLLM implement)"""

    def __post_init__(self) -> None:
        if self.type != "yarn":
            raise ConfigError(f"rope_scaling.type {self.type!r} is not supported; use yarn")
        if not (isinstance(self.factor, (int, float)) and math.isfinite(self.factor) and self.factor > 1.0):
            raise ConfigError(f"rope_scaling.factor must be a number > 1 (e.g. 2.0 for twice the original length), "
                              f"got {self.factor!r}")
        if int(self.original_max_position_embeddings) <= 0:
            raise ConfigError("rope_scaling.original_max_position_embeddings must be positive (the model's pretraining "
                              f"length, e.g. 32768), got {self.original_max_position_embeddings!r}")

    @classmethod
    def parse(cls, value: RopeScaling | Mapping[str, Any] | None) -> RopeScaling | None:
        """``value`` as a :class:`RopeScaling` (a mapping with its fields, e.g. a config read back from JSON)."""
        if value is None or isinstance(value, RopeScaling):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"rope_scaling must be a mapping like {{factor: 2.0, original_max_position_embeddings: "
                              f"32768}}, got {value!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown or "factor" not in value or "original_max_position_embeddings" not in value:
            raise ConfigError(f"rope_scaling {dict(value)!r}: give factor and original_max_position_embeddings "
                              f"(optional: type: yarn){f'; unknown keys {unknown}' if unknown else ''}")
        return cls(factor=float(value["factor"]),
                   original_max_position_embeddings=int(value["original_max_position_embeddings"]),
                   type=value.get("type", "yarn"))

    @property
    def positions(self) -> int:
        """The positions the scaled model covers: ``factor × original_max_position_embeddings``."""
        return int(self.factor * int(self.original_max_position_embeddings))

    def rope_parameters(self, rope_theta: float) -> JSONObject:
        """transformers' ``rope_parameters`` for this scaling on a model whose RoPE base is ``rope_theta``."""
        return {"rope_type": self.type, "factor": float(self.factor),
                "original_max_position_embeddings": int(self.original_max_position_embeddings),
                "rope_theta": float(rope_theta)}

    def overrides(self, config: Mapping[str, Any] | Any) -> JSONObject:
        """The config keys this scaling sets on ``config`` (a ``config.json`` mapping or a transformers config):
        ``rope_parameters`` and ``max_position_embeddings`` (what a vLLM engine takes as ``--hf-overrides``)."""
        native = _get(config, "max_position_embeddings")
        if isinstance(native, int) and self.original_max_position_embeddings > native:
            raise ConfigError(f"rope_scaling.original_max_position_embeddings {self.original_max_position_embeddings}"
                              f" is above the model's max_position_embeddings {native}; give the length the model was "
                              "pretrained on (its model card's, or at most max_position_embeddings)")
        return {"rope_parameters": self.rope_parameters(rope_theta(config)),
                "max_position_embeddings": self.positions}

    def apply(self, config: Any) -> Any:
        """Set this scaling on a transformers config in place (before a model is built from it); returns it."""
        for key, value in self.overrides(config).items():
            setattr(config, key, value)
        return config


def _get(config: Mapping[str, Any] | Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def rope_theta(config: Mapping[str, Any] | Any) -> float:
    """The RoPE base of ``config``: ``rope_parameters.rope_theta`` (transformers 5), else ``rope_theta``, else
    transformers' default."""
    params = _get(config, "rope_parameters")
    if isinstance(params, Mapping) and params.get("rope_theta") is not None:
        return float(params["rope_theta"])
    theta = _get(config, "rope_theta")
    return float(theta) if theta is not None else DEFAULT_ROPE_THETA


def positions(config: Mapping[str, Any] | Any) -> int:
    """The longest context ``config`` covers: its ``max_position_embeddings`` (a ConfigError when it has none)."""
    value = _get(config, "max_position_embeddings")
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"the model config has no positive max_position_embeddings ({value!r}); cannot tell the "
                          "longest context it covers")
    return value


def scaling_of(config: Mapping[str, Any] | Any) -> RopeScaling | None:
    """The YaRN scaling ``config`` already carries (``rope_parameters`` or the older ``rope_scaling``), or None."""
    for key in ("rope_parameters", "rope_scaling"):
        params = _get(config, key)
        if isinstance(params, Mapping) and (params.get("rope_type") or params.get("type")) == "yarn":
            if params.get("factor") is None or params.get("original_max_position_embeddings") is None:
                return None
            return RopeScaling(factor=float(params["factor"]),
                               original_max_position_embeddings=int(params["original_max_position_embeddings"]))
    return None


def context_fix(needed: int, native: int, where: str = "policy.rope_scaling") -> str:
    """The YAML that makes a context of ``needed`` tokens fit a model of ``native`` positions: YaRN over the native
    length with the smallest factor (two decimals) that covers ``needed``."""
    factor = math.ceil(needed / native * 100) / 100
    while int(factor * native) < needed:  # float rounding
        factor = round(factor + 0.01, 2)
    section, _, key = where.rpartition(".")
    indent = "  " * len(section.split(".")) if section else ""
    head = "".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(section.split("."))) if section else ""
    return (f"{head}{indent}{key}: {{type: yarn, factor: {factor:g}, original_max_position_embeddings: {native}}}"
            f"  # {int(factor * native)} positions")
