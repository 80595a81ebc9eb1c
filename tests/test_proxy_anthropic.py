"""The serving proxy's Anthropic Messages dialect, driven by the official ``anthropic`` SDK.

A real :class:`ProxyServer` (uvicorn in a thread) in front of ``EchoScriptPolicy`` (real Qwen3
tokenizer). Every call is checked against its record: the output ids decode to exactly what the
client received and the prompt ids decode to the Qwen3 rendering of the mapped conversation.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from anthropic import Anthropic

from clawgym_env.policy.chat_format import assistant_text, normalize_messages, render_prompt_ids, render_prompt_text
from clawgym_env.proxy.dialects.anthropic.dialect import signature
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.testing import FAIL, EchoScriptPolicy

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = [{"name": "read_file", "description": "Read a file", "input_schema": SCHEMA,
          "cache_control": {"type": "ephemeral"}},
         {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                                 "parameters": SCHEMA}}]
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture(scope="module")
def policy(tokenizer):
    return EchoScriptPolicy(tokenizer)


@pytest.fixture(scope="module")
def server(policy):
    with ProxyServer(policy) as srv:
        yield srv


@pytest.fixture
def episode(server):
    session = server.open_episode(task={"id": "t-anthropic"}, harness="pytest")
    yield session
    if server.get_episode(session.token) is not None:
        server.close_episode(session.token)


def client_for(server, session, **kw) -> Anthropic:
    # Anthropic clients append /v1/messages themselves: the base URL has no /v1
    return Anthropic(base_url=f"{server.url}/ep/{session.token}", api_key="sk-ant-secret-do-not-store",
                     max_retries=0, **kw)


def check_record(tokenizer, rec, mapped, tools=None, thinking=None, received=None):
    """The record's prompt is the template rendering of ``mapped``; its output is what the client got."""
    assert rec.dialect == "anthropic_messages" and rec.token_exact
    assert tokenizer.decode(rec.prompt_token_ids) == render_prompt_text(tokenizer, mapped, tools, thinking)
    if received is not None:
        assert tokenizer.decode(rec.output_token_ids) == received
    assert len(rec.output_logprobs) == len(rec.output_token_ids)


def test_create_with_system_blocks_and_cache_control(server, episode, tokenizer, policy):
    system = [{"type": "text", "text": "x-billing: abc;"},
              {"type": "text", "text": "You are a coder.", "cache_control": EPHEMERAL}]
    messages = [{"role": "system", "content": "Extra rules."},
                {"role": "user", "content": [{"type": "text", "text": "<reminder>hi</reminder>"},
                                             {"type": "text", "text": "héllo 世界 🎉", "cache_control": EPHEMERAL},
                                             {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                          "data": "AAAA"}}]}]
    client = client_for(server, episode, default_headers={"x-api-key": "sk-ant-secret-do-not-store"})
    resp = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=200, system=system, messages=messages, metadata={"user_id": "u1"},
        output_config={"effort": "high"}, cache_control=EPHEMERAL,
        extra_body={"context_management": {"edits": []}, "temperature": 0.5, "top_k": 40, "top_p": 0.9})
    (block,) = resp.content
    user_text = "<reminder>hi</reminder>\nhéllo 世界 🎉\n[image]"
    assert block.type == "text" and block.text == "Echo: " + user_text
    assert resp.role == "assistant" and resp.model == "claude-sonnet-4-5" and resp.id.startswith("msg_")
    assert resp.stop_reason == "end_turn" and resp.stop_sequence is None
    (rec,) = episode.calls
    mapped = [{"role": "system", "content": "x-billing: abc;\nYou are a coder."},
              {"role": "system", "content": "Extra rules."}, {"role": "user", "content": user_text}]
    check_record(tokenizer, rec, mapped, received=assistant_text(block.text))
    assert policy.seen[-1][2].messages == normalize_messages(mapped)
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (len(rec.prompt_token_ids),
                                                                   len(rec.output_token_ids))
    assert rec.request["system"] == system and rec.request["top_k"] == 40 and rec.sampling["temperature"] == 0.5
    assert rec.response_message == {"role": "assistant", "content": block.text} and rec.stream is False
    assert rec.headers["anthropic-version"] and rec.headers["x-api-key"] == rec.headers["authorization"] \
        == "<redacted>"
    assert "sk-ant-secret-do-not-store" not in rec.model_dump_json()


