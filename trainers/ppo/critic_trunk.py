"""The trunk of a ``critic: lora`` value model: the policy's frozen base weights under the critic's OWN LoRA adapters.

:func:`base_trunk` builds a plain trunk of the policy's architecture (the base model under the LM head, no LoRA
layers) whose parameters and buffers are the policy's base weights — the very same tensors (``share=True``: no
copy, one process) or frozen copies (``share=False``: a process group, where the critic is its own FSDP root and
FSDP2 cannot shard one tensor under two roots). :func:`add_adapters` then injects LoRA adapters named
``critic`` into that trunk.

Invariants:

* the trunk's module objects are its own: the policy's LoRA layers (and its ``disable_adapter()`` switch) are not
  in it, and the critic's LoRA layers are not in the policy, so neither set of adapters enters the other's forward;
* every base tensor of the trunk is frozen (``requires_grad`` False); the only trainable parameters after
  :func:`add_adapters` are the critic's ``lora_A``/``lora_B``;
* with ``share=True`` no base weight is copied: the critic costs its adapters, its head and its activations;
* the same seed gives the same adapters in every process (data-parallel ranks agree).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from clawgym_env.errors import ConfigError, PolicyError

ADAPTER = "critic"


def _plain(name: str) -> str:
    """A peft-wrapped name → the plain model's (``.base_layer`` dropped)."""
    return ".".join(part for part in name.split(".") if part != "base_layer")


def _trunk(model) -> nn.Module:
    base = getattr(model, "model", None)
    if isinstance(base, nn.Module):
        return base
    if hasattr(model, "embed_tokens") and hasattr(model, "layers"):
        return model
    raise PolicyError(f"{type(model).__name__} has no trunk (.model) to put a value model on")


def _set(module: nn.Module, name: str, value: torch.Tensor, *, buffer: bool) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if buffer:
        owner._buffers[leaf] = value
    else:
        owner._parameters[leaf] = value  # type: ignore[assignment]  # a Parameter


def base_trunk(causal_lm, *, share: bool) -> Any:
    """A plain trunk of ``causal_lm``'s architecture holding its BASE weights (LoRA adapters left out): the same
    tensors when ``share`` (they must already be frozen: a trunk being trained cannot be shared), else frozen
    copies. The trunk keeps ``causal_lm``'s attention implementation."""
    from transformers import AutoModel

    source = _trunk(causal_lm)
    config: Any = copy.deepcopy(source.config)  # a transformers config (dynamically typed)
    params = {_plain(n): p for n, p in source.named_parameters(remove_duplicate=False) if ".lora_" not in n}
    buffers = {_plain(n): b for n, b in source.named_buffers(remove_duplicate=False) if ".lora_" not in n}
    if share and any(p.requires_grad for p in params.values()):
        raise ConfigError("critic: lora shares the policy's frozen base, but the policy trains its trunk (a full "
                          "fine-tune); set policy.lora_rank > 0, or let the critic take a frozen copy")
    with torch.device("meta"):  # a skeleton: every tensor is replaced below
        trunk = AutoModel.from_config(config, attn_implementation=config._attn_implementation)
    for name, _ in list(trunk.named_parameters(remove_duplicate=False)):
        if name not in params:
            raise PolicyError(f"the policy has no base weight {name!r} for the critic's trunk")
        p = params[name]
        _set(trunk, name, p if share else nn.Parameter(p.detach().clone(), requires_grad=False), buffer=False)
    for name, _ in list(trunk.named_buffers(remove_duplicate=False)):
        if name not in buffers:
            raise PolicyError(f"the policy has no buffer {name!r} for the critic's trunk")
        _set(trunk, name, buffers[name] if share else buffers[name].clone(), buffer=True)
    trunk.requires_grad_(False)
    return trunk


def add_adapters(trunk: Any, *, rank: int, alpha: float, dropout: float, targets: Sequence[str],
                 seed: int) -> Any:
    """Inject LoRA adapters named ``critic`` (``rank``, ``alpha``, ``dropout`` on the ``targets`` modules) into
    ``trunk`` in place, seeded by ``seed`` (the global RNG untouched); only they are trainable afterwards."""
    if rank <= 0:
        raise ConfigError(f"critic: lora needs a LoRA rank > 0 (critic_lora_rank or policy.lora_rank), got {rank}")
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as exc:
        raise PolicyError("critic: lora needs peft: pip install peft (or the dev extras)") from exc
    cfg = LoraConfig(r=int(rank), lora_alpha=alpha, lora_dropout=dropout,  # type: ignore[arg-type]
                     target_modules=list(targets))
    device = next(trunk.parameters()).device
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(int(seed))
        inject_adapter_in_model(cfg, trunk, adapter_name=ADAPTER)
    trainable = [n for n, p in trunk.named_parameters() if p.requires_grad]
    if not trainable or any(f".lora_A.{ADAPTER}." not in n and f".lora_B.{ADAPTER}." not in n for n in trainable):
        raise PolicyError(f"the critic's LoRA left other trainable parameters than its adapters: {trainable[:3]}")
    return trunk


def full_copy_bytes(causal_lm) -> int:
    """Bytes a full trainable copy of ``causal_lm``'s trunk needs under AdamW: weights, gradients and the two
    moments, each in the trunk's dtype (4 × parameters × element size), before any sharding."""
    return sum(4 * p.numel() * p.element_size() for n, p in _trunk(causal_lm).named_parameters()
               if ".lora_" not in n)
