"""Data parallelism over N processes: the process group, the few collectives the loops need, FSDP2 sharding.

Launch: ``torchrun --nproc-per-node N -m trainers.train --config F`` (or ``clawgym train --nproc-per-node N``,
which re-executes itself under ``python -m torch.distributed.run``). Without a launcher (``WORLD_SIZE``
unset or 1) nothing here creates a process group and every helper is the identity: one process, as before.

Roles under N ranks: rank 0 alone runs rollouts, evaluation, metrics and progress; a step's groups (or trees,
or episodes) are broadcast (:func:`broadcast_object`) so every rank builds the same packs; each rank trains on
its share (:func:`balance`: greedy largest-first by packed tokens) and the gradients are summed over ranks.

FSDP2 (:func:`shard_model`): ``fully_shard`` on every decoder block, then on the root module; parameters become
DTensors sharded on dim 0 (the optimiser is built after sharding and holds only the shards). Invariants:

* gradients are SUMMED over ranks (every FSDP module's divide factor is 1): a trainer scales each pack's loss
  by global normalisers (computed from the whole step, which every rank knows), so the summed gradient is the
  single-process one;
* every rank runs the same sequence of FSDP collectives: a trainer runs the same number of forwards (and
  backwards) on every rank per minibatch, a rank short of packs running a zero-weight forward
  (:func:`slots`), and each pack is scored by ONE trunk forward (:func:`one_forward_form`; the prefix-cache
  form runs one forward per tree segment, a count that differs between packs, and FSDP issues one
  all-gather per block forward);
* the scoring code (trunk, LM head, value head) runs inside the root's FSDP forward (:func:`fsdp_forward`),
  so the root's parameters (embeddings, tied LM head, final norm) are gathered while it runs and their
  gradients are reduced by FSDP's own post-backward;
* unused parameters reduce zero gradients, so ranks never disagree on what is reduced.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import types
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from clawgym_env.errors import ConfigError, PolicyError

T = TypeVar("T")
FORWARD_METHOD = "fsdp_scoring_forward"
"""The method :func:`shard_model` registers on a root as an FSDP forward (see :func:`fsdp_forward`)."""
MIXED_PRECISION = ("bfloat16", "float16", "float32")
MP_FLAG = "_fsdp_mixed_precision"  # set on every submodule of a root sharded with mixed precision


@dataclasses.dataclass
class DistConfig:
    """How a run is spread over the ranks of ``torchrun`` (ignored in a single process)."""

    backend: str = "auto"
    """process-group backend: ``auto`` (nccl on CUDA, gloo on CPU), ``nccl`` or ``gloo``"""
    mixed_precision: str | None = None
    """FSDP2 compute dtype of the gathered parameters (``bfloat16``, ``float16``, ``float32``); gradients are
    reduced in float32; ``None``: the parameters' own dtype"""
    reshard_after_forward: bool = True
    """free each block's gathered parameters after its forward and gather them again in backward (ZeRO-3); False
    keeps them until backward (more memory, one all-gather less per block)"""
    timeout_s: float = 1800.0
    """how long a collective may wait for the other ranks before the run fails"""

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ConfigError(f"dist.backend must be auto, nccl or gloo, got {self.backend!r}")
        if self.mixed_precision is not None and self.mixed_precision not in MIXED_PRECISION:
            raise ConfigError(f"dist.mixed_precision must be one of {MIXED_PRECISION} or null, "
                              f"got {self.mixed_precision!r}")


@dataclasses.dataclass(frozen=True)
class DistInfo:
    """Where this process stands: its rank among ``world_size`` and the device it trains on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that runs rollouts, evaluation, metrics and progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one rank (a process group is initialised)."""
        return self.world_size > 1


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _default_device(local_rank: int) -> torch.device:
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def dist_info() -> DistInfo:
    """This process's rank, world size and device (rank 0 of 1 without a process group)."""
    if not _initialized():
        return DistInfo(device=_default_device(0))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return DistInfo(torch.distributed.get_rank(), torch.distributed.get_world_size(), local, _default_device(local))


def init_distributed(backend: str = "auto", timeout_s: float = 1800.0) -> DistInfo:
    """Join the process group ``torchrun`` describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...); a no-op
    returning rank 0 of 1 when ``WORLD_SIZE`` is unset or 1. ``auto``: nccl on CUDA, else gloo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or _initialized():
        return dist_info()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ConfigError("dist.backend nccl needs CUDA; use gloo (or auto) on a CPU machine")
        torch.cuda.set_device(local)
    try:
        torch.distributed.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as exc:
        raise PolicyError(f"could not join the process group ({backend}): {exc}; launch with torchrun "
                          "--nproc-per-node N (it sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)") from exc
    return dist_info()


def destroy_distributed() -> None:
    """Leave the process group (idempotent)."""
    if _initialized():
        torch.distributed.destroy_process_group()


def is_main() -> bool:
    """True on rank 0 and in a single process."""
    return not _initialized() or torch.distributed.get_rank() == 0


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    if _initialized():
        torch.distributed.barrier()


def broadcast_object(obj: T, src: int = 0) -> T:
    """``obj`` of rank ``src`` on every rank (pickled); the identity in a single process."""
    if not _initialized():
        return obj
    box: list[Any] = [obj]
    torch.distributed.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: T) -> list[T]:
    """Every rank's ``obj`` in rank order (``[obj]`` in a single process)."""
    if not _initialized():
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def all_reduce_sums(values: dict[str, float]) -> dict[str, float]:
    """Each key's values summed over the ranks (a key missing on a rank counts 0 there); the identity in one
    process."""
    if not _initialized():
        return dict(values)
    out: dict[str, float] = {}
    for part in all_gather_object({k: float(v) for k, v in values.items()}):
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + v
    return out