def test_stream_thinking_then_text(server, episode, tokenizer):
    msgs = [{"role": "user", "content": "THINK: naïve 世界 🎉 streaming"}]
    events, text = [], ""
    with client_for(server, episode).messages.stream(
            model="claude-x", max_tokens=500, messages=msgs,
            thinking={"type": "enabled", "budget_tokens": 2048}) as stream:
        for event in stream:
            events.append(event)
        text = "".join(e.text for e in events if e.type == "text")
        final = stream.get_final_message()
    thinking, block = final.content
    assert thinking.type == "thinking" and thinking.thinking == "Thinking about naïve 世界 🎉 streaming 🤔"
    assert thinking.signature == signature(thinking.thinking)
    assert block.type == "text" and block.text == text == "Echo: THINK: naïve 世界 🎉 streaming"
    assert final.stop_reason == "end_turn"
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert [d.type for d in deltas if d.type == "signature_delta"] == ["signature_delta"]
    assert sum(d.type == "thinking_delta" for d in deltas) > 5 and sum(d.type == "text_delta" for d in deltas) > 5
    assert all("\ufffd" not in (getattr(d, "text", "") + getattr(d, "thinking", "")) for d in deltas)
    (rec,) = episode.calls
    check_record(tokenizer, rec, msgs, thinking=True, received=assistant_text(text, reasoning=thinking.thinking))
    assert rec.stream and final.usage.output_tokens == len(rec.output_token_ids)
    assert final.usage.input_tokens == len(rec.prompt_token_ids)


