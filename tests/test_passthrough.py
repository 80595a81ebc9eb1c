"""PassthroughPolicy: a harness episode whose model is an upstream API, captured at text level.

The upstream is a second, real ClawGym proxy (real HTTP) serving the scripted expert; the mini
harness runs a builtin task in the bwrap sandbox against our proxy, whose policy forwards every
call upstream through the official openai / anthropic SDK.
"""

from __future__ import annotations

import json

import pytest

from clawgym_env.envs.runtime import Runtime
from clawgym_env.errors import PolicyError
from clawgym_env.plugins import make_harness
from clawgym_env.policy import GenerationContext, SamplingParams, make_policy
from clawgym_env.policy.passthrough.policy import PassthroughPolicy, anthropic_request
from clawgym_env.policy.scripted import ScriptedPolicy
from clawgym_env.proxy.server import ProxyServer


def _tool_calls(message):
    return [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in message.get("tool_calls") or []]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_mini_episode_through_passthrough_to_upstream(provider, builtin_suite, tokenizer, tmp_path):
    task = next(t for t in builtin_suite.tasks
                if sum("tool" in s for s in json.loads(t.expert_path.read_text())["steps"]) >= 2)
    with ProxyServer(ScriptedPolicy("expert", tokenizer=tokenizer)) as upstream:
        up = upstream.open_episode("upstream", task=task)  # the upstream "API" knows the task's expert
        base = up.base_url(upstream.url)
        policy = PassthroughPolicy(provider, "upstream-model", base_url=base if provider == "openai" else base[:-3],
                                   api_key=up.token, tokenizer=tokenizer)
        with Runtime(policy, out_dir=tmp_path) as rt:
            res = rt.run(task, make_harness("mini"))
        up_calls = upstream.close_episode(up.token)
    rec = res.record
    assert rec.status == "ok" and rec.reward == 1.0, (rec.error, rec.logs)
    assert rec.policy == f"passthrough:{provider}:upstream-model"
    assert len(res.calls) == len(up_calls) == rec.num_calls >= 3
    assert {c.dialect for c in up_calls} == {"openai_chat" if provider == "openai" else "anthropic_messages"}
    for ours, theirs in zip(res.calls, up_calls):
        assert ours.token_exact is False and "passthrough" in ours.token_exact_reason
        # the harness got what the upstream said: same text, same tool calls (ids are each proxy's own)
        assert _tool_calls(ours.response_message) == _tool_calls(theirs.response_message)
        assert (ours.response_message.get("content") or "") == (theirs.response_message.get("content") or "")
        assert tokenizer.decode(ours.output_token_ids).endswith("<|im_end|>")
        assert len(ours.output_logprobs) == len(ours.output_token_ids)
    # the harness's tools reached the upstream, in the upstream's dialect
    offered = {t.get("name") or t["function"]["name"] for t in up_calls[0].request["tools"]}
    assert offered >= {"bash", "write_file", "read_file"}
    assert rec.final_message.strip() and rec.final_message.strip() in (up_calls[-1].response_message["content"] or "")


