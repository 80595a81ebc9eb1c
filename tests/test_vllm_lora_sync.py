"""LoRA adapter-only sync against a real vLLM engine (the ``vllm`` stage: ``bash scripts/test_vllm.sh``).

A tiny Qwen3 (tied embeddings, which an in-place reload of merged weights cannot update) with LoRA adapters is served
by an engine started by :func:`trainers.rollouts.generation.open_generation` (``sync: auto`` picks ``lora``): the engine
serves the frozen base and hot-loads the adapters (``/v1/load_lora_adapter``). Trained one step and pushed, the
engine's logprobs for a fixed prompt equal the trainer's merged policy's, before and after, within the tolerance of
the other vLLM sync tests (1e-4, fp32 on the CPU), and the step moved them (so the check is not vacuous).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from clawgym_env.errors import PolicyError  # noqa: E402
from trainers.policy import PolicyConfig, TrainablePolicy  # noqa: E402

IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]])


def _vllm_missing() -> str | None:
    from clawgym_env.policy.vllm.server import vllm_python

    try:
        vllm_python()
    except PolicyError as exc:
        if os.environ.get("CLAWGYM_REQUIRE_VLLM") == "1":
            raise RuntimeError(f"CLAWGYM_REQUIRE_VLLM=1 but vLLM is missing: {exc}") from exc
        return f"vLLM is not installed: {exc}"
    return None


def _train_step(policy: TrainablePolicy) -> None:
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=5e-2)
    logits = policy.causal_lm(input_ids=IDS).logits
    torch.nn.functional.cross_entropy(logits[0, :-1], IDS[0, 1:]).backward()
    opt.step()


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(_vllm_missing() is not None, reason=str(_vllm_missing()))
def test_vllm_samples_with_the_adapter_synced_by_the_trainer(tmp_path):
    from clawgym_env.policy.base import GenerationContext, SamplingParams
    from clawgym_env.policy.chat_format import render_prompt_ids
    from trainers.rollouts.generation import GenerationConfig, open_generation

    cfg = PolicyConfig(model="tiny", device="cpu", seed=0, tiny_heads=2, tiny_kv_heads=1, lora_rank=4)
    policy = TrainablePolicy(cfg)
    assert policy.causal_lm.config.tie_word_embeddings  # the case merged in-place syncs cannot serve
    gen_cfg = GenerationConfig(backend="vllm", dtype="float32", enforce_eager=True, kv_cache_gib=1)
    ids = render_prompt_ids(policy.tokenizer, [{"role": "user", "content": "List the files, please."}])

    def trainer_logprobs(out_ids: list[int]) -> list[float]:
        policy.module.eval()
        with torch.no_grad():
            logits = policy.causal_lm(input_ids=torch.tensor([ids + out_ids])).logits
        policy.module.train()
        logp = torch.log_softmax(logits[0, len(ids) - 1:-1, :policy.vocab_limit].float(), dim=-1)
        return logp.gather(1, torch.tensor(out_ids)[:, None])[:, 0].tolist()

    def worst(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    with open_generation(gen_cfg, policy, tmp_path, max_context_tokens=2048) as sync:
        assert sync.method == "lora"
        server = sync.servers[0]
        assert "--enable-lora" in server.command()
        params = SamplingParams(max_tokens=20, temperature=1.0, seed=3)
        first = sync.serving.generate(ids, params, GenerationContext(episode_id="before"))
        assert first.policy_version == 0 and len(first.token_ids) == 20
        assert sync.engines[0].model == "trainee-lora-v0"
        assert worst(first.logprobs, trainer_logprobs(first.token_ids)) < 1e-4
        _train_step(policy)
        with sync.updating():
            assert sync.push(policy, 1) == 1
        second = sync.serving.generate(ids, params, GenerationContext(episode_id="after"))
        assert sync.engines[0].model == "trainee-lora-v1"
        assert sync.last["weight_sync_s"] > 0
        served = (tmp_path / "serving").iterdir()
        folders = sorted(p.name for p in served if p.is_dir())
        assert folders == ["lora-v0", "lora-v1", "v0"]  # one full folder (the base), adapters per version
        assert not (tmp_path / "serving" / "v1").exists()
    assert second.policy_version == 1
    assert worst(second.logprobs, trainer_logprobs(second.token_ids)) < 1e-4
    assert worst(first.logprobs, trainer_logprobs(first.token_ids)) > 1e-2  # the step moved the logprobs
