"""The remote policy: a policy served over HTTP by token ids, and the ``remote:URL`` client.

What is checked: a remote generation equals the local one id for id, logprob for logprob, with the
same version and finish reason (the scripted expert, whose decision needs the task and the
conversation, and the tiny Qwen3 sampling with a seed); a weight update on the server is seen by the
next call; only holders of the token are served (401, and a PolicyError saying which variable to
set); a server that went away, a malformed request and a failing served policy each end in a clear
error naming the URL or the field; a whole episode through the serving proxy scores as it does locally.
"""

from __future__ import annotations

import shutil

import httpx
import pytest

from clawgym_env.errors import PolicyError
from clawgym_env.policy import make_policy
from clawgym_env.policy.base import GenerationContext, SamplingParams
from clawgym_env.policy.remote import TOKEN_ENV, RemotePolicy, serve_policy
from clawgym_env.policy.scripted import ScriptedPolicy
from clawgym_env.testing import EchoHarness, EchoScriptPolicy, echo_suite
from clawgym_env.testing.policy import FAIL

BASH_TOOL = {"type": "function", "function": {"name": "bash", "description": "run a command",
                                              "parameters": {"type": "object",
                                                             "properties": {"command": {"type": "string"}},
                                                             "required": ["command"]}}}


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return echo_suite(tmp_path_factory.mktemp("echo-suite"))


@pytest.fixture(scope="module")
def tiny(tokenizer):
    pytest.importorskip("torch")
    return make_policy("tiny", tokenizer=tokenizer, seed=11)


def _prompt(tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_scripted_expert_remote_equals_local(tokenizer, suite):
    local = ScriptedPolicy("expert", tokenizer=tokenizer)
    task = suite.tasks[0]
    assert task.expert_path is not None
    messages = [{"role": "user", "content": task.instruction}]
    ctx = GenerationContext(episode_id="ep1", messages=messages, tools=[BASH_TOOL], task=task, harness="echo")
    ids = _prompt(tokenizer, messages)
    params = SamplingParams(max_tokens=256, temperature=0.7)
    with serve_policy(local) as server:
        remote = RemotePolicy(server.url, server.token, tokenizer=tokenizer)
        assert remote.name == local.name and remote.version == local.version == 0
        want, got = local.generate(ids, params, ctx), remote.generate(ids, params, ctx)
        assert got.token_ids == want.token_ids and got.logprobs == want.logprobs
        assert (got.finish_reason, got.policy_version, got.token_exact) == (want.finish_reason, 0, True)
        no_task = GenerationContext(messages=messages, tools=[BASH_TOOL])  # the task travels, or its absence
        without = remote.generate(ids, params, no_task)
        assert without.token_ids == local.generate(ids, params, no_task).token_ids
        assert without.token_ids != got.token_ids, "the task's own script was followed on the server"
        short = remote.generate(ids, SamplingParams(max_tokens=1), ctx)
        assert short.token_ids == want.token_ids[:1] and short.finish_reason == "length"
        remote.close()


def test_tiny_remote_is_token_exact_and_sees_version_bumps(tokenizer, tiny):
    ids = _prompt(tokenizer, [{"role": "user", "content": "Count to three, wörld 🤔"}])
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=5)
    ctx = GenerationContext(episode_id="ep2")
    with serve_policy(tiny) as server:
        remote = RemotePolicy(server.url, server.token, tokenizer=tokenizer)
        v0 = tiny.version
        want, got = tiny.generate(ids, params, ctx), remote.generate(ids, params, ctx)
        assert got.token_ids == want.token_ids and len(got.token_ids) > 0
        assert got.logprobs == want.logprobs  # bit for bit: floats travel in their exact shortest form
        assert got.finish_reason == want.finish_reason and got.policy_version == want.policy_version == v0
        tiny.update_weights({})  # a weight sync on the server's side: the version goes up by one
        after = remote.generate(ids, params, ctx)
        assert after.policy_version == v0 + 1 == remote.version
        assert after.token_ids == want.token_ids  # same weights, same seed
        greedy = SamplingParams(max_tokens=6, temperature=0.0)
        assert remote.generate(ids, greedy, ctx).logprobs == tiny.generate(ids, greedy, ctx).logprobs


def test_only_the_token_holder_is_served(tokenizer, monkeypatch):
    with serve_policy(EchoScriptPolicy(tokenizer)) as server:
        assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
        body = {"prompt_ids": [1, 2], "params": {"max_tokens": 4, "temperature": 1.0, "top_p": 1.0}}
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": server.token}):
            resp = httpx.post(f"{server.url}/generate", json=body, headers=headers)
            assert resp.status_code == 401 and "token" in resp.json()["error"]["message"]
        with pytest.raises(PolicyError, match=f"refused our token.*{TOKEN_ENV}"):
            RemotePolicy(server.url, "wrong", tokenizer=tokenizer)
        unchecked = RemotePolicy(server.url, "wrong", tokenizer=tokenizer, check=False)
        with pytest.raises(PolicyError, match="HTTP 401"):
            unchecked.generate([1, 2], SamplingParams(max_tokens=4), GenerationContext())
        # by spec, the token from the environment
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        with pytest.raises(PolicyError, match=TOKEN_ENV):
            make_policy(f"remote:{server.url}", tokenizer=tokenizer)
        monkeypatch.setenv(TOKEN_ENV, server.token)
        policy = make_policy(f"remote:{server.url}", tokenizer=tokenizer)
        assert isinstance(policy, RemotePolicy) and policy.name == "echo-script" and policy.version == 3
    with pytest.raises(PolicyError, match="remote:http://HOST:PORT"):
        make_policy("remote")


def test_errors_name_the_url_or_the_field(tokenizer):
    server = serve_policy(EchoScriptPolicy(tokenizer))
    url = server.url
    try:
        bad = httpx.post(f"{url}/generate", json={"prompt_ids": ["x"], "params": {"max_tokens": 1}},
                         headers={"Authorization": f"Bearer {server.token}"})
        assert bad.status_code == 400 and "prompt_ids" in bad.json()["error"]["message"]
        assert "params.temperature" in bad.json()["error"]["message"]
        remote = RemotePolicy(url, server.token, tokenizer=tokenizer, retries=1, backoff_s=0.01)
        ids = _prompt(tokenizer, [{"role": "user", "content": FAIL}])
        with pytest.raises(PolicyError, match="HTTP 502.*PolicyError"):  # the served policy's own failure
            remote.generate(ids, SamplingParams(), GenerationContext(messages=[{"role": "user", "content": FAIL}]))
        ok = remote.generate(ids, SamplingParams(max_tokens=64), GenerationContext(
            messages=[{"role": "user", "content": "hi"}]))
        assert tokenizer.decode(ok.token_ids).startswith("Echo: hi")
    finally:
        server.stop()
    server.stop()  # idempotent
    with pytest.raises(PolicyError, match=f"no policy server answers at {url}.*2 tries"):
        remote.generate(ids, SamplingParams(), GenerationContext())


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/install.sh)")
def test_an_episode_through_the_remote_expert_scores_as_locally(tokenizer, suite, tmp_path):
    from clawgym_env.envs.runtime import Runtime

    with serve_policy(ScriptedPolicy("expert", tokenizer=tokenizer)) as server, \
            Runtime(RemotePolicy(server.url, server.token, tokenizer=tokenizer), out_dir=tmp_path) as rt:
        result = rt.run(suite.tasks[0], EchoHarness())
    assert result.record.status == "ok" and result.record.reward == 1.0, result.record.error
    assert result.calls and all(c.token_exact and c.policy_name == "scripted:expert" for c in result.calls)