def test_raw_sse_event_grammar(server, episode):
    body = {"model": "m", "max_tokens": 300, "stream": True, "tools": TOOLS,
            "messages": [{"role": "user", "content": "THINK: tools please"}]}
    with httpx.stream("POST", episode.base_url(server.url) + "/messages", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames = [f for f in r.read().decode().split("\n\n") if f]
    names, datas = [], []
    for frame in frames:
        event_line, data_line = frame.split("\n")
        names.append(event_line.removeprefix("event: "))
        datas.append(json.loads(data_line.removeprefix("data: ")))
    assert names == [d["type"] for d in datas]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = datas[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    starts = [d for d in datas if d["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["thinking", "tool_use"]
    assert [s["index"] for s in starts] == [0, 1]
    tool = starts[1]["content_block"]
    assert tool["id"].startswith("toolu_") and tool["name"] == "read_file" and tool["input"] == {}
    partial = "".join(d["delta"]["partial_json"] for d in datas
                      if d["type"] == "content_block_delta" and d["index"] == 1)
    assert json.loads(partial) == {"path": "notes/ünïcode.txt", "limit": 5}
    assert datas[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip(server, episode, tokenizer, policy, stream):
    client = client_for(server, episode)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "read my notes", "cache_control": EPHEMERAL}]}]
    kw = dict(model="m", max_tokens=300, messages=msgs, tools=TOOLS, tool_choice={"type": "auto"})
    if stream:
        with client.messages.stream(**kw) as s:
            first = s.get_final_message()
    else:
        first = client.messages.create(**kw)
    (use,) = first.content
    assert use.type == "tool_use" and use.id.startswith("toolu_") and use.name == "read_file"
    assert use.input == policy.tool_args and first.stop_reason == "tool_use"
    rec = episode.calls[0]
    assert rec.finish_reason == "tool_calls" and rec.response_message["tool_calls"][0]["id"] == use.id
    check_record(tokenizer, rec, [{"role": "user", "content": "read my notes"}], CHAT_TOOLS,
                 received=assistant_text(tool_calls=[("read_file", use.input)]))
    assert policy.seen[-1][2].tools == CHAT_TOOLS  # the server tool is not offered to the template

    follow = msgs + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": [{"type": "text", "text": "buy milk"}]}]}]
    second = client.messages.create(model="m", max_tokens=300, messages=follow, tools=TOOLS)
    assert second.content[0].text == "Tool said: buy milk" and second.stop_reason == "end_turn"
    rec2 = episode.calls[1]
    mapped = [{"role": "user", "content": "read my notes"},
              {"role": "assistant", "content": "", "tool_calls": [{"id": use.id, "type": "function", "function": {
                  "name": "read_file", "arguments": json.dumps(use.input, ensure_ascii=False)}}]},
              {"role": "tool", "tool_call_id": use.id, "content": "buy milk"}]
    check_record(tokenizer, rec2, mapped, CHAT_TOOLS, received=assistant_text("Tool said: buy milk"))
    assert policy.seen[-1][2].messages == normalize_messages(mapped)
    head = rec.prompt_token_ids + rec.output_token_ids
    assert rec2.prompt_token_ids[:len(head)] == head  # the sampled turn is extended token for token


def test_thinking_signature_round_trip(server, episode, tokenizer, policy):
    client = client_for(server, episode)
    msgs = [{"role": "user", "content": "THINK: plan"}]
    first = client.messages.create(model="m", max_tokens=300, messages=msgs, thinking={"type": "adaptive"})
    thinking, text = first.content
    assert thinking.signature == signature(thinking.thinking)
    history = msgs + [{"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "opaque=="}, thinking.model_dump(), text.model_dump(exclude_none=True)]},
        {"role": "user", "content": "and then?"}]
    second = client.messages.create(model="m", max_tokens=300, messages=history, thinking={"type": "adaptive"})
    assert second.content[-1].text == "Echo: and then?"
    mapped = [msgs[0], {"role": "assistant", "content": text.text, "reasoning_content": thinking.thinking},
              {"role": "user", "content": "and then?"}]
    assert policy.seen[-1][2].messages == normalize_messages(mapped)
    rec1, rec2 = episode.calls
    assert rec2.token_exact and rec2.prompt_token_ids[:len(rec1.prompt_token_ids) + len(rec1.output_token_ids)] \
        == rec1.prompt_token_ids + rec1.output_token_ids
    client.messages.create(model="m", max_tokens=50, messages=msgs, thinking={"type": "disabled"})
    assert tokenizer.decode(episode.calls[2].prompt_token_ids) == render_prompt_text(tokenizer, msgs, None, False)


def test_tool_results_with_errors_and_text_map_in_order(server, episode, tokenizer):
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "read_file",
                                               "input": {"path": "x"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "is_error": True,
                 "content": "<tool_use_error>missing</tool_use_error>", "cache_control": EPHEMERAL},
                {"type": "text", "text": "<system-reminder>go on</system-reminder>"}]}]
    resp = client_for(server, episode).messages.create(model="m", max_tokens=100, messages=msgs, tools=TOOLS[:1],
                                                       tool_choice={"type": "none"})
    assert resp.content[0].text == "Echo: <system-reminder>go on</system-reminder>"
    mapped = [msgs[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "toolu_a", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "x"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_a", "content": "<tool_use_error>missing</tool_use_error>"},
        {"role": "user", "content": "<system-reminder>go on</system-reminder>"}]
    (rec,) = episode.calls
    assert not rec.token_exact  # that assistant turn was never sampled by the policy: rendered from text
    assert tokenizer.decode(rec.prompt_token_ids) == render_prompt_text(tokenizer, mapped, None)


def test_deferred_tools_are_offered_once_referenced(server, episode, policy):
    grep = {"name": "grep", "description": "Search", "input_schema": SCHEMA, "defer_loading": True}
    client = client_for(server, episode)
    client.messages.create(model="m", max_tokens=50, tools=TOOLS + [grep], system="",
                           messages=[{"role": "user", "content": "find it"}])
    assert [t["function"]["name"] for t in policy.seen[-1][2].tools] == ["read_file"]
    assert policy.seen[-1][2].messages == [{"role": "user", "content": "find it"}]
    history = [{"role": "user", "content": "find it"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_s", "name": "ToolSearch",
                                                  "input": {"query": "grep"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s", "content": [
                   {"type": "tool_reference", "tool_name": "grep"}]}]}]
    client.messages.create(model="m", max_tokens=50, tools=TOOLS + [grep], messages=history)
    ctx = policy.seen[-1][2]
    assert [t["function"]["name"] for t in ctx.tools] == ["read_file", "grep"]
    assert ctx.messages[-1] == {"role": "tool", "tool_call_id": "toolu_s", "content": "[tool_reference: grep]"}


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences_and_max_tokens(server, episode, tokenizer, stream):
    client = client_for(server, episode)
    kw = dict(model="m", max_tokens=100, messages=[{"role": "user", "content": "alpha beta STOP gamma"}],
              stop_sequences=["STOP", "never"])
    if stream:
        with client.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**kw)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "STOP"
    assert msg.content[0].text == "Echo: alpha beta" == tokenizer.decode(episode.calls[0].output_token_ids)
    short = client.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "a long answer"}])
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    assert tokenizer.decode(episode.calls[1].output_token_ids) == short.content[0].text


