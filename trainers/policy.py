"""The trainable policy: a Qwen3-family causal LM, optionally with LoRA adapters (peft), on one device.

:class:`TrainablePolicy` owns what the optimiser updates and hands out the three views a trainer
needs:

* ``causal_lm`` — the ``*ForCausalLM`` module to score tokens with
  (:func:`trainers.batch.logprobs.token_logprobs` takes it). With LoRA its linear layers carry the adapters
  in place, so scoring through it scores the adapted policy.
* ``serving_state_dict()`` — the weights under the plain model's own names (LoRA deltas merged,
  nothing else), what a serving backend loads (:mod:`trainers.scale.weight_sync`).
* ``reference()`` — a context manager yielding a frozen reference model for a KL penalty: the base
  weights with adapters disabled under LoRA (no copy), else a copy of the weights taken when
  :meth:`freeze_reference` was first called (by default at construction).

Invariants:

* ``vocab_limit == min(len(tokenizer), config.vocab_size)``: padding rows of the embedding are never
  scored or sampled; trainers pass it to ``token_logprobs``.
* the attention implementation takes a tree mask (``sdpa`` by default; ``eager``/``flex_attention``
  also work, ``flash_attention_*`` cannot);
* ``serving_state_dict()`` has exactly the names and shapes of the base model's ``state_dict()``,
  detached, on the policy's device;
* ``state_dict()``/``load_state_dict()`` cover every tensor of the trained module (adapters
  included), as full tensors; a checkpoint (:mod:`trainers.scale.checkpoint`) stores only the trainable
  parameters of :meth:`TrainablePolicy.checkpoint_modules` (under LoRA: the adapters);
* the same seed gives the same LoRA initialisation in every process (data-parallel ranks agree);
* ``PolicyConfig.rope_scaling`` (YaRN, :mod:`clawgym_env.policy.rope`) is set on the model config before the rotary
  embedding is built (:func:`model_config`), so every folder saved from the model carries it in ``config.json``;
* sharded or not: ``policy.module`` may be sharded in place with FSDP2 ``fully_shard`` (DTensor
  parameters). Then ``state_dict``, ``load_state_dict``, ``serving_state_dict``, ``serving_copy``,
  ``save_pretrained`` and ``freeze_reference`` are collectives every rank calls: they gather full
  tensors with ``torch.distributed.checkpoint.state_dict`` and merge LoRA deltas (``W + scale·B@A``,
  per expert for fused MoE experts) from those full tensors, never through peft's in-place merge;
  ``save_pretrained`` writes on rank 0 only. A policy built by :func:`trainers.scale.meta_init.sharded_start`
  never held the full model on any rank but 0's host memory; its full fine-tune reference is sharded too
  (:meth:`TrainablePolicy.set_reference`), else the reference of a sharded full fine-tune is an unsharded copy on
  every rank.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from clawgym_env.errors import ConfigError, PolicyError
from clawgym_env.policy.rope import RopeScaling
from trainers.policy_weights import (  # noqa: F401 - re-exported: trainers import them from here
    _barrier,
    _rank,
    _tied_names,
    full_state_dict,
    is_sharded,
    lora_delta,
    merge_lora,
)

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TREE_MASK_ATTN = ("sdpa", "eager", "flex_attention")
TINY_MODELS = ("tiny", "tiny-moe")


@dataclasses.dataclass
class PolicyConfig:
    """Which model to train and how. ``model``: ``"tiny"`` (a random-init Qwen3 on the real tokenizer,
    sized by the ``tiny_*`` fields) or a local model directory (``config.json`` + weights)."""

    model: str = "tiny"
    """``tiny`` (a random-init Qwen3 on the real tokenizer, sized by the ``tiny_*`` fields), ``tiny-moe`` (a
    random-init Qwen3-MoE, also sized by ``tiny_experts*``/``tiny_moe_intermediate``) or a local model
    directory (config.json + weights)"""
    tiny_hidden_size: int = 64
    """hidden size of the tiny model"""
    tiny_layers: int = 2
    """decoder layers of the tiny model"""
    tiny_heads: int = 4
    """attention heads of the tiny model"""
    tiny_kv_heads: int = 2
    """key/value heads of the tiny model (grouped-query attention)"""
    tiny_intermediate: int = 128
    """MLP width of the tiny model"""
    tiny_experts: int = 4
    """experts per MoE layer of ``tiny-moe``"""
    tiny_experts_per_token: int = 2
    """experts routed per token (top-k) of ``tiny-moe``"""
    tiny_moe_intermediate: int = 32
    """width of each expert's MLP in ``tiny-moe``"""
    tiny_tie_embeddings: bool = True
    """the tiny model's output layer shares the input embedding (as small Qwen3 checkpoints do); ``false`` gives it
    its own copy, which vLLM can update in place (``scale.generation.sync: auto`` restarts engines of tied models)"""
    seed: int = 0
    """seed of the tiny model's initial weights and of LoRA's initialisation"""
    dtype: str = "float32"
    """parameter dtype: ``float32`` (CPU), ``bfloat16`` on a GPU"""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:1``, ..."""
    attn_implementation: str = "sdpa"
    """``sdpa``, ``eager`` or ``flex_attention`` (the tree-mask forms these support)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass (less memory, ~30% more time); a separate critic follows"""
    lora_rank: int = 0
    """> 0 trains LoRA adapters of this rank (peft) instead of all weights; the reference is then the frozen base"""
    lora_alpha: float = 16.0
    """LoRA scaling numerator (scale = alpha / rank)"""
    lora_dropout: float = 0.0
    """dropout on LoRA inputs"""
    lora_targets: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    """module names LoRA adapts"""
    rope_scaling: RopeScaling | None = None
    """YaRN rope scaling for a context beyond the model's ``max_position_embeddings``, e.g. ``{factor: 2.0,
    original_max_position_embeddings: 32768}`` for 64K on Qwen3: applied identically to the trained model, the vLLM
    engines (``--hf-overrides``) and every model folder written (``config.json``); None: the model's own positions"""

    def __post_init__(self) -> None:
        self.rope_scaling = RopeScaling.parse(self.rope_scaling)  # a mapping, e.g. a config read back from JSON


