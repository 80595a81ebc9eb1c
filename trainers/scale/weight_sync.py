"""Weight sync: after each optimiser step the serving backend must sample from the new weights.

The seam is :class:`WeightSync`: ``push(policy, version) -> served version``. ``policy`` is a
:class:`trainers.policy.TrainablePolicy` (or anything with ``serving_state_dict()``); ``version`` is
the trainer's count of optimiser steps so far. Implementations:

* :class:`InProcessSync` — the serving :class:`~clawgym_env.policy.transformers_backend.TransformersPolicy`
  lives in this process. ``share=False`` (default) copies the merged weights into the serving model
  (``update_weights``), so serving and training models are separate objects and rollouts could run
  while the trainer computes; ``share=True`` serves the training module itself (no copy, no second
  model in memory; full fine-tuning only) and only bumps the version. Either way the serving
  policy's ``version`` is bumped under its lock, so every call sampled afterwards records it.
* :class:`DirectorySync` — writes the merged weights as a model directory per version
  (``<root>/v<version>/``) and calls ``notify(path, version)``: the hook for a separate inference
  server (e.g. a vLLM server told to reload its weights from that path over its admin API).
* :class:`VLLMSync` — the serving policy is a :class:`~clawgym_env.policy.replicas.ReplicaPolicy` over
  vLLM engines (built by :func:`trainers.rollouts.generation.open_generation`). ``inplace``: the merged weights are
  written as ``<root>/v<version>/`` (outside the gate, while rollouts still run) and every engine
  reloads them without a restart; ``restart``: every engine restarts on that folder; ``collective``:
  rank 0 broadcasts the tensors into the engines' workers
  (:class:`~clawgym_env.policy.vllm.collective.WeightBroadcaster`), no files; ``lora`` (LoRA policies): the engines
  serve the frozen base and only the adapters are written (``<root>/lora-v<version>/``, peft's format,
  :mod:`trainers.scale.lora_sync`) and hot-loaded under a new name per version, which the replicas then request.
  ``sleep=True`` (engines colocated with the trainer on its GPU): entering :meth:`VLLMSync.updating` puts every engine
  to sleep before the update's forward/backward (generations wait; none samples while an engine sleeps), ``push``
  wakes them before the new weights reach them, and leaving the block wakes them when no push did (no update, an
  error).
* :class:`GatherOnlySync` — a trainer rank other than 0: joins the gather, serves nothing.

What reaches a vLLM engine (the ``v0`` folder it starts from, every folder and every broadcast) is in the serving
layout of :mod:`trainers.scale.serving_names`: the names and shapes of the model's Hugging Face checkpoint (a
Qwen3-MoE's fused experts split per expert), floating-point tensors in the serving dtype (``dtype``; the masters
keep theirs). The in-process backend serves the trainer's own module layout and dtype.

Every sync has ``updating()``, a context a loop runs each update and its ``push(policy, version)`` in (it does
nothing but for a sleeping :class:`VLLMSync`).

Invariants: after ``push(p, v)`` returns, every generation that starts later uses the pushed
weights; versions served are strictly increasing; a push that fails raises
:class:`~clawgym_env.errors.PolicyError` and leaves the served weights unchanged (the in-process
backend checks names and shapes before copying anything; a vLLM engine may hold partly updated
weights after a failed reload, and keeps the old version until a push succeeds).

Under several trainer ranks (a process group initialised), ``push`` is called on every rank:
``policy.serving_state_dict()`` is a collective under FSDP; only rank 0 touches the serving engines,
the other ranks return ``version`` after joining the gather.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from clawgym_env.errors import ConfigError, PolicyError
from trainers.scale.engine_sleep import SleepingEngines
from trainers.scale.lora_sync import write_adapter_dir
from trainers.scale.serving_names import dtype_name, to_serving

if TYPE_CHECKING:
    import torch

    from clawgym_env.policy.replicas import ReplicaPolicy
    from clawgym_env.policy.vllm.backend import VLLMPolicy
    from clawgym_env.policy.vllm.collective import WeightBroadcaster
    from clawgym_env.policy.vllm.server import VLLMServer

SYNC_METHODS = ("auto", "inplace", "restart", "collective", "lora")


def serving_weights(policy: Any) -> dict[str, Any]:
    """``policy.serving_state_dict()``; under FSDP gathered to rank 0's CPU only (the other ranks get ``{}``), so no
    rank holds a second full copy of the model on its accelerator. Every rank must call it when sharded."""
    if getattr(policy, "sharded", False):
        return policy.serving_state_dict(rank0_only=True)
    return policy.serving_state_dict()


def trainer_rank() -> int:
    """This process's rank in the trainer's process group (0 without one)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@runtime_checkable
