"""Weight broadcast from a trainer into vLLM workers over a private process group (both sides' wire code).

This module is imported twice: by the trainer (as ``clawgym_env.policy.vllm.ext.clawgym_vllm_ext``) and
inside each vLLM worker (as the top-level ``clawgym_vllm_ext``, the folder being on the server's
``PYTHONPATH``; ``--worker-extension-cls clawgym_vllm_ext.WeightReceiverExtension``). It imports only
torch and the standard library, never vLLM nor ``clawgym_env``.

The group: the trainer (rank 0) hosts a ``TCPStore``; each vLLM worker joins as rank
``rank_offset + its tensor-parallel rank``. The group is built from torch.distributed's own backend
classes (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPU) on that private store, so it never
touches the default process group of either side (the trainer's FSDP group, vLLM's own).

Protocol of one update (the trainer drives it through vLLM's ``collective_rpc``):

1. every worker is told the list of :class:`TensorMeta` (name, dtype, shape), as JSON;
2. rank 0 broadcasts the tensors one by one in that order; each worker receives into a fresh tensor
   and hands ``(name, tensor)`` pairs, lazily, to ``model_runner.reload_weights`` (vLLM's in-place
   reload: checkpoint-format names, its layer-wise weight processing), then answers how many it got.

Invariants: sender and receiver build the group with :func:`make_group` and decode the metadata with
:func:`decode_meta` (one definition of the wire); a worker consumes every announced tensor even when
loading fails (the sender never blocks on a missing receive), then re-raises; every collective has the
group's timeout, so a dead peer is an error, not a hang.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

BACKENDS = ("gloo", "nccl")
#: The JSON object a worker answers an RPC with (``clawgym_env.jsontypes.JSONObject``, spelled out: this module
#: imports nothing of ``clawgym_env``, see the module doc).
JSONObject = dict[str, Any]
_DTYPES = {str(t).removeprefix("torch."): t for t in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                                      torch.int64, torch.int32, torch.uint8, torch.int8, torch.bool)}


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """Where and how the weight group meets (sent to each worker as JSON)."""

    host: str
    """address of the trainer's TCPStore (reachable from every vLLM worker)"""
    port: int
    """the store's port"""
    world_size: int
    """1 (the trainer) + every worker of every engine"""
    backend: str = "gloo"
    """``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors)"""
    timeout_s: float = 600.0
    """bound on every collective and on the rendezvous"""
    prefix: str = "clawgym-weights"
    """key prefix in the store (one group per prefix)"""

    def to_json(self) -> str:
        """The spec as a JSON string (``collective_rpc`` passes string arguments only)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> GroupSpec:
        """The inverse of :meth:`to_json`."""
        return cls(**json.loads(text))


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """One tensor of an update: its checkpoint name, dtype (``float32``, ``bfloat16``...) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]


