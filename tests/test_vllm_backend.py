"""VLLMPolicy against a REAL vLLM server (CPU build, its own venv) serving a tiny random Qwen3.

The server tests are marked ``vllm`` and skip, with the reason, when the venv built by
``scripts/vllm_env.sh`` is missing. One server is started per module (a minute or two on a CPU, mostly
vLLM importing itself; ``enforce_eager`` skips its compile step) and restarted once by the tied-weights
sync test; the tests run in file order and the last one stops it.

The tiny models use head_dim 32 (vLLM's CPU attention has no kernel for the default tiny head_dim 16).
The served one has untied input/output embeddings, so the in-place weight sync is trustworthy for it;
the tied one exercises the restart path (see clawgym_env.policy.vllm.server).
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import pytest

from clawgym_env.errors import PolicyError
from clawgym_env.policy import make_policy
from clawgym_env.policy.base import GenerationContext, SamplingParams
from clawgym_env.policy.vllm.backend import VLLMPolicy, normalize_base_url
from clawgym_env.policy.vllm.server import VLLMServer, free_port, vllm_python

CTX = GenerationContext()
TOL = 1e-4  # logprob tolerance vLLM vs transformers, fp32 on CPU; measured max |diff| here: ~6e-6


def _venv_missing() -> str | None:
    try:
        vllm_python()
    except PolicyError as exc:
        return f"vLLM is not installed: {exc}"
    return None


def server_test(fn):
    """Marks a test that needs the real server: ``vllm``, ``slow``, skipped when the venv is missing —
    unless ``CLAWGYM_REQUIRE_VLLM=1`` (the vLLM stage, ``scripts/test_vllm.sh``), where it fails instead."""
    missing = _venv_missing()
    if missing and os.environ.get("CLAWGYM_REQUIRE_VLLM") == "1":
        raise RuntimeError(f"CLAWGYM_REQUIRE_VLLM=1 but {missing}; build it with bash scripts/vllm_env.sh")
    fn = pytest.mark.skipif(missing is not None, reason=str(missing))(fn)
    return pytest.mark.vllm(pytest.mark.slow(fn))


# -- no server needed -----------------------------------------------------------------------------
def test_urls_and_specs_without_a_server(tmp_path):
    assert normalize_base_url("http://h:1/v1/") == "http://h:1" == normalize_base_url("http://h:1")
    with pytest.raises(PolicyError, match="http"):
        normalize_base_url("h:1")
    port = free_port()  # nothing listens there
    for spec in (f"http://127.0.0.1:{port}/v1", f"vllm:http://127.0.0.1:{port}"):
        with pytest.raises(PolicyError, match="no vLLM server answers"):
            make_policy(spec, retries=1, backoff_s=0.01)
    with pytest.raises(PolicyError, match="bad vLLM spec"):
        make_policy(f"vllm:{tmp_path / 'missing'}")
    with pytest.raises(PolicyError, match="config.json"):
        make_policy(f"vllm:{tmp_path}")
    with pytest.raises(PolicyError, match="vllm_env.sh"):
        vllm_python(tmp_path / "no-venv")


# -- fixtures: models, the server, the reference ----------------------------------------------------
def _tiny(tokenizer, out: Path, tied: bool) -> Path:
    import torch

    from clawgym_env.policy.tiny import build_tiny_qwen3

    model = build_tiny_qwen3(tokenizer, heads=2, kv_heads=1, seed=0)
    if not tied:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("vllm-models")
    return {"untied": _tiny(tokenizer, root / "untied", tied=False),
            "tied": _tiny(tokenizer, root / "tied", tied=True)}


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    if _venv_missing():
        pytest.skip(_venv_missing())
    log = tmp_path_factory.mktemp("vllm-log") / "server.log"
    srv = VLLMServer(models["untied"], max_model_len=2048, enforce_eager=True, log_path=log)
    srv.start()
    print(f"\n[vllm] server started in {srv.start_seconds:.1f} s (log {log})")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def policy(server):
    pol = server.policy()
    yield pol
    pol.close()


def _reference(model_dir):
    from clawgym_env.policy.transformers_backend import TransformersPolicy

    return TransformersPolicy.from_pretrained(model_dir, device="cpu")


@pytest.fixture(scope="module")
def reference(models):
    return _reference(models["untied"])


@pytest.fixture(scope="module")
def prompt(tokenizer):
    from clawgym_env.policy.chat_format import render_prompt_ids

    return render_prompt_ids(tokenizer, [{"role": "user", "content": "List the files, please."}])


def recomputed(ref, prompt_ids, out_ids, temperature=1.0, top_p=1.0):
    """(log p(out_ids[i]) as the sampler defines it, the argmax ids) from one uncached forward of the
    TransformersPolicy ``ref`` over prompt + output."""
    import torch

    from clawgym_env.policy.transformers_backend import _nucleus

    with torch.no_grad():
        logits = ref.model(input_ids=torch.tensor([prompt_ids + out_ids]), use_cache=False).logits
    logits = logits[0, len(prompt_ids) - 1: -1, : len(ref.tokenizer)].float()
    argmax = logits.argmax(-1).tolist()
    if temperature > 1e-5:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    if top_p >= 1.0 or temperature <= 1e-5:
        return logp.gather(1, torch.tensor(out_ids)[:, None])[:, 0].tolist(), argmax
    values = []
    for i, tok in enumerate(out_ids):
        kept, ids = _nucleus(logp[i], top_p)
        pos = (ids == tok).nonzero()
        values.append(float(kept[pos[0, 0]]) if len(pos) else float("-inf"))
    return values, argmax


def max_diff(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


# -- generation ---------------------------------------------------------------------------------------
@server_test
def test_generate_returns_sampled_ids_and_logprobs(policy, prompt, tokenizer):
    gen = policy.generate(prompt, SamplingParams(max_tokens=24, temperature=1.0, seed=11), CTX)
    assert len(gen.token_ids) == len(gen.logprobs) == 24 and gen.finish_reason == "length"
    assert all(isinstance(t, int) and 0 <= t < len(tokenizer) for t in gen.token_ids)
    assert all(math.isfinite(v) and v <= 0.0 for v in gen.logprobs)
    assert tokenizer.decode(gen.token_ids).strip(), "the sampled ids decode to text"
    assert gen.policy_version == policy.version == 0 and gen.token_exact
    again = policy.generate(prompt, SamplingParams(max_tokens=24, temperature=1.0, seed=11), CTX)
    other = policy.generate(prompt, SamplingParams(max_tokens=24, temperature=1.0, seed=12), CTX)
    assert again.token_ids == gen.token_ids and other.token_ids != gen.token_ids
    assert policy.generate(prompt, SamplingParams(max_tokens=0), CTX).token_ids == []


@server_test
def test_stop_token_is_included(server, policy, prompt, tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in policy.stop_token_ids
    assert im_end in policy.request_body(prompt, SamplingParams(), 5)["stop_token_ids"]
    first = policy.generate(prompt, SamplingParams(max_tokens=1, temperature=0), CTX).token_ids[0]
    forced = server.policy(stop_token_ids=[first, im_end])
    out = forced.generate(prompt, SamplingParams(max_tokens=10, temperature=0), CTX)
    forced.close()
    assert out.token_ids == [first] and out.finish_reason == "stop" and len(out.logprobs) == 1
    # a real <|im_end|> stop is in test_weight_sync_in_place (a model made to say it)


@server_test
def test_logprobs_match_transformers_recomputation(policy, reference, tokenizer):
    from clawgym_env.policy.chat_format import render_prompt_ids

    worst = 0.0
    for i, (temperature, top_p) in enumerate([(1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (0.0, 1.0)]):
        ids = render_prompt_ids(tokenizer, [{"role": "user", "content": f"Question {i}: what is in notes/?"}])
        params = SamplingParams(max_tokens=40, temperature=temperature, top_p=top_p, seed=i)
        gen = policy.generate(ids, params, CTX)
        expected, argmax = recomputed(reference, ids, gen.token_ids, temperature, top_p)
        assert all(math.isfinite(v) for v in expected), "vLLM sampled a token outside the top-p nucleus"
        worst = max(worst, max_diff(gen.logprobs, expected))
        if temperature == 0.0:
            assert gen.token_ids == argmax, "greedy vLLM tokens differ from the transformers argmax"
    print(f"\n[vllm] max |logprob(vLLM) - logprob(transformers)| = {worst:.2e}")
    assert worst < TOL


@server_test
def test_concurrent_generations(policy, reference, prompt):
    results: dict[int, object] = {}

    def work(seed: int) -> None:
        results[seed] = policy.generate(prompt, SamplingParams(max_tokens=16, seed=seed), CTX)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1, 2, 3]
    assert len({tuple(g.token_ids) for g in results.values()}) == 4
    for gen in results.values():
        assert max_diff(gen.logprobs, recomputed(reference, prompt, gen.token_ids)[0]) < TOL


@server_test
def test_context_limit_and_bad_requests(policy, tokenizer):
    hello = tokenizer.encode("hello", add_special_tokens=False)[0]
    near_full = [hello] * (policy.max_model_len - 3)
    gen = policy.generate(near_full, SamplingParams(max_tokens=50, temperature=0), CTX)
    assert 1 <= len(gen.token_ids) <= 3 and gen.finish_reason in ("length", "stop")
    with pytest.raises(PolicyError, match="does not fit"):
        policy.generate([hello] * policy.max_model_len, SamplingParams(max_tokens=5), CTX)
    with pytest.raises(PolicyError, match="vocabulary"):
        policy.generate([hello, 10**7], SamplingParams(max_tokens=5), CTX)
    with pytest.raises(PolicyError, match="empty prompt"):
        policy.generate([], SamplingParams(), CTX)


@server_test
def test_tokenizer_mismatch_is_refused(server):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "Hello": 1}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    other = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]", eos_token="[UNK]")
    with pytest.raises(PolicyError, match="tokenizer differs"):
        VLLMPolicy(server.url, tokenizer=other)


# -- a whole episode ----------------------------------------------------------------------------------
@server_test
def test_mini_episode_through_the_proxy_is_token_exact(policy, reference, builtin_suite, tmp_path):
    from clawgym_env.envs.runtime import Runtime
    from clawgym_env.plugins import make_harness

    task = builtin_suite.tasks[0]
    sampling = {"max_tokens": 48, "temperature": 1.0, "top_p": 1.0, "seed": 4321}
    with Runtime(policy, out_dir=tmp_path) as rt:
        res = rt.run(task, make_harness("mini"), sampling=sampling)
    rec = res.record
    assert not rec.is_infra_failure, (rec.status, rec.error, rec.logs)
    assert rec.num_calls >= 1 and rec.num_calls == len(res.calls), (rec.status, rec.error, rec.logs)
    for call in res.calls:
        assert call.token_exact, call.token_exact_reason
        assert call.policy_name == policy.name and call.policy_version == 0
        assert call.prompt_token_ids and call.output_token_ids
        assert len(call.output_logprobs) == len(call.output_token_ids) <= 48
        # the ids are vLLM's: the server, asked again with the same prompt ids and seed, gives them back
        same = SamplingParams(max_tokens=48, temperature=1.0, seed=4321)
        again = policy.generate(call.prompt_token_ids, same, CTX)
        assert again.token_ids[:len(call.output_token_ids)] == call.output_token_ids
        assert max_diff(again.logprobs[:len(call.output_logprobs)], call.output_logprobs) < TOL
        expected, _ = recomputed(reference, call.prompt_token_ids, call.output_token_ids)
        assert max_diff(call.output_logprobs, expected) < TOL


# -- weight sync --------------------------------------------------------------------------------------
@server_test
def test_weight_sync_in_place(server, policy, reference, models, tmp_path, tokenizer):
    import torch

    plain = tokenizer.encode("Hello there, agent", add_special_tokens=False)  # no <|im_end|> in the prompt
    greedy = SamplingParams(max_tokens=12, temperature=0)
    before = policy.generate(plain, greedy, CTX)
    updated = _reference(models["untied"])
    try:
        with torch.no_grad():  # 1) scale one layer
            updated.model.model.layers[0].mlp.down_proj.weight.mul_(5.0)
        updated.model.save_pretrained(tmp_path / "v1")
        assert policy.sync_weights(tmp_path / "v1") == 1 == policy.version
        assert policy.last_sync["method"] == "inplace"
        print(f"\n[vllm] in-place weight sync took {policy.last_sync['seconds']:.2f} s")
        after = policy.generate(plain, greedy, CTX)
        assert after.policy_version == 1
        expected, argmax = recomputed(updated, plain, after.token_ids, temperature=0.0)
        stale, _ = recomputed(reference, plain, after.token_ids, temperature=0.0)
        assert after.token_ids == argmax  # the new weights' greedy choice
        assert max_diff(after.logprobs, expected) < TOL  # served: the new weights ...
        assert max_diff(after.logprobs, stale) > 100 * TOL  # ... not the old ones
        assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)

        # 2) make <|im_end|> the greedy first token: its output row = 2 x the current argmax's row
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        with torch.no_grad():
            head = updated.model.lm_head.weight
            head[im_end] = 2.0 * head[after.token_ids[0]]
        updated.model.save_pretrained(tmp_path / "v2")
        assert policy.sync_weights(tmp_path / "v2") == 2
        stopped = policy.generate(plain, greedy, CTX)
        assert stopped.token_ids == [im_end] and stopped.finish_reason == "stop"
        assert stopped.policy_version == 2 and stopped.logprobs[0] <= 0.0
    finally:  # serve the original weights again
        policy.sync_weights(models["untied"])
    assert policy.generate(plain, greedy, CTX).token_ids == before.token_ids
    with pytest.raises(PolicyError, match="config.json"):
        policy.sync_weights(tmp_path / "nothing")
    assert policy.version == 3


@server_test
def test_weight_sync_restarts_for_tied_embeddings(server, policy, models, tokenizer):
    ok, why = server.inplace_ok(models["tied"])
    assert not ok and "tie" in why
    with pytest.raises(PolicyError, match="tie"):
        server.reload(models["tied"], method="inplace")
    plain = tokenizer.encode("Tied weights now", add_special_tokens=False)
    version = policy.version
    assert policy.sync_weights(models["tied"]) == version + 1
    assert policy.last_sync["method"] == "restart" and server.running
    print(f"\n[vllm] weight sync by restart took {policy.last_sync['seconds']:.1f} s")
    gen = policy.generate(plain, SamplingParams(max_tokens=8, seed=3), CTX)
    assert gen.policy_version == version + 1
    assert max_diff(gen.logprobs, recomputed(_reference(models["tied"]), plain, gen.token_ids)[0]) < TOL


def _live_group_members(pgid: int) -> list[str]:
    """Processes of group ``pgid`` that are not zombies (exited children wait for init to reap them)."""
    live = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(stat[:80])
    return live


@server_test
def test_stop_kills_the_process_group_and_is_idempotent(server, policy, prompt):
    pgid = server.pid
    assert server.running and pgid and _live_group_members(pgid)
    server.stop()
    assert not server.running
    assert _live_group_members(pgid) == []
    server.stop()  # idempotent
    policy.retries = 1
    with pytest.raises(PolicyError, match="no vLLM server answers"):
        policy.generate(prompt, SamplingParams(max_tokens=2), CTX)
