"""The serving proxy's OpenAI Responses dialect, driven by the official ``openai`` SDK.

A real :class:`ProxyServer` in front of ``EchoScriptPolicy`` (real Qwen3 tokenizer). Every call is
checked against its record: the output ids decode to exactly what the client received and the
prompt ids decode to the Qwen3 rendering of the mapped conversation.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai import OpenAI

from clawgym_env.policy.chat_format import assistant_text, normalize_messages, render_prompt_text
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.testing import FAIL, EchoScriptPolicy

PARAMS = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
TOOLS = [{"type": "function", "name": "exec_command", "description": "Run a command", "parameters": PARAMS,
          "strict": False},
         {"type": "web_search"},
         {"type": "namespace", "name": "multi_agent_v1", "description": "agents", "tools": []}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "exec_command", "description": "Run a command",
                                                 "parameters": PARAMS}}]


@pytest.fixture(scope="module")
def policy(tokenizer):
    return EchoScriptPolicy(tokenizer)


@pytest.fixture(scope="module")
def server(policy):
    with ProxyServer(policy) as srv:
        yield srv


@pytest.fixture
def episode(server):
    session = server.open_episode(task={"id": "t-responses"}, harness="pytest")
    yield session
    if server.get_episode(session.token) is not None:
        server.close_episode(session.token)


def client_for(server, session) -> OpenAI:
    return OpenAI(base_url=session.base_url(server.url), api_key="sk-secret-do-not-store", max_retries=0)


def check_record(tokenizer, rec, mapped, tools=None, thinking=None, received=None):
    assert rec.dialect == "openai_responses" and rec.token_exact
    assert tokenizer.decode(rec.prompt_token_ids) == render_prompt_text(tokenizer, mapped, tools, thinking)
    if received is not None:
        assert tokenizer.decode(rec.output_token_ids) == received
    assert len(rec.output_logprobs) == len(rec.output_token_ids)


def collect(stream):
    """(events, final response, text deltas, reasoning deltas, argument deltas) of a raw event stream."""
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    return events, events[-1].response, text, reasoning, args


def test_create_with_instructions_and_string_input(server, episode, tokenizer, policy):
    resp = client_for(server, episode).responses.create(model="gpt-x", instructions="Be brief.",
                                                        input="héllo 世界 🎉", temperature=0.5, store=False)
    assert resp.output_text == "Echo: héllo 世界 🎉" and resp.status == "completed" and resp.object == "response"
    (msg,) = resp.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    (rec,) = episode.calls
    mapped = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo 世界 🎉"}]
    check_record(tokenizer, rec, mapped, received=assistant_text(resp.output_text))
    assert policy.seen[-1][2].messages == normalize_messages(mapped)
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (len(rec.prompt_token_ids),
                                                                   len(rec.output_token_ids))
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert rec.request["input"] == "héllo 世界 🎉" and rec.request["store"] is False
    assert rec.sampling["temperature"] == 0.5 and resp.temperature == 0.5 and resp.store is False
    assert rec.headers["authorization"] == "<redacted>" and "sk-secret-do-not-store" not in rec.model_dump_json()


def test_stream_reasoning_and_text(server, episode, tokenizer):
    stream = client_for(server, episode).responses.create(model="m", input="THINK: naïve 世界 🎉 streaming",
                                                          stream=True, reasoning={"effort": "high",
                                                                                  "summary": "auto"})
    events, final, text, reasoning, _ = collect(stream)
    assert events[-1].type == "response.completed" and final.status == "completed"
    reasoning_item, message = final.output
    assert reasoning_item.type == "reasoning" and reasoning_item.summary[0].text == reasoning
    assert reasoning == "Thinking about naïve 世界 🎉 streaming 🤔"
    assert message.content[0].text == text == final.output_text == "Echo: THINK: naïve 世界 🎉 streaming"
    assert sum(e.type == "response.output_text.delta" for e in events) > 5
    assert all("\ufffd" not in getattr(e, "delta", "") for e in events)
    kinds = [e.type for e in events]
    for item_index in (0, 1):  # every item is opened before its deltas and closed after them
        own = [k for k, e in zip(kinds, events) if getattr(e, "output_index", None) == item_index]
        assert own[0] == "response.output_item.added" and own[-1] == "response.output_item.done"
    (rec,) = episode.calls
    check_record(tokenizer, rec, [{"role": "user", "content": "THINK: naïve 世界 🎉 streaming"}], thinking=True,
                 received=assistant_text(text, reasoning=reasoning))
    assert final.usage.output_tokens == len(rec.output_token_ids)
    assert 0 < final.usage.output_tokens_details.reasoning_tokens < final.usage.output_tokens


def test_stream_helper_final_response(server, episode, tokenizer):
    with client_for(server, episode).responses.stream(model="m", input=[{"role": "user", "content": "helper"}]) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert final.output_text == "".join(deltas) == "Echo: helper"
    assert tokenizer.decode(episode.calls[0].output_token_ids) == assistant_text("Echo: helper")


@pytest.mark.parametrize("stream", [False, True])
def test_function_call_round_trip(server, episode, tokenizer, policy, stream):
    client = client_for(server, episode)
    first_input = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]}]
    kw = dict(model="m", input=first_input, tools=TOOLS, tool_choice="auto", parallel_tool_calls=True, store=False)
    if stream:
        events, first, _, _, args = collect(client.responses.create(stream=True, **kw))
        assert "response.function_call_arguments.done" in [e.type for e in events]
    else:
        first = client.responses.create(**kw)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "exec_command" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id == "fc_" + call.call_id.removeprefix("call_")
    assert json.loads(call.arguments) == policy.tool_args and (not stream or args == call.arguments)
    rec = episode.calls[0]
    assert rec.finish_reason == "tool_calls" and rec.response_message["tool_calls"][0]["id"] == call.call_id
    check_record(tokenizer, rec, [{"role": "user", "content": "list files"}], CHAT_TOOLS,
                 received=assistant_text(tool_calls=[("exec_command", json.loads(call.arguments))]))
    assert policy.seen[-1][2].tools == CHAT_TOOLS  # web_search and the namespace are not offered

    follow = first_input + [item.model_dump(exclude_none=True) for item in first.output] + [
        {"type": "function_call_output", "call_id": call.call_id,
         "output": [{"type": "input_text", "text": "a.txt"}, {"type": "input_text", "text": "b.txt"}]}]
    second = client.responses.create(model="m", input=follow, tools=TOOLS, store=False)
    assert second.output_text == "Tool said: a.txt\nb.txt"
    mapped = [{"role": "user", "content": "list files"},
              {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
                  "name": "exec_command", "arguments": call.arguments}}]},
              {"role": "tool", "tool_call_id": call.call_id, "content": "a.txt\nb.txt"}]
    rec2 = episode.calls[1]
    check_record(tokenizer, rec2, mapped, CHAT_TOOLS, received=assistant_text(second.output_text))
    assert policy.seen[-1][2].messages == normalize_messages(mapped)
    head = rec.prompt_token_ids + rec.output_token_ids
    assert rec2.prompt_token_ids[:len(head)] == head


def test_developer_messages_parts_and_accepted_fields(server, episode, tokenizer, policy):
    items = [{"type": "message", "role": "developer", "content": "<permissions>never ask</permissions>"},
             {"role": "user", "content": [{"type": "input_text", "text": "<env>cwd=/w</env>"},
                                          {"type": "input_text", "text": "look:"},
                                          {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]
    resp = client_for(server, episode).responses.create(
        model="m", instructions="You are Codex.", input=items, store=False, include=["reasoning.encrypted_content"],
        prompt_cache_key="sess-1", reasoning={"effort": "minimal", "summary": "auto"}, parallel_tool_calls=False,
        tools=TOOLS, tool_choice="none", max_output_tokens=64, extra_body={"client_metadata": {"turn": "1"}})
    text = "<env>cwd=/w</env>\nlook:\n[image]"
    assert resp.output_text == "Echo: " + text
    mapped = [{"role": "system", "content": "You are Codex."},
              {"role": "developer", "content": "<permissions>never ask</permissions>"},
              {"role": "user", "content": text}]
    (rec,) = episode.calls
    check_record(tokenizer, rec, mapped, None, thinking=False, received=assistant_text(resp.output_text))
    assert policy.seen[-1][2].messages[1] == {"role": "system", "content": "<permissions>never ask</permissions>"}
    assert rec.request["client_metadata"] == {"turn": "1"} and resp.prompt_cache_key == "sess-1"


def test_reasoning_items_round_trip(server, episode, tokenizer, policy):
    client = client_for(server, episode)
    first = client.responses.create(model="m", input="THINK: plan", include=["reasoning.encrypted_content"])
    reasoning, message = first.output
    assert reasoning.encrypted_content and reasoning.summary[0].text == "Thinking about plan 🤔"
    opaque = {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content}
    history = [{"role": "user", "content": "THINK: plan"}, opaque, message.model_dump(exclude_none=True),
               {"role": "user", "content": "and then?"}]
    second = client.responses.create(model="m", input=history)
    assert second.output_text == "Echo: and then?"
    mapped = [{"role": "user", "content": "THINK: plan"},
              {"role": "assistant", "content": message.content[0].text,
               "reasoning_content": "Thinking about plan 🤔"},
              {"role": "user", "content": "and then?"}]
    assert policy.seen[-1][2].messages == normalize_messages(mapped)
    rec1, rec2 = episode.calls
    head = rec1.prompt_token_ids + rec1.output_token_ids
    assert rec2.token_exact and rec2.prompt_token_ids[:len(head)] == head


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_is_incomplete(server, episode, tokenizer, stream):
    client = client_for(server, episode)
    kw = dict(model="m", input="a long answer please", max_output_tokens=3)
    if stream:
        events, resp, text, _, _ = collect(client.responses.create(stream=True, **kw))
        assert events[-1].type == "response.incomplete"
    else:
        resp = client.responses.create(**kw)
        text = resp.output_text
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 3 and resp.output[-1].status == "incomplete"
    assert tokenizer.decode(episode.calls[0].output_token_ids) == text


def test_unknown_token_and_policy_failure_use_openai_errors(server, episode):
    bad = OpenAI(base_url=f"{server.url}/ep/not-a-token/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        bad.responses.create(model="m", input="hi")
    assert info.value.status_code == 404 and info.value.code == "episode_not_found"
    with pytest.raises(openai.APIStatusError) as info:
        client_for(server, episode).responses.create(model="m", input=FAIL)
    assert info.value.status_code == 502 and "scripted failure" in info.value.message
    assert episode.calls == []


GOOD = {"model": "m", "input": "hi"}
BAD_BODIES = [
    ({"model": "m"}, "input"),
    ({**GOOD, "input": 5}, "input"),
    ({**GOOD, "input": []}, "input"),
    ({**GOOD, "input": [{"type": "hologram"}]}, "input[0].type"),
    ({**GOOD, "input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({**GOOD, "input": [{"role": "user", "content": [{"type": "input_video"}]}]}, "input[0].content[0].type"),
    ({**GOOD, "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({**GOOD, "input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
    ({**GOOD, "instructions": ["x"]}, "instructions"),
    ({**GOOD, "previous_response_id": "resp_1"}, "previous_response_id"),
    ({**GOOD, "tools": [{"type": "function"}]}, "tools[0].name"),
    ({**GOOD, "tool_choice": "sometimes"}, "tool_choice"),
    ({**GOOD, "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({**GOOD, "temperature": 2.5}, "temperature"),
    ({**GOOD, "max_output_tokens": 0}, "max_output_tokens"),
    ({**GOOD, "store": "no"}, "store"),
]


@pytest.mark.parametrize("body,field", BAD_BODIES)
def test_malformed_bodies_are_400_naming_the_field(server, episode, body, field):
    r = httpx.post(episode.base_url(server.url) + "/responses", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field and f"'{field}'" in err["message"]
    assert episode.calls == []