def resolve_device(device: str) -> torch.device:
    """``auto`` (or empty) → CUDA when available, else CPU; anything else as given."""
    if device in ("auto", "", None):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _dtype(name: str) -> torch.dtype:
    alias = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    value = getattr(torch, alias.get(name, name), None)
    if not isinstance(value, torch.dtype):
        raise ConfigError(f"unknown dtype {name!r}; use float32, bfloat16 or float16")
    return value


def load_causal_lm(cfg: PolicyConfig, tokenizer, *, meta: bool = False):
    """The (base) causal LM ``cfg`` names: a ``tiny*`` random-init model or a model directory's. ``meta``: its
    skeleton on the meta device (shapes and dtypes, no storage, nothing read from disk but ``config.json``)."""
    if meta:
        with torch.device("meta"):
            return _load_causal_lm(cfg, tokenizer, skeleton=True)
    return _load_causal_lm(cfg, tokenizer, skeleton=False)


def _load_causal_lm(cfg: PolicyConfig, tokenizer, *, skeleton: bool):
    if cfg.attn_implementation not in TREE_MASK_ATTN:
        raise ConfigError(f"attn_implementation {cfg.attn_implementation!r} cannot take a tree mask; use one of "
                          f"{TREE_MASK_ATTN}")
    if cfg.model in TINY_MODELS:
        from clawgym_env.policy.tiny import build_tiny_qwen3, build_tiny_qwen3_moe

        shape: dict[str, Any] = dict(hidden_size=cfg.tiny_hidden_size, num_layers=cfg.tiny_layers,
                                     heads=cfg.tiny_heads, kv_heads=cfg.tiny_kv_heads, seed=cfg.seed)
        if cfg.model == "tiny":
            model = build_tiny_qwen3(tokenizer, intermediate=cfg.tiny_intermediate, **shape)
        else:
            model = build_tiny_qwen3_moe(tokenizer, experts=cfg.tiny_experts,
                                         experts_per_token=cfg.tiny_experts_per_token,
                                         moe_intermediate=cfg.tiny_moe_intermediate, **shape)
        if not cfg.tiny_tie_embeddings:
            import torch

            model.config.tie_word_embeddings = False
            model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
        if cfg.rope_scaling is not None:  # the rotary embedding is recomputed from the scaled config
            cfg.rope_scaling.apply(model.config)
            model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config)
        model.config._attn_implementation = cfg.attn_implementation
        return model.to(_dtype(cfg.dtype))
    path = Path(cfg.model).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(f"policy.model {cfg.model!r} is neither one of {TINY_MODELS} nor a model directory "
                          "with config.json")
    from transformers import AutoModelForCausalLM

    try:
        config = model_config(cfg)
        if skeleton:
            return AutoModelForCausalLM.from_config(config, dtype=_dtype(cfg.dtype),
                                                    attn_implementation=cfg.attn_implementation)
        return AutoModelForCausalLM.from_pretrained(str(path), config=config, dtype=_dtype(cfg.dtype),
                                                    attn_implementation=cfg.attn_implementation)
    except ConfigError:
        raise
    except Exception as exc:
        raise PolicyError(f"could not load a causal LM from {path}: {exc}") from exc


