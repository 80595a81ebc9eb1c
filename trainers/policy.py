"""The trainable policy: a Qwen3-family causal LM, optionally with LoRA adapters (peft), on one device.

:class:`TrainablePolicy` owns what the optimiser updates and hands out the three views a trainer
needs:

* ``causal_lm`` — the ``*ForCausalLM`` module to score tokens with
  (:func:`trainers.logprobs.token_logprobs` takes it). With LoRA its linear layers carry the adapters
  in place, so scoring through it scores the adapted policy.
* ``serving_state_dict()`` — the weights under the plain model's own names (LoRA deltas merged,
  nothing else), what a serving backend loads (:mod:`trainers.sync`).
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
  included), what a checkpoint stores; a LoRA checkpoint is only the adapters plus the frozen base.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from clawgym_env.errors import PolicyError

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TREE_MASK_ATTN = ("sdpa", "eager", "flex_attention")


@dataclasses.dataclass
class PolicyConfig:
    """Which model to train and how. ``model``: ``"tiny"`` (a random-init Qwen3 on the real tokenizer,
    sized by the ``tiny_*`` fields) or a local model directory (``config.json`` + weights)."""

    model: str = "tiny"
    """``tiny`` (a random-init Qwen3 on the real tokenizer, sized by the ``tiny_*`` fields) or a local model
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


def resolve_device(device: str) -> torch.device:
    """``auto`` (or empty) → CUDA when available, else CPU; anything else as given."""
    if device in ("auto", "", None):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _dtype(name: str) -> torch.dtype:
    alias = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    value = getattr(torch, alias.get(name, name), None)
    if not isinstance(value, torch.dtype):
        raise PolicyError(f"unknown dtype {name!r}; use float32, bfloat16 or float16")
    return value


def _load_causal_lm(cfg: PolicyConfig, tokenizer):
    if cfg.attn_implementation not in TREE_MASK_ATTN:
        raise PolicyError(f"attn_implementation {cfg.attn_implementation!r} cannot take a tree mask; use one of "
                          f"{TREE_MASK_ATTN}")
    if cfg.model == "tiny":
        from clawgym_env.policy.tiny import build_tiny_qwen3

        model = build_tiny_qwen3(tokenizer, hidden_size=cfg.tiny_hidden_size, num_layers=cfg.tiny_layers,
                                 heads=cfg.tiny_heads, kv_heads=cfg.tiny_kv_heads, intermediate=cfg.tiny_intermediate,
                                 seed=cfg.seed)
        model.config._attn_implementation = cfg.attn_implementation
        return model.to(_dtype(cfg.dtype))
    path = Path(cfg.model).expanduser()
    if not (path / "config.json").is_file():
        raise PolicyError(f"policy.model {cfg.model!r} is neither 'tiny' nor a model directory with config.json")
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=_dtype(cfg.dtype),
                                                    attn_implementation=cfg.attn_implementation)
    except Exception as exc:
        raise PolicyError(f"could not load a causal LM from {path}: {exc}") from exc


def _tokenizer_for(cfg: PolicyConfig):
    from clawgym_env.policy.tokenizer import load_tokenizer

    path = Path(cfg.model).expanduser()
    if cfg.model != "tiny" and ((path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()):
        return load_tokenizer(path)
    return load_tokenizer()


class TrainablePolicy:
    """A causal LM being trained (see the module invariants)."""

    def __init__(self, config: PolicyConfig | None = None, tokenizer=None, model=None) -> None:
        self.config = config or PolicyConfig()
        self.tokenizer = tokenizer if tokenizer is not None else _tokenizer_for(self.config)
        self.device = resolve_device(self.config.device)
        lm = model if model is not None else _load_causal_lm(self.config, self.tokenizer)
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

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The module's weights (what a checkpoint stores)."""
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load weights of this policy's shape; a mismatch is an error naming the keys."""
        missing, unexpected = self.module.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise PolicyError(f"checkpoint does not fit this policy: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]} "
                              "(was it saved with another model or LoRA setting?)")

    @torch.no_grad()
    def serving_state_dict(self) -> dict[str, torch.Tensor]:
        """Plain model names → detached weights, LoRA deltas merged (the module is not modified)."""
        state = self.causal_lm.state_dict()
        if not self.lora:
            return {k: v.detach() for k, v in state.items()}
        from peft.tuners.lora import LoraLayer

        out = {k.replace(".base_layer.", "."): v.detach().clone() for k, v in state.items() if ".lora_" not in k}
        for name, mod in self.causal_lm.named_modules():
            if isinstance(mod, LoraLayer) and not mod.merged:
                key = f"{name}.weight"
                for adapter in mod.active_adapters:
                    if adapter in mod.lora_A:
                        out[key] += mod.get_delta_weight(adapter).to(out[key].dtype)  # type: ignore[attr-defined]
        return out

    # -- reference model for a KL penalty ---------------------------------------------------------
    def freeze_reference(self) -> None:
        """Take the reference weights now (full fine-tuning only; LoRA's reference is the frozen base)."""
        if not self.lora:
            ref = copy.deepcopy(self.causal_lm)
            ref.requires_grad_(False)
            self._reference = ref.eval()

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
        """A plain model directory (LoRA merged) loadable by ``TransformersPolicy.from_pretrained``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if self.lora:
            plain = copy.deepcopy(self.module).merge_and_unload()
        else:
            plain = self.causal_lm
        plain.save_pretrained(str(out))
        self.tokenizer.save_pretrained(str(out))
        return out

    def serving_copy(self):
        """A separate plain causal LM holding the current (merged) weights, in eval mode."""
        if self.lora:
            plain = copy.deepcopy(self.module).merge_and_unload()
        else:
            plain = copy.deepcopy(self.causal_lm)
        if self.config.gradient_checkpointing:
            plain.gradient_checkpointing_disable()
        plain.requires_grad_(False)
        return plain.eval()
