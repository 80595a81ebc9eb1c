"""A tiny random-init Qwen3 (dense or MoE) for tests and demos: the real architecture, tokenizer and ids, no weights.

Invariants: the model is a ``Qwen3ForCausalLM`` (or, from :func:`build_tiny_qwen3_moe`, a
``Qwen3MoeForCausalLM`` whose every decoder layer is a sparse mixture of experts) whose embedding
covers the real Qwen3 tokenizer (``vocab_size`` is ``len(tokenizer)`` rounded up to a multiple of
128; the extra rows are padding no backend samples); its special ids are the tokenizer's (``eos`` =
``<|im_end|>``, ``bos``/``pad`` = ``<|endoftext|>``); equal arguments give bit-identical weights, and
building it leaves the global torch RNG untouched. It builds in seconds on a CPU and its output is
random text.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from clawgym_env.errors import PolicyError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, Qwen3Config, Qwen3MoeConfig

    from clawgym_env.policy.hf import CausalLM, Tokenizer

VOCAB_MULTIPLE = 128


def round_vocab(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (embedding sizes friendly to matmul kernels)."""
    return ((int(n) + multiple - 1) // multiple) * multiple


def tiny_qwen3_config(tokenizer: Tokenizer, hidden_size: int = 64, num_layers: int = 2, heads: int = 4,
                      kv_heads: int = 2, intermediate: int = 128, max_position_embeddings: int = 32768) -> Qwen3Config:
    """The ``Qwen3Config`` of :func:`build_tiny_qwen3`."""
    from transformers import Qwen3Config

    if hidden_size % heads:
        raise PolicyError(f"hidden_size {hidden_size} is not a multiple of heads {heads}")
    if heads % kv_heads:
        raise PolicyError(f"heads {heads} is not a multiple of kv_heads {kv_heads}")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return Qwen3Config(
        vocab_size=round_vocab(len(tokenizer)),
        hidden_size=hidden_size,
        intermediate_size=intermediate,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden_size // heads,
        max_position_embeddings=max_position_embeddings,
        max_window_layers=num_layers,
        tie_word_embeddings=True,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
    )


def build_tiny_qwen3(tokenizer: Tokenizer = None, hidden_size: int = 64, num_layers: int = 2, heads: int = 4,
                     kv_heads: int = 2, intermediate: int = 128, seed: int = 0,
                     save_dir: str | Path | None = None) -> CausalLM:
    """Build a random-init ``Qwen3ForCausalLM`` (eval mode, float32, CPU).

    ``tokenizer``: the Qwen3 tokenizer (default: the project's). With ``save_dir`` the model and the
    tokenizer are written there by ``save_pretrained``, so ``TransformersPolicy.from_pretrained(save_dir)``
    loads the same model back.
    """
    try:
        from transformers import Qwen3ForCausalLM
    except ImportError as exc:  # pragma: no cover - optional dependency
        raise PolicyError("the tiny Qwen3 needs PyTorch: pip install 'clawgym[torch]'") from exc
    if tokenizer is None:
        from clawgym_env.policy.tokenizer import load_tokenizer

        tokenizer = load_tokenizer()
    config = tiny_qwen3_config(tokenizer, hidden_size, num_layers, heads, kv_heads, intermediate)
    return _seeded_model(Qwen3ForCausalLM, config, tokenizer, seed, save_dir)


def tiny_qwen3_moe_config(tokenizer: Tokenizer, hidden_size: int = 64, num_layers: int = 2, heads: int = 4,
                          kv_heads: int = 2, experts: int = 4, experts_per_token: int = 2, moe_intermediate: int = 32,
                          max_position_embeddings: int = 32768) -> Qwen3MoeConfig:
    """The ``Qwen3MoeConfig`` of :func:`build_tiny_qwen3_moe`: the dense config's attention and ids, and a
    routed MoE block (``experts`` experts of width ``moe_intermediate``, top-``experts_per_token``) in every layer."""
    from transformers import Qwen3MoeConfig

    if not 0 < experts_per_token <= experts:
        raise PolicyError(f"experts_per_token {experts_per_token} must be in 1..experts ({experts})")
    dense = tiny_qwen3_config(tokenizer, hidden_size, num_layers, heads, kv_heads, moe_intermediate,
                              max_position_embeddings)
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")
    return Qwen3MoeConfig(**{k: getattr(dense, k) for k in keep}, intermediate_size=moe_intermediate,
                          moe_intermediate_size=moe_intermediate, num_experts=experts,
                          num_experts_per_tok=experts_per_token, decoder_sparse_step=1, mlp_only_layers=[],
                          norm_topk_prob=True)


def build_tiny_qwen3_moe(tokenizer: Tokenizer = None, hidden_size: int = 64, num_layers: int = 2, heads: int = 4,
                         kv_heads: int = 2, experts: int = 4, experts_per_token: int = 2, moe_intermediate: int = 32,
                         seed: int = 0, save_dir: str | Path | None = None) -> CausalLM:
    """Build a random-init ``Qwen3MoeForCausalLM`` (eval mode, float32, CPU), like :func:`build_tiny_qwen3`.

    transformers holds each layer's experts as fused 3-D parameters (``mlp.experts.gate_up_proj``,
    ``mlp.experts.down_proj``); ``save_pretrained`` writes them per expert (``mlp.experts.<i>.gate_proj.weight``
    ...), the layout vLLM and ``from_pretrained`` read.
    """
    try:
        from transformers import Qwen3MoeForCausalLM
    except ImportError as exc:  # pragma: no cover - optional dependency
        raise PolicyError("the tiny Qwen3-MoE needs PyTorch: pip install 'clawgym[torch]'") from exc
    if tokenizer is None:
        from clawgym_env.policy.tokenizer import load_tokenizer

        tokenizer = load_tokenizer()
    config = tiny_qwen3_moe_config(tokenizer, hidden_size, num_layers, heads, kv_heads, experts, experts_per_token,
                                   moe_intermediate)
    return _seeded_model(Qwen3MoeForCausalLM, config, tokenizer, seed, save_dir)


def _seeded_model(model_class: Callable[..., CausalLM], config: PretrainedConfig, tokenizer: Tokenizer,
                  seed: int, save_dir: str | Path | None) -> CausalLM:
    """``model_class(config)`` initialised under ``seed`` (the global RNG untouched), float32, eval mode; saved with
    the tokenizer into ``save_dir`` when given."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = model_class(config)
    model = model.float().eval()
    if save_dir is not None:
        out = Path(save_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    return model
