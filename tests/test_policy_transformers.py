"""TransformersPolicy on a tiny random Qwen3: exact logprobs, KV cache, stops, seeds, weight sync."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from clawgym_env.errors import PolicyError  # noqa: E402
from clawgym_env.policy import make_policy  # noqa: E402
from clawgym_env.policy.base import GenerationContext, SamplingParams  # noqa: E402
from clawgym_env.policy.chat_format import render_prompt_ids  # noqa: E402
from clawgym_env.policy.tiny import build_tiny_qwen3  # noqa: E402
from clawgym_env.policy.transformers_backend import TransformersPolicy, _nucleus  # noqa: E402

CTX = GenerationContext()


@pytest.fixture(scope="module")
def policy(tokenizer):
    return TransformersPolicy(build_tiny_qwen3(tokenizer, seed=0), tokenizer)


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return render_prompt_ids(tokenizer, [{"role": "user", "content": "List the files, please."}])


def full_logits(policy, ids):
    """Uncached full forward over ``ids``: float32 logits over the real vocabulary, every position."""
    with torch.no_grad():
        out = policy.model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0, :, : len(policy.tokenizer)].float()


def test_tiny_model_shape(tokenizer):
    model = build_tiny_qwen3(tokenizer)
    assert model.config.vocab_size % 128 == 0 and model.config.vocab_size >= len(tokenizer)
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    again = build_tiny_qwen3(tokenizer)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_seeded_generation_is_deterministic(policy, prompt):
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=7)
    a, b = policy.generate(prompt, params, CTX), policy.generate(prompt, params, CTX)
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    c = policy.generate(prompt, SamplingParams(max_tokens=24, temperature=1.0, seed=8), CTX)
    assert c.token_ids != a.token_ids
    assert len(a.token_ids) == len(a.logprobs)
    assert all(t < len(policy.tokenizer) for t in a.token_ids)


def test_logprobs_match_full_forward(policy, prompt):
    gen = policy.generate(prompt, SamplingParams(max_tokens=20, temperature=1.0, top_p=1.0, seed=3), CTX)
    logits = full_logits(policy, prompt + gen.token_ids)
    logp = torch.log_softmax(logits[len(prompt) - 1: -1], dim=-1)
    expected = logp.gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)


def test_logprobs_under_temperature_and_top_p(policy, prompt):
    temperature, top_p = 0.5, 0.3
    gen = policy.generate(prompt, SamplingParams(max_tokens=12, temperature=temperature, top_p=top_p, seed=5), CTX)
    logits = full_logits(policy, prompt + gen.token_ids)
    for i, tok in enumerate(gen.token_ids):
        logp = torch.log_softmax(logits[len(prompt) - 1 + i] / temperature, dim=-1)
        kept, ids = _nucleus(logp, top_p)
        pos = (ids == tok).nonzero()
        assert len(pos) == 1, "sampled a token outside the nucleus"
        assert abs(float(kept[pos[0, 0]]) - gen.logprobs[i]) < 1e-4


def test_kv_cache_matches_uncached_greedy(policy, prompt):
    gen = policy.generate(prompt, SamplingParams(max_tokens=16, temperature=0.0), CTX)
    ids, lps = list(prompt), []
    for _ in range(16):
        logits = full_logits(policy, ids)[-1]
        tok = int(torch.argmax(logits))
        lps.append(float(torch.log_softmax(logits, -1)[tok]))
        ids.append(tok)
    assert gen.token_ids == ids[len(prompt):]
    # greedy reports the logprob under the unmodified distribution (documented choice)
    assert torch.allclose(torch.tensor(gen.logprobs), torch.tensor(lps), atol=1e-4)


def test_nucleus_is_the_shortest_prefix_reaching_top_p():
    logp = torch.log_softmax(torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0]), -1)  # p ≈ .636 .234 .086 .032 .012
    assert _nucleus(logp, 0.5)[1].tolist() == [0]
    kept, ids = _nucleus(logp, 0.9)
    assert ids.tolist() == [0, 1, 2] and abs(float(kept.exp().sum()) - 1.0) < 1e-6


def test_length_and_stop(policy, prompt, tokenizer):
    gen = policy.generate(prompt, SamplingParams(max_tokens=5, seed=1), CTX)
    assert len(gen.token_ids) == 5 and gen.finish_reason == "length"
    assert policy.generate(prompt, SamplingParams(max_tokens=0), CTX).token_ids == []
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    greedy = policy.generate(prompt, SamplingParams(max_tokens=1, temperature=0), CTX).token_ids[0]
    forced = TransformersPolicy(policy.model, tokenizer, stop_token_ids=[greedy, im_end])
    out = forced.generate(prompt, SamplingParams(max_tokens=10, temperature=0), CTX)
    assert out.token_ids == [greedy] and out.finish_reason == "stop"
    with pytest.raises(PolicyError):
        policy.generate([], SamplingParams(), CTX)


def test_version_bumps_on_weight_update(tokenizer, prompt):
    pol = TransformersPolicy(build_tiny_qwen3(tokenizer, seed=0), tokenizer)
    before = pol.generate(prompt, SamplingParams(max_tokens=8, temperature=0), CTX)
    assert pol.version == 0 and before.policy_version == 0
    other = build_tiny_qwen3(tokenizer, seed=1).state_dict()
    assert pol.load_state_dict(other) == 1 and pol.version == 1
    after = pol.generate(prompt, SamplingParams(max_tokens=8, temperature=0), CTX)
    assert after.policy_version == 1 and after.logprobs != before.logprobs
    norm = {k: v for k, v in other.items() if k.endswith("norm.weight")}
    assert pol.update_weights(list(norm.items())) == 2
    with pytest.raises(PolicyError):
        pol.update_weights({"no.such.weight": torch.zeros(1)})
    with pytest.raises(PolicyError):
        pol.load_state_dict(norm)  # strict: a partial dict is refused
    assert pol.version == 2


def test_from_pretrained_round_trip(tokenizer, prompt, tmp_path):
    model = build_tiny_qwen3(tokenizer, seed=2, save_dir=tmp_path / "tiny")
    assert (tmp_path / "tiny" / "config.json").exists() and (tmp_path / "tiny" / "tokenizer.json").exists()
    loaded = TransformersPolicy.from_pretrained(tmp_path / "tiny", device="cpu")
    direct = TransformersPolicy(model, tokenizer)
    params = SamplingParams(max_tokens=10, seed=4)
    assert loaded.generate(prompt, params, CTX).token_ids == direct.generate(prompt, params, CTX).token_ids
    via_spec = make_policy(f"transformers:{tmp_path / 'tiny'}", device="cpu")
    assert via_spec.generate(prompt, params, CTX).token_ids == direct.generate(prompt, params, CTX).token_ids
    with pytest.raises(PolicyError):
        TransformersPolicy.from_pretrained(tmp_path / "nothing-here")


def test_make_policy_specs(tokenizer, tmp_path):
    tiny = make_policy("tiny", tokenizer=tokenizer, hidden_size=32, heads=2, kv_heads=1)
    assert isinstance(tiny, TransformersPolicy) and tiny.model.config.hidden_size == 32
    with pytest.raises(PolicyError, match="vLLM"):
        make_policy("http://localhost:8000/v1")
    with pytest.raises(PolicyError, match="accepted forms"):
        make_policy("gpt-5")
    with pytest.raises(PolicyError):
        make_policy("scripted:bogus", tokenizer=tokenizer)
