"""Keep-alive streaming (issue 13 part 6): a slow policy behind the real OpenAI and Anthropic SDKs.

The policy sleeps longer than the client's read timeout (an ``httpx2.Timeout``: the SDKs' HTTP library).
With keep-alives on, each SDK receives the whole answer (equal to a fast policy's, with an equal CallRecord);
with them off it times out; a failure after keep-alives started reaches the SDK as an error and is still kept
on ``session.failures``. The chat keep-alive is an empty ``chat.completion.chunk`` of the answer: the raw SDK
stream yields it (no choices, no usage, the answer's id), and the SDK's accumulating stream helper builds the
same completion as without keep-alives.
"""

from __future__ import annotations

import json
import time

import anthropic
import httpx2
import openai
import pytest

from clawgym_env.proxy.dialects.openai_chat.dialect import ChatLive, parse_request
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.proxy.stream.live import LiveStart
from clawgym_env.testing import FAIL, EchoScriptPolicy

SLOW_S = 2.5
TIMEOUT = httpx2.Timeout(connect=5, read=1.5, write=5, pool=5)


@pytest.fixture(scope="module")
def servers(tokenizer):
    slow, fast = EchoScriptPolicy(tokenizer, delay_s=SLOW_S), EchoScriptPolicy(tokenizer)
    with ProxyServer(slow, keepalive_s=0.5) as on, ProxyServer(slow, keepalive_s=0) as off, \
            ProxyServer(fast, keepalive_s=0.5) as quick:
        yield {"on": on, "off": off, "fast": quick}


def _open(server):
    return server.open_episode(task={"id": "t-keepalive"}, harness="pytest")


def _chat(base_url: str, text: str) -> str:
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=TIMEOUT)
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], stream=True)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def _responses(base_url: str, text: str) -> str:
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=TIMEOUT)
    with client.responses.stream(model="m", input=text) as stream:
        return stream.get_final_response().output_text


def _messages(base_url: str, text: str) -> str:
    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="sk-test", max_retries=0,
                                 timeout=TIMEOUT)
    with client.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": text}]) as s:
        return "".join(s.text_stream)


CLIENTS = {"chat": _chat, "responses": _responses, "messages": _messages}
TIMEOUT_ERRORS = (openai.APITimeoutError, anthropic.APITimeoutError)


def _record_view(rec, token):
    """The record less what differs between two episodes (ids, clock, headers with the token)."""
    keep = rec.model_dump(exclude={"episode_id", "started_at", "ended_at", "timings", "headers"})
    keep["path"] = keep["path"].replace(token, "<token>")
    return keep


@pytest.mark.parametrize("dialect", sorted(CLIENTS))
def test_slow_policy_streams_with_keepalive_and_matches_fast(servers, dialect):
    call = CLIENTS[dialect]
    slow_session, fast_session = _open(servers["on"]), _open(servers["fast"])
    slow_text = call(slow_session.base_url(servers["on"].url), "hello there")
    fast_text = call(fast_session.base_url(servers["fast"].url), "hello there")
    assert slow_text == fast_text == "Echo: hello there"
    (slow_rec,), (fast_rec,) = (servers["on"].close_episode(slow_session.token),
                                servers["fast"].close_episode(fast_session.token))
    assert slow_session.failures == []
    assert slow_rec.stream is True
    assert _record_view(slow_rec, slow_session.token) == _record_view(fast_rec, fast_session.token)


@pytest.mark.parametrize("dialect", sorted(CLIENTS))
def test_slow_policy_times_out_without_keepalive(servers, dialect):
    session = _open(servers["off"])
    with pytest.raises(TIMEOUT_ERRORS):
        CLIENTS[dialect](session.base_url(servers["off"].url), "hello there")
    servers["off"].close_episode(session.token)


@pytest.mark.parametrize("dialect", sorted(CLIENTS))
def test_failure_after_keepalive_is_an_in_stream_error(servers, dialect):
    session = _open(servers["on"])
    with pytest.raises((openai.APIError, anthropic.APIStatusError)) as info:
        CLIENTS[dialect](session.base_url(servers["on"].url), FAIL)
    assert not isinstance(info.value, TIMEOUT_ERRORS)
    assert "scripted failure" in str(info.value) or "scripted failure" in str(getattr(info.value, "body", ""))
    assert servers["on"].close_episode(session.token) == []
    assert [(f.status, f.code) for f in session.failures] == [(502, "policy_error")]


