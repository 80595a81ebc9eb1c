"""The typed report of ``bench/gpu_smoke.py`` (one JSON object, printed and written under ``--out``) and the model
shapes and pack sizes it runs.

Every field is required: a report missing one does not validate (``SmokeReport.model_validate_json``), so a result
file under ``bench/results/`` is complete or rejected.
"""

from __future__ import annotations

from pydantic import BaseModel

BUDGET_S = {"full": 480.0, "tiny": 120.0}
TOLERANCES = {"bfloat16": (0.05, 0.1, 0.99), "float32": (1e-4, 1e-3, 0.9999)}  # logprob abs, grad rel err, cosine


class Shape(BaseModel, frozen=True):
    """A model shape, written as the ``config.json`` a hub checkpoint of it would carry."""

    name: str
    moe: bool = False
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie: bool
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0

    def config_json(self) -> dict[str, object]:
        """The model's ``config.json`` (Qwen3's published fields: rope theta 1e6, 40,960 positions)."""
        cfg: dict[str, object] = {
            "architectures": ["Qwen3MoeForCausalLM" if self.moe else "Qwen3ForCausalLM"],
            "model_type": "qwen3_moe" if self.moe else "qwen3", "hidden_size": self.hidden,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate, "vocab_size": self.vocab,
            "tie_word_embeddings": self.tie, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
            "initializer_range": 0.02, "use_cache": True,
            "bos_token_id": 151643 if self.vocab > 151645 else 0, "eos_token_id": 151645 if self.vocab > 151645 else 1,
            "max_window_layers": self.layers, "use_sliding_window": False}
        if self.moe:
            cfg.update(num_experts=self.experts, num_experts_per_tok=self.experts_per_token, decoder_sparse_step=1,
                       moe_intermediate_size=self.moe_intermediate, norm_topk_prob=True, mlp_only_layers=[],
                       router_aux_loss_coef=0.001, output_router_logits=False)
        return cfg


SHAPES = {
    "full": {"dense": Shape(name="qwen3-1.7b", hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128,
                            intermediate=6144, vocab=151936, tie=True),
             "moe": Shape(name="qwen3-moe-small", moe=True, hidden=1024, layers=12, heads=16, kv_heads=4, head_dim=128,
                          intermediate=3072, vocab=151936, tie=False, experts=64, experts_per_token=8,
                          moe_intermediate=384)},
    "tiny": {"dense": Shape(name="tiny-qwen3", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                            vocab=2048, tie=True),
             "moe": Shape(name="tiny-qwen3-moe", moe=True, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                          intermediate=128, vocab=2048, tie=False, experts=4, experts_per_token=2,
                          moe_intermediate=32)},
}


class Sizes(BaseModel, frozen=True):
    """The synthetic GRPO group: ``episodes`` sharing a system prompt, pairs sharing their first call, calls of
    ``output_tokens`` sampled + ``tool_tokens`` of tool result until the tree holds >= the pack's tokens."""

    pack_tokens: int
    """the update's pack holds at least this many tokens"""
    compare_tokens: int
    """the flex-vs-dense pack holds at least this many"""
    system_tokens: int
    episodes: int
    output_tokens: int
    tool_tokens: int


SIZES = {"full": Sizes(pack_tokens=32768, compare_tokens=4096, system_tokens=4096, episodes=8, output_tokens=256,
                       tool_tokens=192),
         "tiny": Sizes(pack_tokens=1024, compare_tokens=384, system_tokens=128, episodes=4, output_tokens=32,
                       tool_tokens=24)}


class Phases(BaseModel):
    """Seconds per phase (device-synchronised); the update's split is that of the last update."""

    meta_init_s: float
    materialize_s: float
    build_groups_s: float
    pack_s: float
    block_mask_s: float
    compare_s: float
    first_update_s: float
    score_forward_s: float
    train_forward_s: float
    train_backward_s: float
    optimizer_step_s: float
    update_s: float


class Comparison(BaseModel):
    """flex_attention (block mask) against the dense tree mask on one pack, on the same weights."""

    tokens: int
    trainable_tokens: int
    candidate: str
    reference: str
    logprob_max_abs_diff: float
    logprob_mean_abs_diff: float
    flex_backward: bool
    flex_backward_note: str | None
    grad_candidate: str
    grad_rel_err: float
    grad_cosine: float
    tol_logprob_abs: float
    tol_grad_rel_err: float
    min_grad_cosine: float
    ok: bool


class UpdateReport(BaseModel):
    """The GRPO update over the big pack."""

    attn_implementation: str
    mask_form: str
    packed_tokens: int
    trainable_tokens: int
    pairs: int
    episodes: int
    calls: int
    updates: int
    loss: float
    grad_norm: float
    weights_changed: bool
    tokens_per_s: float
    update_tokens_per_s: float


class ModelReport(BaseModel):
    """One model shape's run."""

    shape: Shape
    architecture: str
    parameters: int
    init: str
    phases: Phases
    flex_vs_dense: Comparison
    update: UpdateReport
    peak_memory_gib: float
    ok: bool


class DeviceInfo(BaseModel):
    """Where it ran."""

    type: str
    name: str
    memory_gib: float | None
    torch: str
    transformers: str
    peft: str | None
    python: str


class SmokeReport(BaseModel):
    """The one JSON object the smoke prints and writes."""

    mode: str
    sizes: Sizes
    device: DeviceInfo
    dtype: str
    gradient_checkpointing: bool
    peak_memory_kind: str
    models: list[ModelReport]
    failures: dict[str, str]
    """shape name -> the exception that stopped its run (with its traceback on stderr); the other shapes still ran"""
    wall_s: float
    budget_s: float
    within_budget: bool
    ok: bool
