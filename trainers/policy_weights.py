"""Full tensors and LoRA merging of a policy's module, sharded (FSDP2 DTensors) or not.

Invariants: :func:`full_state_dict` returns whole tensors (gathered on every rank, or rank 0 only, when
sharded: a collective every rank calls); :func:`merge_lora` computes ``W + scale·B@A`` (per expert for fused MoE
experts) from those full tensors and returns the plain model's names, never through peft's in-place merge.
"""

from __future__ import annotations

from typing import Any

import torch

from clawgym_env.errors import ConfigError, PolicyError


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether any parameter of ``module`` is a DTensor (FSDP2 ``fully_shard``)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def full_state_dict(module: torch.nn.Module, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with full tensors: gathered on every rank when sharded (a collective), or with
    ``rank0_only`` on rank 0's CPU only (the other ranks get ``{}``)."""
    if not is_sharded(module):
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
    full: dict[str, Any] = get_model_state_dict(module, options=options)
    return full


def _plain_name(key: str) -> str:
    return ".".join(part for part in key.split(".") if part != "base_layer")


def _tied_names(model) -> set[str]:
    keys = getattr(model, "_tied_weights_keys", None) or {}
    return set(keys) if not isinstance(keys, dict) else set(keys)


def lora_delta(layer, adapter: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The weight delta of one peft LoRA layer from full ``lora_A``/``lora_B`` weights: ``scale·B@A``
    (transposed under ``fan_in_fan_out``) for a linear layer; per expert for a fused 3-D experts parameter
    (peft's ``ParamWrapper``: A is [experts·r, in], B is [out, r·experts])."""
    if getattr(layer, "use_dora", {}).get(adapter) or getattr(layer, "lora_bias", {}).get(adapter):
        raise ConfigError("merging DoRA or LoRA-bias adapters is not supported; train plain LoRA")
    scale = float(layer.scaling[adapter])
    experts = int(getattr(layer, "num_experts", 1))
    a, b = a.float(), b.float()
    if hasattr(layer, "parameter_name") and experts > 1:
        a3 = a.reshape(experts, -1, a.shape[-1])  # experts x r x in
        b3 = b.reshape(b.shape[0], -1, experts)  # out x r x experts
        swapped = getattr(layer, "_did_swap_in_out_features", False)
        return torch.einsum("ore,eri->eoi" if swapped else "ore,eri->eio", b3, a3) * scale
    delta = (b @ a) * scale
    return delta.T if getattr(layer, "fan_in_fan_out", False) else delta


def merge_lora(state: dict[str, torch.Tensor], causal_lm) -> dict[str, torch.Tensor]:
    """``causal_lm``'s full state dict (peft names) → plain names with every active adapter merged in.

    The result has the base model's names and shapes (``.base_layer`` dropped, ``lora_*`` gone); for
    a LoRA on a parameter (fused MoE experts) the merged key is the wrapped parameter's own name."""
    from peft.tuners.lora import LoraLayer

    out = {_plain_name(k): v.detach().clone() for k, v in state.items() if ".lora_" not in k}
    for name, layer in causal_lm.named_modules():
        if not isinstance(layer, LoraLayer) or layer.merged:
            continue
        for adapter in layer.active_adapters:
            if adapter in getattr(layer, "lora_embedding_A", {}):
                raise ConfigError(f"{name}: LoRA on embeddings cannot be merged here; drop it from lora_targets")
            if adapter not in layer.lora_A:
                continue
            key = f"{_plain_name(name)}.{getattr(layer, 'parameter_name', 'weight')}"
            if key not in out:
                raise PolicyError(f"LoRA layer {name} adapts {key}, which the model does not have")
            delta = lora_delta(layer, adapter, state[f"{name}.lora_A.{adapter}.weight"],
                               state[f"{name}.lora_B.{adapter}.weight"])
            out[key] = (out[key].float() + delta.to(out[key].device)).to(out[key].dtype)
    return out


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