def test_upstream_failure_is_a_policy_error_remembered_per_episode(tokenizer):
    policy = PassthroughPolicy("openai", "m", base_url="http://127.0.0.1:9/v1", api_key="k", tokenizer=tokenizer,
                               max_retries=0, timeout=5)
    ctx = GenerationContext(episode_id="ep1", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(PolicyError, match="upstream openai model 'm' failed"):
        policy.generate([1, 2], SamplingParams(max_tokens=16), ctx)
    failures = policy.pop_failures("ep1")
    assert len(failures) == 1 and "Connection" in failures[0]
    assert policy.pop_failures("ep1") == [] and policy.pop_failures("other") == []


def test_make_policy_passthrough_specs(monkeypatch, tokenizer):
    for var in ("CLAWGYM_UPSTREAM_BASE_URL", "CLAWGYM_UPSTREAM_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL",
                "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(PolicyError, match="no API key"):
        make_policy("passthrough:openai:gpt-x")
    with pytest.raises(PolicyError, match="bad passthrough spec"):
        make_policy("passthrough:gemini:m")
    with pytest.raises(PolicyError, match="bad passthrough spec"):
        make_policy("passthrough:openai:")
    monkeypatch.setenv("CLAWGYM_UPSTREAM_BASE_URL", "http://127.0.0.1:9/v1")
    p = make_policy("passthrough:openai:qwen3:30b", tokenizer=tokenizer)  # no key: a custom endpoint is enough
    assert isinstance(p, PassthroughPolicy) and p.model == "qwen3:30b" and p.name == "passthrough:openai:qwen3:30b"
    assert str(p._client.base_url).rstrip("/") == "http://127.0.0.1:9/v1"
    monkeypatch.setenv("CLAWGYM_UPSTREAM_API_KEY", "sekrit")
    a = make_policy("passthrough:anthropic:claude-x", tokenizer=tokenizer)
    assert a._client.api_key == "sekrit" and a.provider == "anthropic"


def test_anthropic_request_shape():
    messages = [{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"},
                {"role": "user", "content": "do it"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "bash", "arguments": '{"command": "pwd"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                {"role": "tool", "tool_call_id": "call_2", "content": "/w"},
                {"role": "user", "content": "and?"}]
    tools = [{"type": "function", "function": {"name": "bash", "description": "run",
                                               "parameters": {"type": "object", "properties": {"command": {}}}}}]
    system, msgs, specs = anthropic_request(messages, tools)
    assert system == "S1\n\nS2"
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]  # alternating: tool results + text merged
    assert [b["type"] for b in msgs[1]["content"]] == ["tool_use", "tool_use"]
    assert msgs[1]["content"][0]["input"] == {"command": "ls"}
    assert [(b["type"], b.get("tool_use_id")) for b in msgs[2]["content"]] == \
        [("tool_result", "call_1"), ("tool_result", "call_2"), ("text", None)]
    assert specs == [{"name": "bash", "description": "run",
                      "input_schema": {"type": "object", "properties": {"command": {}}}}]


def test_raw_stream_reader_matches_the_reply_and_raises_on_an_error_event():
    """The raw event reader (the streamed path of the ``openai`` SDK's own clients): multi-line ``data``,
    comments and a missing space after ``data:`` read as SSE says; an ``error`` event is a PolicyError."""
    import asyncio

    from clawgym_env.policy.passthrough.wire import Answer, openai_json_answer, openai_raw_stream

    def chunk(delta: dict, finish: str | None = None) -> str:
        return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    call = {"index": 0, "function": {"name": "bash", "arguments": '{"command":'}}
    more = {"index": 0, "function": {"arguments": ' "ls"}'}}
    lines = [": keep-alive", "", "data: " + chunk({"role": "assistant", "reasoning_content": "hm"}), "",
             "data:" + chunk({"content": "Hi"}), "", "data: " + chunk({"tool_calls": [call]}), "",
             "data: " + chunk({"tool_calls": [more]}, "tool_calls"), "", "data: [DONE]", ""]

    async def read(lines: list[str]) -> tuple[list, Answer]:
        async def feed():
            for line in lines:
                yield line
        answer = Answer()
        deltas = [(d.kind, d.text) async for d in openai_raw_stream(feed(), "m", answer)]
        return deltas, answer

    deltas, answer = asyncio.run(read(lines))
    assert deltas == [("reasoning", "hm"), ("content", "Hi")]
    whole = openai_json_answer({"choices": [{"message": {"content": "Hi", "reasoning_content": "hm", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        "finish_reason": "tool_calls"}]}, "m")
    assert answer == whole and answer.calls == [("bash", {"command": "ls"})]
    split = ["data: {\"choices\": [{\"index\": 0,", "data:  \"delta\": {\"content\": \"x\"}}]}", "", "data: [DONE]"]
    assert asyncio.run(read(split))[1].content == "x"  # one event over two data lines
    with pytest.raises(PolicyError, match="sent an error in its stream"):
        asyncio.run(read(["data: " + json.dumps({"error": {"message": "overloaded"}}), ""]))
    with pytest.raises(PolicyError, match="returned no choices"):
        asyncio.run(read(["data: [DONE]", ""]))