def encode_meta(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """The JSON list of :class:`TensorMeta` for ``tensors``, in order."""
    rows = []
    for name, t in tensors:
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise ValueError(f"tensor {name} has dtype {t.dtype}, which the weight broadcast does not carry; "
                             f"cast it to one of {sorted(_DTYPES)}")
        rows.append([name, dtype, list(t.shape)])
    return json.dumps(rows)


def decode_meta(text: str) -> list[TensorMeta]:
    """The inverse of :func:`encode_meta`."""
    return [TensorMeta(str(n), str(d), tuple(int(x) for x in s)) for n, d, s in json.loads(text)]


@dataclasses.dataclass
class WeightGroup:
    """One member's handle on the weight group: the backend object and the store it lives on."""

    backend: Any
    """the torch ``ProcessGroupGloo``/``ProcessGroupNCCL``"""
    store: Any
    """the ``TCPStore`` (kept alive as long as the group)"""
    rank: int
    """this member's rank (0: the trainer)"""
    spec: GroupSpec
    """what the group was built from"""

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` from rank 0 (in place on the receivers), waiting for it."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        opts.timeout = datetime.timedelta(seconds=self.spec.timeout_s)
        self.backend.broadcast([tensor], opts).wait()

    def close(self) -> None:
        """Shut the backend down (best effort, idempotent)."""
        backend, self.backend = self.backend, None
        if backend is not None and hasattr(backend, "shutdown"):
            try:
                backend.shutdown()
            except Exception:  # noqa: BLE001 - leaving is best effort
                pass


def make_group(spec: GroupSpec, rank: int, *, store: Any = None) -> WeightGroup:
    """Join the weight group as ``rank``, on ``store`` or a client of the store at ``spec.host:port``.

    Blocks until all ``world_size`` ranks joined (or ``timeout_s`` passed). Rank 0 hosts the store
    (:class:`~clawgym_env.policy.vllm.collective.WeightBroadcaster` creates it before the others join).
    """
    import torch.distributed as dist

    if spec.backend not in BACKENDS:
        raise ValueError(f"weight group backend {spec.backend!r}; use one of {BACKENDS}")
    if spec.backend == "nccl" and not dist.is_nccl_available():
        raise ValueError("the weight group asks for nccl but this torch build has no NCCL; use gloo")
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    if store is None:
        store = dist.TCPStore(spec.host, spec.port, is_master=False, timeout=timeout)
    prefixed = dist.PrefixStore(spec.prefix, store)
    if spec.backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._timeout = timeout
        loopback = spec.host in ("127.0.0.1", "localhost")
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1") if loopback
                         else dist.ProcessGroupGloo.create_default_device()]
        backend: Any = dist.ProcessGroupGloo(prefixed, rank, spec.world_size, opts)
    else:
        nccl_opts = dist.ProcessGroupNCCL.Options()
        nccl_opts._timeout = timeout
        backend = dist.ProcessGroupNCCL(prefixed, rank, spec.world_size, nccl_opts)
    return WeightGroup(backend=backend, store=store, rank=rank, spec=spec)


def receive(group: WeightGroup, metas: list[TensorMeta], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """Receive the announced tensors in order, yielding ``(name, tensor)`` as each arrives."""
    for meta in metas:
        buf = torch.empty(meta.shape, dtype=_DTYPES[meta.dtype], device=device)
        group.broadcast(buf)
        yield meta.name, buf


def load_received(group: WeightGroup, metas: list[TensorMeta], device: torch.device,
                  load: Callable[[Iterator[tuple[str, torch.Tensor]]], object]) -> int:
    """Stream the announced tensors into ``load(iterator)``; consume the rest if ``load`` stops early or
    fails (so the sender's broadcasts all complete), then re-raise. Returns the number received."""
    stream = receive(group, metas, device)
    count = 0

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal count
        for item in stream:
            count += 1
            yield item

    try:
        load(counted())
    finally:
        for _ in stream:  # drain whatever load() did not take
            count += 1
    return count


class WeightReceiverExtension:
    """Mixed into vLLM's worker class (``--worker-extension-cls``); methods reached by ``collective_rpc``.

    Names are prefixed ``clawgym_`` so they cannot clash with the worker's own attributes (vLLM
    refuses an extension that shadows one).
    """

    def clawgym_init_weight_group(self, spec: str, rank_offset: str | int) -> JSONObject:
        """Join the weight group described by ``spec`` (:meth:`GroupSpec.to_json`) as
        ``rank_offset`` + this worker's rank."""
        parsed = GroupSpec.from_json(spec)
        rank = int(rank_offset) + int(getattr(self, "rank", 0))
        self._clawgym_group: WeightGroup | None = make_group(parsed, rank)
        return {"rank": rank, "world_size": parsed.world_size}

    def clawgym_update_weights(self, meta: str) -> JSONObject:
        """Receive the tensors announced in ``meta`` (:func:`encode_meta`) and reload them in place."""
        group = getattr(self, "_clawgym_group", None)
        if group is None:
            raise RuntimeError("clawgym_update_weights before clawgym_init_weight_group")
        device = (torch.device("cuda", torch.cuda.current_device()) if group.spec.backend == "nccl"
                  else torch.device("cpu"))
        t0 = time.monotonic()
        runner: Any = getattr(self, "model_runner")  # noqa: B009 - set by vLLM's worker
        count = load_received(group, decode_meta(meta), device,
                              lambda items: runner.reload_weights(weights_iterator=items, is_checkpoint_format=True))
        return {"received": count, "seconds": time.monotonic() - t0}

    def clawgym_close_weight_group(self) -> None:
        """Leave the weight group (idempotent)."""
        group = getattr(self, "_clawgym_group", None)
        self._clawgym_group = None
        if group is not None:
            group.close()