def test_client_gone_while_waiting_turn_still_recorded(servers):
    server = servers["on"]
    session = _open(server)
    url = session.base_url(server.url) + "/chat/completions"
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "bye"}]}
    with httpx2.Client(timeout=10) as client, client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200
        first = next(resp.iter_lines())
        assert json.loads(first.removeprefix("data: "))["choices"] == []  # a keep-alive; then the client hangs up
    deadline = time.monotonic() + SLOW_S + 5
    while session.num_calls == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    (rec,) = server.close_episode(session.token)
    assert rec.response_message["content"] == "Echo: bye" and session.failures == []
    again = _open(server)  # the server still serves
    assert _chat(again.base_url(server.url), "still here") == "Echo: still here"
    server.close_episode(again.token)


# ---- the chat keep-alive: an empty chunk of the answer ---------------------------------------------------
TOOL = {"type": "function", "function": {
    "name": "read_file", "strict": True, "description": "Read a file.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["path", "limit"],
                   "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}}}}


def _client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=TIMEOUT)


def _raw_chunks(server, text: str) -> list:
    session = _open(server)
    stream = _client(session.base_url(server.url)).chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    server.close_episode(session.token)
    assert session.failures == []
    return chunks


def test_chat_keepalives_are_empty_chunks_of_the_answer(servers):
    slow, fast = _raw_chunks(servers["on"], "hello there"), _raw_chunks(servers["fast"], "hello there")
    keepalives = slow[:len(slow) - len(fast)]
    assert keepalives, "a turn slower than keepalive_s gets keep-alives"
    for k in keepalives:  # what the SDK yields for a keep-alive: a chunk with nothing in it
        assert k.object == "chat.completion.chunk" and k.choices == [] and k.usage is None
        assert k.system_fingerprint is None  # the policy version that answers is not known yet
    answer = slow[len(keepalives):]
    assert answer[0].choices[0].delta.role == "assistant"  # the real answer starts after the keep-alives
    assert len({(c.id, c.created, c.model) for c in slow}) == 1  # one answer: one id, time and model
    assert {c.system_fingerprint for c in answer} == {"clawgym-echo-script-v3"}

    def text(chunks):
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text(slow) == text(fast) == "Echo: hello there"
    assert slow[-1].usage == fast[-1].usage and slow[-1].usage.completion_tokens > 0


def _helper_completion(server, text: str):
    """The SDK's accumulating stream helper (``chat.completions.stream``), with a tool call to accumulate."""
    session = _open(server)
    ids = set()
    with _client(session.base_url(server.url)).chat.completions.stream(
            model="m", messages=[{"role": "user", "content": text}], tools=[TOOL],
            stream_options={"include_usage": True}) as stream:
        for event in stream:
            if event.type == "chunk":
                ids.add(event.chunk.id)
        completion = stream.get_final_completion()
    server.close_episode(session.token)
    assert session.failures == []
    assert ids == {completion.id}
    return completion


def test_chat_stream_helper_accumulates_through_keepalives(servers):
    slow, fast = _helper_completion(servers["on"], "read it"), _helper_completion(servers["fast"], "read it")
    (call,) = slow.choices[0].message.tool_calls
    assert call.function.name == "read_file"
    assert call.function.parsed_arguments == {"path": "notes/ünïcode.txt", "limit": 5}
    assert slow.choices[0].finish_reason == "tool_calls"
    assert slow.system_fingerprint == "clawgym-echo-script-v3" and slow.usage and slow.usage.total_tokens > 0
    drop = {"id": True, "created": True, "choices": {0: {"message": {"tool_calls": {0: {"id"}}}}}}  # fresh each call
    assert slow.model_dump(exclude=drop) == fast.model_dump(exclude=drop)


def test_live_chat_keepalive_is_a_chunk_of_the_same_answer():
    req = parse_request({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    writer = ChatLive(req, "served", LiveStart(prompt_tokens=3, policy_name="p", policy_version=7))

    def data(line: str) -> dict:
        assert line.startswith("data: ") and line.endswith("\n\n")
        return json.loads(line.removeprefix("data: "))
    before, head, between = data(writer.tick()), data(writer.head()), data(writer.tick())
    same = ("id", "object", "created", "model", "system_fingerprint")
    assert [before[k] for k in same] == [head[k] for k in same] == [between[k] for k in same]
    assert before["model"] == "m" and before["system_fingerprint"] == "clawgym-p-v7"
    assert before["choices"] == between["choices"] == [] and before["usage"] is None
    assert head["choices"][0]["delta"] == {"role": "assistant", "content": ""}
