"""``clawgym train --check-config``: a config checked against its model and harnesses, nothing trained or written.

What is checked (each failure a :class:`~clawgym_env.errors.ConfigError` that names the fix):

* the config itself: every key and type (:func:`trainers.config_doc.validate`, done by the caller);
* every harness adapter of the run is built with its options (a bad option fails here);
* the pack limit holds one whole call (``max_pack_tokens`` >= ``max_context_tokens``);
* **the context fits the model's positions**: ``max_context_tokens`` and ``scale.generation.max_model_len`` are at
  most the positions of ``policy.model`` — its ``config.json`` ``max_position_embeddings`` (a ``tiny*`` model: its
  own config), or with ``policy.rope_scaling`` the YaRN length ``factor × original_max_position_embeddings``
  (:mod:`clawgym_env.policy.rope`). Past them the trainer would run positions unscaled and vLLM refuses the length;
  the error gives the exact YAML to add;
* ``scale.generation.sleep: true`` only where the vLLM engines run on a GPU (vLLM's sleep mode needs its CUDA memory
  pool; the CPU engine refuses it); ``scale.generation.sync: lora`` only with ``policy.lora_rank`` > 0 (at most 512)
  and no embedding in ``policy.lora_targets``.

Only ``config.json`` is read from a model folder (no weights, no tokenizer), so a recipe can be checked on a machine
without the model's weights. ``clawgym train`` runs :func:`check_context` too, before anything is loaded.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clawgym_env.errors import ConfigError
from clawgym_env.policy.rope import RopeScaling, context_fix, positions, scaling_of


@dataclasses.dataclass(frozen=True)
class ContextCheck:
    """The outcome of :func:`check_context`: the model's positions and the longest context the config asks for."""

    model: str
    """``policy.model``"""
    native_positions: int
    """the model config's own ``max_position_embeddings`` (before ``policy.rope_scaling``)"""
    positions: int
    """the positions trainer and engine use (``policy.rope_scaling`` applied)"""
    scaling: RopeScaling | None
    """the YaRN scaling in effect (``policy.rope_scaling``, else one the model's config carries)"""
    context: dict[str, int]
    """each context length the config sets (``max_context_tokens``, ``scale.generation.max_model_len``)"""

    def describe(self) -> str:
        """One line for ``--check-config``."""
        how = (f"YaRN factor {self.scaling.factor:g} over {self.scaling.original_max_position_embeddings}"
               if self.scaling else "no rope scaling")
        asked = ", ".join(f"{k} {v}" for k, v in self.context.items())
        return f"context: {asked} <= {self.positions} positions of {self.model} ({how})"


def context_lengths(args: Any) -> dict[str, int]:
    """The context lengths ``args`` sets: ``max_context_tokens`` and, when vLLM generates, the engines'
    ``scale.generation.max_model_len`` (its default is ``max_context_tokens``)."""
    lengths: dict[str, int] = {}
    if getattr(args, "max_context_tokens", None) is not None:
        lengths["max_context_tokens"] = int(args.max_context_tokens)
    generation = getattr(getattr(args, "scale", None), "generation", None)
    if generation is not None and getattr(generation, "backend", None) == "vllm" and generation.max_model_len:
        lengths["scale.generation.max_model_len"] = int(generation.max_model_len)
    return lengths


def check_context(args: Any) -> ContextCheck | None:
    """Refuse a context above the model's positions (see the module docstring); None when ``args`` has no
    ``policy`` or sets no context length."""
    from trainers.policy import model_config

    policy = getattr(args, "policy", None)
    lengths = context_lengths(args)
    if policy is None or not lengths:
        return None
    native_config = model_config(dataclasses.replace(policy, rope_scaling=None))
    if getattr(native_config, "max_position_embeddings", None) is None and policy.rope_scaling is None:
        return None  # a config that states no positions: nothing to check against (the engine decides)
    stated = getattr(native_config, "max_position_embeddings", None)
    native = positions(native_config) if stated is not None else policy.rope_scaling.original_max_position_embeddings
    scaled = positions(model_config(policy)) if policy.rope_scaling is not None else native
    scaling = policy.rope_scaling or scaling_of(native_config)
    key, needed = max(lengths.items(), key=lambda kv: kv[1])
    if needed > scaled:
        if policy.rope_scaling is None:
            raise ConfigError(
                f"{key} {needed} is above the {native} positions of {policy.model} (its max_position_embeddings"
                f"{'' if scaling is None else ', with the YaRN its config carries'}): the trainer would run the "
                "positions past it unscaled and vLLM refuses the length. Add YaRN rope scaling to the config "
                "(applied to the trainer, the vLLM engines and every model folder written):\n"
                f"{context_fix(needed, native)}\n"
                "(give the model card's pretraining length as original_max_position_embeddings when it names one, "
                f"e.g. Qwen3: 32768 with factor 2.0 for 65536), or lower {key} to {native}")
        factor = policy.rope_scaling.original_max_position_embeddings
        raise ConfigError(
            f"{key} {needed} is above the {scaled} positions policy.rope_scaling gives {policy.model} (factor "
            f"{policy.rope_scaling.factor:g} x original_max_position_embeddings {factor}); raise the factor:\n"
            f"{context_fix(needed, factor)}\nor lower {key} to {scaled}")
    return ContextCheck(model=policy.model, native_positions=native, positions=scaled, scaling=scaling,
                        context=lengths)


def check_config(args: Any) -> list[str]:
    """Every check of the module docstring on validated ``args``; the lines to print (raises on the first failure)."""
    from trainers.ranks import check_context as check_pack

    lines = []
    if hasattr(args, "harness_adapters"):
        built = args.harness_adapters()
        lines.append(f"harnesses: {', '.join(sorted(built)) or 'none'} built with their options")
    if getattr(args, "max_context_tokens", None) is not None and hasattr(args, "max_pack_tokens"):
        check_pack(int(args.max_context_tokens), args.max_pack_tokens)
        lines.append(f"packs: max_pack_tokens {args.max_pack_tokens} holds a call of max_context_tokens "
                     f"{args.max_context_tokens}")
    result = check_context(args)
    if result is not None:
        lines.append(result.describe())
    generation = getattr(getattr(args, "scale", None), "generation", None)
    if generation is not None:
        from trainers.rollouts.generation import check_lora_sync, check_sleep

        for line in (check_sleep(generation),  # sleep: true needs GPU engines
                     check_lora_sync(generation, getattr(args, "policy", None))):  # sync: lora needs servable LoRA
            if line:
                lines.append(line)
    return lines
