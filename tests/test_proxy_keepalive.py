"""Keep-alive streaming (issue 13 part 6): a slow policy behind the real OpenAI and Anthropic SDKs.

The policy sleeps longer than the client's read timeout (an ``httpx2.Timeout``: the SDKs' HTTP library).
With keep-alives on, each SDK receives the whole answer (equal to a fast policy's, with an equal CallRecord);
with them off it times out; a failure after keep-alives started reaches the SDK as an error and is still kept
on ``session.failures``.
"""

from __future__ import annotations

import time

import anthropic
import httpx2
import openai
import pytest

from clawgym_env.proxy.server import ProxyServer
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
        first = next(resp.iter_bytes())
        assert first.startswith(b": keep-alive")  # then the client hangs up before the answer
    deadline = time.monotonic() + SLOW_S + 5
    while session.num_calls == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    (rec,) = server.close_episode(session.token)
    assert rec.response_message["content"] == "Echo: bye" and session.failures == []
    again = _open(server)  # the server still serves
    assert _chat(again.base_url(server.url), "still here") == "Echo: still here"
    server.close_episode(again.token)