def test_count_tokens_and_beta_route(server, episode, tokenizer):
    seen_urls = []
    http = anthropic.DefaultHttpxClient(event_hooks={"request": [lambda req: seen_urls.append(str(req.url))]})
    client = client_for(server, episode, http_client=http)
    msgs = [{"role": "user", "content": "count me"}]
    counted = client.messages.count_tokens(model="m", system="sys", messages=msgs, tools=TOOLS)
    expected = render_prompt_ids(tokenizer, [{"role": "system", "content": "sys"}] + msgs, CHAT_TOOLS)
    assert counted.input_tokens == len(expected) and episode.calls == []  # a side call: not recorded
    # Claude Code posts to /v1/messages?beta=true; this Python SDK marks beta calls without the query, so add it
    resp = client.beta.messages.create(model="m", max_tokens=50, messages=msgs, betas=["claude-code-20250219"],
                                       extra_query={"beta": "true"})
    assert resp.content[0].text == "Echo: count me"
    assert seen_urls[-1].endswith("/v1/messages?beta=true")
    (rec,) = episode.calls
    assert rec.path.endswith("/v1/messages") and "claude-code-20250219" in rec.headers["anthropic-beta"]
    assert rec.prompt_token_ids == render_prompt_ids(tokenizer, msgs)


def test_unknown_token_and_policy_failure_use_anthropic_errors(server, episode):
    bad = Anthropic(base_url=f"{server.url}/ep/not-a-token", api_key="x", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as info:
        bad.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        bad.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.APIStatusError) as info:
        client_for(server, episode).messages.create(model="m", max_tokens=5,
                                                    messages=[{"role": "user", "content": FAIL}])
    assert info.value.status_code == 502 and info.value.body["error"]["type"] == "api_error"
    assert episode.calls == []


GOOD = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
BAD_BODIES = [
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({**GOOD, "max_tokens": 0}, "max_tokens"),
    ({**GOOD, "messages": "hi"}, "messages"),
    ({**GOOD, "messages": []}, "messages"),
    ({**GOOD, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({**GOOD, "messages": [{"role": "user"}]}, "messages[0].content"),
    ({**GOOD, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, "messages[0].content[0].type"),
    ({**GOOD, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({**GOOD, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({**GOOD, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                             "input": "x"}]}]}, "messages[0].content[0].input"),
    ({**GOOD, "system": [{"type": "image"}]}, "system[0].type"),
    ({**GOOD, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({**GOOD, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({**GOOD, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({**GOOD, "thinking": {"type": "maybe"}}, "thinking.type"),
    ({**GOOD, "temperature": 1.5}, "temperature"),
    ({**GOOD, "stop_sequences": "STOP"}, "stop_sequences"),
    ({**GOOD, "stream": "yes"}, "stream"),
]


@pytest.mark.parametrize("body,field", BAD_BODIES)
def test_malformed_bodies_are_400_naming_the_field(server, episode, body, field):
    r = httpx.post(episode.base_url(server.url) + "/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert f"'{field}'" in err["error"]["message"]
    assert episode.calls == []


def test_sdk_raises_bad_request_for_missing_max_tokens(server, episode):
    with pytest.raises(anthropic.BadRequestError) as info:
        client_for(server, episode).messages.create(model="m", max_tokens=10, extra_body={"max_tokens": None},
                                                    messages=[{"role": "user", "content": "hi"}])
    assert "max_tokens" in info.value.message