def balance(sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Indices of ``sizes`` per rank, greedy largest-first onto the least-loaded rank (ties: the lower rank, then
    the lower index); each rank's indices in ascending order. A rank may get none."""
    loads = [0] * max(1, world_size)
    out: list[list[int]] = [[] for _ in loads]
    for i in sorted(range(len(sizes)), key=lambda k: (-int(sizes[k]), k)):
        r = min(range(len(loads)), key=lambda j: (loads[j], j))
        loads[r] += int(sizes[i])
        out[r].append(i)
    return [sorted(x) for x in out]


def slots(mine: Sequence[int], share: Sequence[Sequence[int]], filler: int) -> list[tuple[int, bool]]:
    """``(index, real)`` for every forward this rank runs: its own ``mine``, then ``filler`` (a zero-weight
    forward, ``real=False``) until it has run as many as the busiest rank of ``share``."""
    n = max((len(s) for s in share), default=0)
    return [(i, True) for i in mine] + [(filler, False)] * (n - len(mine))


# ---- FSDP2 ------------------------------------------------------------------------------------------
def is_sharded(module: Any) -> bool:
    """True when ``module`` was sharded with ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def decoder_blocks(module: nn.Module) -> list[nn.Module]:
    """The decoder blocks of a transformers model (the first ``ModuleList`` named ``layers``, also under a peft
    wrapper or in a bare trunk); ``[]`` when there is none."""
    for name, child in module.named_modules():
        if isinstance(child, nn.ModuleList) and (name == "layers" or name.endswith(".layers")):
            return list(child)
    return []


def _run_scoring(self: nn.Module, fn: Callable[[], Any]) -> Any:
    return fn()


def shard_model(module: nn.Module, *, mixed_precision: str | None = None, reshard_after_forward: bool = True,
                blocks: Sequence[nn.Module] | None = None) -> nn.Module:
    """``fully_shard`` every decoder block (``blocks``, default :func:`decoder_blocks`), then ``module`` itself
    (the root: embeddings, tied LM head, final norm, value head); in place, returns ``module``.

    Gradients are summed over ranks (divide factor 1) and unused parameters reduce zeros (module docstring).
    A no-op without a process group."""
    if not _initialized():
        return module
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    if is_sharded(module):
        raise PolicyError("this module is already sharded")
    mp = MixedPrecisionPolicy()
    if mixed_precision is not None:
        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, mixed_precision), reduce_dtype=torch.float32)
    for block in (decoder_blocks(module) if blocks is None else list(blocks)):
        fully_shard(block, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    setattr(module, FORWARD_METHOD, types.MethodType(_run_scoring, module))
    fully_shard(module, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    register_fsdp_forward_method(module, FORWARD_METHOD)
    for sub in module.modules():
        if mixed_precision is not None:
            sub.__dict__[MP_FLAG] = mixed_precision
        if isinstance(sub, FSDPModule):
            sub.set_gradient_divide_factor(1.0)
            if torch.distributed.get_backend() == "gloo":  # gloo has no PREMUL_SUM: plain sums
                sub.set_force_sum_reduction_for_comms(True)
            sub.set_reduce_scatter_unused_params(True, recurse=False)
    return module


def fsdp_forward(root: Any, fn: Callable[[], T]) -> T:
    """``fn()`` run as a forward of the FSDP root ``root`` (its parameters gathered, its backward hooked), or
    plainly when ``root`` is not sharded (or is None)."""
    runner = getattr(root, FORWARD_METHOD, None) if root is not None else None
    return runner(fn) if runner is not None and is_sharded(root) else fn()


def one_forward_form(model: Any, packed: Any, mask_form: str = "auto") -> str:
    """The mask form of :func:`trainers.batch.logprobs.packed_hidden_states` under FSDP: ``causal`` for a chain, else a
    dense/block tree mask (one trunk forward per pack; module docstring); ``mask_form`` unchanged when ``model``
    is not sharded or a form was chosen. A bool mask under mixed precision (an additive mask would take the
    parameters' dtype, not the compute dtype)."""
    from trainers.batch.logprobs import mask_form_for

    if mask_form != "auto" or not _initialized():
        return mask_form
    if packed.is_chain:
        return "causal"
    form = mask_form_for(model)
    mp = getattr(model, MP_FLAG, None)
    return "bool" if form == "additive" and mp else form


def clip_grad_norm(parameters: Sequence[torch.Tensor], max_norm: float) -> float:
    """Clip the gradients of ``parameters`` to the global L2 norm ``max_norm`` (sharded DTensor gradients: the
    norm over the full tensors) and return the norm before clipping."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], 2.0)
    full = getattr(total, "full_tensor", None)
    if full is not None:
        total = full()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded DTensor (a collective), or ``t`` itself."""
    full = getattr(t, "full_tensor", None)
    return full() if full is not None else t


def shard_policy(policy: Any, config: DistConfig) -> None:
    """Shard a :class:`trainers.policy.TrainablePolicy`'s module in place (:func:`shard_model`); build the
    optimiser afterwards (it must hold the sharded parameters). A no-op without a process group."""
    shard_model(policy.module, mixed_precision=config.mixed_precision,
                reshard_after_forward=config.reshard_after_forward)


def local_device(device: str, info: DistInfo) -> str:
    """The device a rank trains on: ``auto`` under N ranks with CUDA is this rank's own GPU."""
    if info.distributed and device in ("auto", "", "cuda") and info.device.type == "cuda":
        return str(info.device)
    return device
