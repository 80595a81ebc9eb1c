"""Sharded start-up that never puts the whole model on a rank's accelerator: meta skeleton, shard, load from rank 0.

Under N ranks, loading the model on every rank and then sharding it costs each GPU the full model at start-up
(Qwen3-30B-A3B in fp32: ~122 GB, an OOM on 80 GB cards) and the host N copies while N processes read the
checkpoint. :func:`sharded_start` does what FSDP2 users do instead:

1. every rank builds the policy's *skeleton* on the meta device (shapes, no storage; LoRA adapters included);
2. rank 0 alone loads the real weights into host memory (one copy for the whole node) and builds the policy
   around them on the CPU (the same seed gives the same LoRA initialisation);
3. every rank shards its skeleton (:func:`trainers.scale.fsdp.shard_policy`), allocates only its own shards on
   its device (``to_empty``) and receives them from rank 0
   (``set_model_state_dict(..., broadcast_from_rank0=True)``); the buffers that are not in a state dict
   (rotary ``inv_freq``) are broadcast as objects;
4. a full fine-tune's KL reference is built the same way and sharded too (never an unsharded copy per rank);
5. rank 0's host copy then becomes its in-process serving copy (``serve_in_process``) or is dropped.

Invariants: after :func:`sharded_start` every rank's parameters are exactly the shards of the weights rank 0
loaded (what :class:`~trainers.policy.TrainablePolicy` + ``shard_policy`` would have given); the parameter
memory a rank holds on its device is its shards only, ~1/N of the model (:func:`local_parameter_numel`); no
rank but 0 ever holds a full weight tensor; without a process group nothing here is used.
"""

from __future__ import annotations

import dataclasses

import torch

from trainers.policy import PolicyConfig, TrainablePolicy, load_causal_lm, tokenizer_for
from trainers.scale.fsdp import DistConfig, DistInfo, broadcast_object, shard_model, shard_policy


@dataclasses.dataclass
class ShardedStart:
    """What :func:`sharded_start` built on this rank."""

    policy: TrainablePolicy
    """the sharded policy (its KL reference set when asked for, sharded too)"""
    host_copy: TrainablePolicy | None
    """rank 0's full policy in host memory when ``serve_in_process`` (to serve from), else None"""


def local_parameter_numel(module: torch.nn.Module) -> int:
    """Elements of ``module``'s parameters stored on this rank: each DTensor's local shard, other tensors whole
    (tied parameters counted once)."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        local = getattr(p, "to_local", None)
        total += (local() if local is not None else p).numel()
    return total


def _load_from_rank0(module: torch.nn.Module, full: torch.nn.Module | None, device: torch.device, rank: int) -> None:
    """Allocate ``module``'s (sharded) storage on ``device`` and fill it with rank 0's ``full`` weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    module.to_empty(device=device)
    state = full.state_dict() if rank == 0 and full is not None else {}
    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    persistent = set(module.state_dict())
    loose = {n: b.detach().cpu() for n, b in full.named_buffers() if n not in persistent} \
        if rank == 0 and full is not None else None
    loose = broadcast_object(loose)
    buffers = dict(module.named_buffers())
    with torch.no_grad():
        for name, value in (loose or {}).items():
            if name in buffers:
                buffers[name].copy_(value.to(buffers[name].device))


def sharded_start(config: PolicyConfig, dist: DistConfig, info: DistInfo, *, reference: bool = False,
                  serve_in_process: bool = True) -> ShardedStart:
    """Build the policy sharded over the ranks of ``info`` (see the module doc); every rank calls it."""
    tokenizer = tokenizer_for(config)
    rank0 = info.rank == 0
    host = None
    if rank0:  # the one full copy: host memory of rank 0
        host = TrainablePolicy(dataclasses.replace(config, device="cpu"), tokenizer=tokenizer)
    policy = TrainablePolicy(config, tokenizer=tokenizer, model=load_causal_lm(config, tokenizer, meta=True))
    shard_policy(policy, dist)
    _load_from_rank0(policy.module, host.module if host is not None else None, policy.device, info.rank)
    if reference and not policy.lora:
        ref = load_causal_lm(config, tokenizer, meta=True)
        ref.requires_grad_(False)
        shard_model(ref, mixed_precision=dist.mixed_precision, reshard_after_forward=dist.reshard_after_forward)
        _load_from_rank0(ref, host.causal_lm if host is not None else None, policy.device, info.rank)
        policy.set_reference(ref)
    policy.module.train()
    return ShardedStart(policy=policy, host_copy=host if serve_in_process else None)

