"""LoRA adapter-only weight sync: what a vLLM engine needs when only the adapters change.

Under ``policy.lora_rank > 0`` the base weights are frozen, so an engine can serve them once (the ``v0`` folder:
:func:`base_weights`, the base *without* any adapter merged in) and hot-load each new adapter version
(:func:`write_adapter_dir`: peft's save format, ``adapter_config.json`` + ``adapter_model.safetensors``) instead of
re-reading the whole merged model: megabytes per sync instead of the model's size, and no in-place reload (so a tied
embedding, which vLLM 0.32 cannot reload in place, is no obstacle).

Invariants: base weight + the adapter's ``scale·B@A`` on every targeted module equals the merged weights the
trainer's :meth:`~trainers.policy.TrainablePolicy.serving_state_dict` gives; the adapter tensors are named as
``PeftModel.save_pretrained`` names them (``base_model.model.<module>.lora_A.weight``), so peft and vLLM both load
the folder; under FSDP they are collectives every rank calls (:func:`base_weights` gathers the model once, for
``v0``; :func:`adapter_tensors` gathers only the adapters, every sync; rank 0 gets the tensors, the other ranks ``{}``
and write nothing). :func:`adapter_problem` names every adapter vLLM cannot serve as such
(DoRA, LoRA bias, embedding adapters, adapters on fused MoE expert parameters, a rank above 512).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawgym_env.errors import PolicyError
from clawgym_env.policy.vllm.admin import LORA_RANKS

if TYPE_CHECKING:
    import torch

ADAPTER = "default"
"""The adapter name peft gives the trained adapter (dropped from the saved names)."""


def _plain(key: str) -> str:
    return ".".join(part for part in key.split(".") if part != "base_layer")


def adapter_problem(policy: Any) -> str | None:
    """Why ``policy``'s adapters cannot be hot-loaded into vLLM (None when they can)."""
    if not getattr(policy, "lora", False):
        return "the policy trains all weights (policy.lora_rank is 0); there is no adapter to sync"
    config = policy.module.peft_config[ADAPTER]
    if int(config.r) > LORA_RANKS[-1]:
        return f"policy.lora_rank {config.r} is above the largest rank vLLM serves ({LORA_RANKS[-1]})"
    if getattr(config, "use_dora", False) or getattr(config, "lora_bias", False):
        return "DoRA and LoRA biases are not served by vLLM's LoRA layers"
    if getattr(config, "target_parameters", None) or config.rank_pattern or config.alpha_pattern:
        return ("adapters on raw parameters (fused MoE experts) or per-module rank/alpha patterns are not served by "
                "vLLM's LoRA layers")
    from peft.tuners.lora import LoraLayer

    for name, layer in policy.causal_lm.named_modules():
        if not isinstance(layer, LoraLayer):
            continue
        if getattr(layer, "lora_embedding_A", {}).get(ADAPTER) is not None:
            return f"{name}: LoRA on embeddings is not served by vLLM 0.32's runtime adapters"
        if ".experts" in name or type(layer).__name__ == "ParamWrapper":
            return f"{name}: LoRA on fused MoE experts is not served by vLLM's CPU engine"
    return None


def base_weights(policy: Any) -> dict[str, torch.Tensor]:
    """The frozen base of a LoRA policy under the plain model names (no adapter merged in; a collective when
    sharded: rank 0 gets the tensors on its CPU, the other ranks ``{}``)."""
    from trainers.policy import full_state_dict

    state = full_state_dict(policy.causal_lm, rank0_only=bool(getattr(policy, "sharded", False)))
    return {_plain(k): v.detach() for k, v in state.items() if ".lora_" not in k}


def adapter_tensors(policy: Any, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The adapters under the names ``PeftModel.save_pretrained`` writes, floating point in ``dtype`` (None: kept),
    on the CPU. Sharded: each adapter parameter is gathered in turn (a collective every rank calls, adapters only,
    never the base); rank 0 gets the tensors, the other ranks ``{}``."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    marker = f".{ADAPTER}."
    out = {}
    for key, param in policy.causal_lm.named_parameters():
        if ".lora_" not in key:
            continue
        if marker not in key:
            raise PolicyError(f"adapter parameter {key} is not of the adapter {ADAPTER!r}; only one adapter is synced")
        tensor = param.detach()
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if rank != 0:
            continue
        tensor = tensor.to("cpu")
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        out["base_model.model." + _plain(key.replace(marker, "."))] = tensor.contiguous()
    return out


def write_adapter_dir(policy: Any, out: str | Path, *, dtype: torch.dtype | None = None) -> Path | None:
    """``policy``'s adapters as a peft adapter folder ``out`` (loadable by ``PeftModel.from_pretrained`` and vLLM's
    ``/v1/load_lora_adapter``); a collective when sharded, rank 0 writes and gets the path, the others None."""
    from safetensors.torch import save_file

    tensors = adapter_tensors(policy, dtype)
    if not tensors:
        return None  # another rank of a sharded policy
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = policy.module.peft_config[ADAPTER].to_dict()
    config["inference_mode"] = True
    for key, value in list(config.items()):
        if isinstance(value, set):
            config[key] = sorted(value)
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    return out