def model_config(cfg: PolicyConfig, tokenizer=None):
    """The transformers config of the model ``cfg`` builds, ``rope_scaling`` applied (nothing but ``config.json`` is
    read; a ``tiny*`` model's needs ``tokenizer``, the project's Qwen3 one when None)."""
    if cfg.model in TINY_MODELS:
        return load_causal_lm(cfg, tokenizer if tokenizer is not None else _tokenizer_for(cfg), meta=True).config
    from transformers import AutoConfig

    path = Path(cfg.model).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(f"policy.model {cfg.model!r} is neither one of {TINY_MODELS} nor a model directory "
                          "with config.json")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except Exception as exc:
        raise PolicyError(f"could not read the model config {path / 'config.json'}: {exc}") from exc
    return cfg.rope_scaling.apply(config) if cfg.rope_scaling is not None else config


def is_meta(module: torch.nn.Module) -> bool:
    """Whether ``module``'s parameters live on the meta device (a skeleton without storage)."""
    return any(p.is_meta for p in module.parameters())


def tokenizer_for(cfg: PolicyConfig):
    """The tokenizer of ``cfg``'s model: the model directory's own when it has one, else the project's Qwen3."""
    return _tokenizer_for(cfg)


def _tokenizer_for(cfg: PolicyConfig):
    from clawgym_env.policy.tokenizer import load_tokenizer

    path = Path(cfg.model).expanduser()
    has_tokenizer = (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()
    if cfg.model not in TINY_MODELS and has_tokenizer:
        return load_tokenizer(path)
    return load_tokenizer()


class TrainablePolicy:
    """A causal LM being trained (see the module invariants)."""

    def __init__(self, config: PolicyConfig | None = None, tokenizer=None, model=None) -> None:
        self.config = config or PolicyConfig()
        self.tokenizer = tokenizer if tokenizer is not None else _tokenizer_for(self.config)
        self.device = resolve_device(self.config.device)
        lm = model if model is not None else load_causal_lm(self.config, self.tokenizer)
        if not is_meta(lm):  # a meta skeleton is materialised after sharding (trainers.scale.meta_init)
            lm = lm.to(self.device)
        self.lora = self.config.lora_rank > 0
        self.module: Any  # the trained module (a peft model under LoRA); transformers models are dynamically typed
        self.causal_lm: Any  # the causal LM the trainers run forwards on
        if self.lora:
            try:
                from peft import LoraConfig, get_peft_model
            except ImportError as exc:
                raise PolicyError("LoRA needs peft: pip install peft (or the dev extras)") from exc
            lcfg = LoraConfig(r=self.config.lora_rank, lora_alpha=self.config.lora_alpha,  # type: ignore[arg-type]
                              lora_dropout=self.config.lora_dropout, target_modules=list(self.config.lora_targets),
                              task_type="CAUSAL_LM")
            with torch.random.fork_rng(devices=[]):  # same adapters on every rank, global RNG untouched
                torch.manual_seed(int(self.config.seed))
                self.module = get_peft_model(lm, lcfg)
            self.causal_lm = self.module.get_base_model()  # LoRA layers live inside it
        else:
            self.module = lm
            self.causal_lm = lm
        if self.config.gradient_checkpointing:
            self.causal_lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if self.lora:
                self.causal_lm.enable_input_require_grads()
        self.vocab_limit = min(len(self.tokenizer), int(self.causal_lm.config.vocab_size))
        self._reference: Any = None
        self.module.train()

    # -- parameters and state ---------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters that get gradients (the LoRA adapters under LoRA)."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def num_parameters(self) -> tuple[int, int]:
        """(trainable, total) parameter counts."""
        total = sum(p.numel() for p in self.module.parameters())
        return sum(p.numel() for p in self.trainable_parameters()), total

    @property
    def sharded(self) -> bool:
        """Whether ``module`` has been sharded with FSDP2 (its parameters are DTensors)."""
        return is_sharded(self.module)

    def checkpoint_modules(self) -> dict[str, torch.nn.Module]:
        """The modules a checkpoint saves (their trainable parameters): ``{"policy": module}``."""
        return {"policy": self.module}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The module's weights as full tensors (a collective when sharded)."""
        return full_state_dict(self.module)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load full weights of this policy's shape; a mismatch is an error naming the keys."""
        expected = set(self.module.state_dict())
        missing = sorted(expected - set(state))
        unexpected = sorted(set(state) - expected)
        if missing or unexpected:
            raise PolicyError(f"checkpoint does not fit this policy: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]} "
                              "(was it saved with another model or LoRA setting?)")
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(self.module, dict(state), options=StateDictOptions(full_state_dict=True))
        else:
            self.module.load_state_dict(state, strict=False)

    @torch.no_grad()
    def serving_state_dict(self, rank0_only: bool = False) -> dict[str, torch.Tensor]:
        """Plain model names → detached full weights, LoRA deltas merged (the module is not modified;
        a collective when sharded). ``rank0_only`` (sharded only): rank 0 gets the weights on the CPU,
        the other ranks ``{}`` — no rank holds a second full copy on its accelerator."""
        state = full_state_dict(self.causal_lm, rank0_only=rank0_only)
        if not state:
            return {}
        if not self.lora:
            return {k: v.detach() for k, v in state.items()}
        return merge_lora(state, self.causal_lm)

    def _plain_model(self, state: dict[str, torch.Tensor]):
        """A new plain causal LM of the base architecture holding ``state`` (serving names)."""
        from transformers import AutoModelForCausalLM

        config = copy.deepcopy(self.causal_lm.config)
        first = next(iter(state.values()))
        with torch.random.fork_rng(devices=[]), torch.device(first.device):  # where the weights are
            dtype = first.dtype
            plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
        missing, unexpected = plain.load_state_dict(state, strict=False)
        if [k for k in missing if k not in _tied_names(plain)] or unexpected:
            raise PolicyError(f"merged weights do not fit {type(plain).__name__}: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
        plain.tie_weights()
        return plain

    # -- reference model for a KL penalty ---------------------------------------------------------
    def freeze_reference(self) -> None:
        """Take the reference weights now (full fine-tuning only; LoRA's reference is the frozen base)."""
        if not self.lora:
            ref = self.serving_copy() if self.sharded else copy.deepcopy(self.causal_lm)
            ref.requires_grad_(False)
            self._reference = ref.eval()

    def set_reference(self, reference: Any) -> None:
        """Use ``reference`` (a frozen causal LM of the base architecture holding the start weights, e.g. a
        sharded one) as the full fine-tune's KL reference; an error under LoRA (its reference is the base)."""
        if self.lora:
            raise PolicyError("under LoRA the reference is the frozen base (adapters disabled); nothing to set")
        reference.requires_grad_(False)
        self._reference = reference.eval()

    @contextlib.contextmanager
    def reference(self) -> Iterator[Any]:
        """Yield the reference causal LM (use under ``torch.no_grad()``)."""
        if self.lora:
            with self.module.disable_adapter():
                yield self.causal_lm
            return
        if self._reference is None:
            self.freeze_reference()
        yield self._reference

    # -- export ---------------------------------------------------------------------------------
    def save_pretrained(self, out_dir: str | Path) -> Path:
        """A plain model directory (LoRA merged, tokenizer and chat template included) loadable by
        ``from_pretrained``; a collective when sharded (rank 0 writes, then every rank returns)."""
        out = Path(out_dir)
        if self.sharded:
            state = self.serving_state_dict(rank0_only=True)  # every rank joins the gather; rank 0 writes
            if _rank() == 0:
                out.mkdir(parents=True, exist_ok=True)
                self._plain_model(state).save_pretrained(str(out))
                self.tokenizer.save_pretrained(str(out))
            _barrier()
            return out
        out.mkdir(parents=True, exist_ok=True)
        if self.lora:
            plain = copy.deepcopy(self.module).merge_and_unload()
        else:
            plain = self.causal_lm
        plain.save_pretrained(str(out))
        self.tokenizer.save_pretrained(str(out))
        return out

    def serving_copy(self):
        """A separate plain causal LM holding the current (merged) weights, in eval mode (a collective
        when sharded: every rank gets the full copy)."""
        if self.sharded:
            plain = self._plain_model(self.serving_state_dict())
        elif self.lora:
            plain = copy.deepcopy(self.module).merge_and_unload()
        else:
            plain = copy.deepcopy(self.causal_lm)
        if self.config.gradient_checkpointing:
            plain.gradient_checkpointing_disable()
        plain.requires_grad_(False)
        return plain.eval()