class WeightSync(Protocol):
    """How a trainer hands new weights to the serving policy."""
    def push(self, policy: Any, version: int) -> int:
        """Make the serving backend use ``policy``'s current weights; returns the version it now serves."""


class InProcessSync:
    """Sync into an in-process ``TransformersPolicy`` (see the module docstring)."""

    def __init__(self, serving, share: bool = False) -> None:
        self.serving = serving
        self.share = share

    @classmethod
    def for_policy(cls, policy, share: bool = False, name: str = "trainee"):
        """Build the serving ``TransformersPolicy`` for ``policy`` and a sync into it."""
        from clawgym_env.policy.transformers_backend import TransformersPolicy

        if share and policy.lora:
            raise ConfigError("share=True serves the training module itself, which needs full fine-tuning; "
                              "with LoRA use share=False (merged weights are copied)")
        model = policy.causal_lm if share else policy.serving_copy()
        serving = TransformersPolicy(model, policy.tokenizer, name=name)
        if share:
            policy.module.train()  # TransformersPolicy put the shared module in eval mode
        return cls(serving, share=share)

    def step_metrics(self) -> dict[str, float | None]:
        """Nothing to report per step (the in-process backend has no engine statistics)."""
        return {}

    def updating(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to free around an update (the serving copy stays)."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Nothing to release."""

    def push(self, policy, version: int) -> int:
        """Copy ``policy``'s weights into the serving module and serve them as ``version``."""
        if version <= self.serving.version:
            raise PolicyError(f"weight sync to version {version} but version {self.serving.version} is already "
                              "served; versions must increase")
        if self.share:
            if policy.causal_lm is not self.serving.model:
                raise PolicyError("share=True but the serving model is not the training module")
        else:
            self.serving.update_weights(serving_weights(policy))  # checked before anything is copied
        while self.serving.version < version:  # e.g. after a resume: catch up with the trainer's count
            self.serving.update_weights({})  # copies nothing, bumps the version under the policy's lock
        return self.serving.version


class DirectorySync:
    """Write each version as a model directory and notify an external server (see the module docstring)."""

    def __init__(self, root: str | Path, notify: Callable[[Path, int], None] | None = None, keep: int = 2) -> None:
        self.root = Path(root)
        self.notify = notify
        self.keep = keep
        self.version = 0

    def updating(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to do around an update."""
        return contextlib.nullcontext()

    def push(self, policy, version: int) -> int:
        """Save ``policy`` as the model directory ``v<version>`` under the root and notify the server."""
        if version <= self.version:
            raise PolicyError(f"weight sync to version {version} after {self.version}; versions must increase")
        out = policy.save_pretrained(self.root / f"v{version}")
        (out / "clawgym_version.json").write_text(json.dumps({"version": version}))
        if self.notify is not None:
            self.notify(out, version)
        self.version = version
        old = sorted((p for p in self.root.glob("v*") if p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
        for p in old[:-self.keep] if self.keep > 0 else []:
            import shutil

            shutil.rmtree(p, ignore_errors=True)
        return version


class GatherOnlySync:
    """The sync of a trainer rank other than 0: ``push`` joins the collective gather rank 0 makes (``gather``: the
    serving weights, ``serving_state_dict()`` under FSDP, by default; the adapters only under ``sync: lora``) while
    rank 0 updates the engines; it serves nothing."""

    serving = None

    def __init__(self, gather: Callable[[Any], object] | None = None) -> None:
        self.gather = gather or serving_weights

    def updating(self) -> contextlib.AbstractContextManager[None]:
        """Nothing: rank 0 puts the engines to sleep."""
        return contextlib.nullcontext()

    def push(self, policy, version: int) -> int:
        """Join the gather; returns ``version``."""
        self.gather(policy)
        return version

    def step_metrics(self) -> dict[str, float | None]:
        """Nothing: rank 0 reports the serving side."""
        return {}

    def close(self) -> None:
        """Nothing to release."""


def model_type_of(model: Any) -> str:
    """``model.config.model_type`` (empty when ``model`` has no config): the row of the serving layout."""
    return str(getattr(getattr(model, "config", None), "model_type", "") or "")


def torch_dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype of a serving dtype name (None: None, the weights keep theirs)."""
    import torch

    return None if name is None else getattr(torch, dtype_name(name))


def serving_tensors(state: Mapping[str, torch.Tensor], model: Any, dtype: str | None = None) -> dict[str, torch.Tensor]:
    """``state`` (the trainer's merged weights) in the serving layout of ``model``'s architecture
    (:func:`trainers.scale.serving_names.to_serving`), floating-point tensors in ``dtype`` (None: kept)."""
    return to_serving(state, model_type_of(model), dtype=torch_dtype(dtype))


def write_model_dir(state: Mapping[str, torch.Tensor], model: Any, tokenizer: Any, out: str | Path, *,
                    dtype: str | None = None) -> Path:
    """A model folder vLLM and transformers load: ``model.safetensors`` of ``state`` in the serving layout (the
    names, shapes and, with ``dtype``, the dtype ``save_pretrained`` of the model in that dtype writes),
    ``model``'s config (with its ``architectures``, which vLLM needs to pick the generating model class, and its
    ``dtype``: ``dtype`` when given, else the config's, else the weights') and the tokenizer. A tied output
    embedding (``tie_word_embeddings``) is left out, as ``save_pretrained`` does."""
    import copy

    from safetensors.torch import save_file

    config = copy.deepcopy(model.config)
    if not getattr(config, "architectures", None):
        config.architectures = [type(model).__name__.removeprefix("FSDP")]  # fully_shard renames the class
    if dtype is not None:
        config.dtype = dtype_name(dtype)  # vLLM's dtype "auto" reads it
    elif getattr(config, "dtype", None) is None:
        config.dtype = next((v.dtype for v in state.values() if v.is_floating_point()), None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    kept = {k: v.detach() for k, v in state.items() if not (tied and k == "lm_head.weight")}
    tensors = {k: v.to("cpu").contiguous() for k, v in serving_tensors(kept, model, dtype).items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(out))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out


class VLLMSync:
    """Sync into vLLM engines behind a :class:`ReplicaPolicy` (see the module docstring), on trainer rank 0.

    ``serving`` routes the rollouts; ``servers`` are its engines; ``model`` is the trained causal LM (its
    config goes into each folder); ``root`` holds the version folders (the ``keep`` newest are kept, never
    the one being served); ``broadcaster`` is required by ``method == "collective"``. ``method == "lora"``: the
    ``engines`` (the :class:`~clawgym_env.policy.vllm.backend.VLLMPolicy` replicas of ``serving``, one per server) load
    each adapter folder and request it by name. ``sleep``: the ``engines`` sleep from entering :meth:`updating` until
    the next ``push`` (or the end of :meth:`updating`). ``lora`` and ``sleep`` need ``engines``.
    """

    def __init__(self, serving: ReplicaPolicy, servers: list[VLLMServer], *, method: str, root: str | Path,
                 model: Any = None, tokenizer: Any = None, broadcaster: WeightBroadcaster | None = None,
                 keep: int = 2, dtype: str | None = None, sleep: bool = False,
                 engines: list[VLLMPolicy] | None = None) -> None:
        if method not in SYNC_METHODS:
            raise ConfigError(f"unknown weight sync method {method!r}; use one of {SYNC_METHODS}")
        if method == "collective" and broadcaster is None:
            raise ConfigError("sync 'collective' needs a WeightBroadcaster (open_generation builds it)")
        if (method == "lora" or sleep) and not engines:
            raise ConfigError("sync 'lora' and sleep need the engines' VLLMPolicy replicas "
                              "(open_generation passes them)")
        self.serving = serving
        self.servers = servers
        self.method = method
        self.root = Path(root)
        self.model = model
        self.tokenizer = tokenizer
        self.broadcaster = broadcaster
        self.keep = max(1, int(keep))
        self.dtype = None if dtype is None else dtype_name(dtype)
        self.sleep = sleep
        self.engines = list(engines or [])
        self.adapter: Path | None = None
        """under ``lora``: the adapter folder served"""
        self.last: dict[str, float] = {}
        self.sleeper = SleepingEngines(serving, self.engines) if sleep else None
        """with ``sleep``: the engines' sleep/wake around each update"""

    # -- sleep/wake around the update ----------------------------------------------------------------
    @contextlib.contextmanager
    def updating(self) -> Iterator[None]:
        """With ``sleep``: every engine sleeps from here until :meth:`push` (or the block's end) wakes it; generations
        wait meanwhile. Without ``sleep``: nothing."""
        self._sleep()
        try:
            yield
        finally:
            self._wake()

    def _sleep(self) -> None:
        if self.sleeper is not None:
            self.sleeper.sleep()

    def _wake(self) -> float:
        return self.sleeper.wake() if self.sleeper is not None else 0.0

    def _update(self, apply: Callable[[], str], version: int) -> tuple[int, float]:
        """Run ``apply`` with no call in flight and serve ``version``; (the version served, seconds waking took)."""
        if self.sleeper is not None and self.sleeper.held:
            return self.sleeper.update(apply, version)
        return self.serving.update_weights(apply, version), 0.0

    # -- LoRA adapters -------------------------------------------------------------------------------
    def serve_adapter(self, folder: Path, version: int) -> str:
        """Load the adapter ``folder`` into every engine as ``trainee-lora-v<version>`` and request it from now on
        (the previous adapter is unloaded); call with no generation in flight (inside ``update_weights``)."""
        name = f"trainee-lora-v{version}"
        for replica in self.engines:
            old = replica.model
            replica.load_adapter(name, folder)
            replica.serve_model(name)
            if old.startswith("trainee-lora-v") and old != name:
                replica.unload_adapter(old)
        self.adapter = Path(folder).resolve()
        return "lora"

    def push(self, policy, version: int) -> int:
        """Serve ``policy``'s current weights as ``version`` on every engine (rank 0's part of a collective);
        sleeping engines are woken first."""
        t0 = time.monotonic()
        try:
            return self._push(policy, version, t0)
        finally:
            self._wake()  # never leave an engine asleep, also when the push failed

    def _push(self, policy, version: int, t0: float) -> int:
        if self.method == "lora":  # adapters only: every rank gathers them (the other ranks in GatherOnlySync)
            written_to = write_adapter_dir(policy, self.root / f"lora-v{version}", dtype=torch_dtype(self.dtype))
            assert written_to is not None  # rank 0
            folder: Path = written_to
            if version <= self.serving.version:
                raise PolicyError(f"weight sync to version {version} but version {self.serving.version} is already "
                                  "served; versions must increase")
            written = time.monotonic()
            served, woken = self._update(lambda: self.serve_adapter(folder, version), version)
            done = time.monotonic()
            self.last = {"weight_sync_s": done - t0, "weight_sync_gather_s": 0.0,
                         "weight_sync_write_s": written - t0, "weight_sync_apply_s": done - written - woken}
            self._record_sleep(woken)
            self._prune()
            return served
        state = serving_weights(policy)  # a collective under FSDP: the other ranks join it in GatherOnlySync
        if version <= self.serving.version:
            raise PolicyError(f"weight sync to version {version} but version {self.serving.version} is already "
                              "served; versions must increase")
        gathered = time.monotonic()
        if self.method == "collective":
            assert self.broadcaster is not None
            broadcaster = self.broadcaster
            tensors = serving_tensors(state, self.model, self.dtype)
            del state

            def apply() -> str:
                broadcaster.push(tensors.items())
                return "collective"
        else:
            # an in-place reload reads only the weights; a restart serves the folder, tokenizer included
            tokenizer = self.tokenizer if self.method == "restart" else None
            folder = write_model_dir(state, self.model, tokenizer, self.root / f"v{version}", dtype=self.dtype)

            def apply() -> str:
                used = {server.reload(folder, method=self.method) for server in self.servers}
                return "+".join(sorted(used))
        written = time.monotonic()
        served, woken = self._update(apply, version)
        done = time.monotonic()
        self.last = {"weight_sync_s": done - t0, "weight_sync_gather_s": gathered - t0,
                     "weight_sync_write_s": written - gathered, "weight_sync_apply_s": done - written - woken}
        self._record_sleep(woken)
        self._prune()
        return served

    def _record_sleep(self, woken: float) -> None:
        if self.sleeper is not None:
            self.last.update({"engine_sleep_s": self.sleeper.slept_s, "engine_wake_s": woken})

    def _prune(self) -> None:
        """Delete version folders (and adapter folders) beyond the ``keep`` newest, never one an engine serves."""
        served = {Path(s.model_dir).resolve() for s in self.servers}
        if self.adapter is not None:
            served.add(self.adapter)
        for prefix in ("v", "lora-v"):
            dirs = sorted((p for p in self.root.glob(f"{prefix}*") if p.name[len(prefix):].isdigit()),
                          key=lambda p: int(p.name[len(prefix):]))
            for path in dirs[:-self.keep]:
                if path.resolve() not in served:
                    shutil.rmtree(path, ignore_errors=True)

    def step_metrics(self) -> dict[str, float | None]:
        """The last push's timings and, since the previous call, each engine's prefix-cache hit rate and
        calls (:meth:`ReplicaPolicy.step_metrics`)."""
        row: dict[str, float | None] = dict(self.last)
        row.update(self.serving.step_metrics())
        return row

    def close(self) -> None:
        """Leave the broadcast group (the engines are stopped by whoever started them)."""
        if self.broadcaster is not None:
            self.broadcaster.close()
