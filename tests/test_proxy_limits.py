"""The proxy cannot be taken down by one request: bounds, timeouts, failures, calls streamed to disk.

Every test talks to a real :class:`ProxyServer` (uvicorn in a thread) over real sockets, with the
official ``openai``/``anthropic`` SDKs where a client exists and raw sockets where the attack is on
the wire itself. Isolation and disclosure are in ``test_proxy_isolation.py``.
"""

from __future__ import annotations

import json
import logging
import socket
import stat
import threading
import time

import anthropic
import httpx
import openai
import pytest

from clawgym_env.errors import ProxyError
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.testing import FAIL, EchoScriptPolicy

CHAT = "/chat/completions"


@pytest.fixture(scope="module")
def policy(tokenizer):
    return EchoScriptPolicy(tokenizer)


@pytest.fixture(scope="module")
def server(policy):
    with ProxyServer(policy, max_context_tokens=4096, read_timeout_s=1.0, idle_timeout_s=1.0) as srv:
        yield srv


def uds_client(path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://proxy", timeout=10)


def chat_body(text="hi", **kw):
    return {"model": "m", "messages": [{"role": "user", "content": text}], **kw}


# --- 11.5: bounds -------------------------------------------------------------------------------------

def test_huge_prompt_is_refused_before_tokenising(server):
    s = server.open_episode()
    try:
        client = openai.OpenAI(base_url=s.base_url(server.url), api_key="x", max_retries=0, timeout=60)
        t0 = time.perf_counter()
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w" * (8 << 20)}])
        elapsed = time.perf_counter() - t0
        assert info.value.code == "context_length_exceeded"
        assert "65536 characters" in info.value.message and "4096 tokens" in info.value.message
        assert elapsed < 5, f"an 8 MB prompt took {elapsed:.1f}s to refuse: it was tokenised"
        assert [f.boundary for f in s.failures] == ["policy"] and s.num_calls == 0
    finally:
        server.close_episode(s.token)


def test_huge_count_tokens_is_refused_before_tokenising(server):
    s = server.open_episode()
    try:
        client = anthropic.Anthropic(base_url=s.base_url(server.url).removesuffix("/v1"), api_key="x",
                                     max_retries=0, timeout=60)
        assert client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}]).input_tokens
        t0 = time.perf_counter()
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "w" * (8 << 20)}])
        assert "65536 characters" in str(info.value) and time.perf_counter() - t0 < 5
    finally:
        server.close_episode(s.token)


def _deep(depth: int):
    value: object = "x"
    for _ in range(depth):
        value = {"a": [value]}
    return value


@pytest.mark.parametrize("path,body", [
    (CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                     "properties": None}}}]}),
    ("/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                   "metadata": None}),
    ("/responses", {"model": "m", "input": "hi", "metadata": None}),
])
def test_deeply_nested_json_is_a_400(server, path, body):
    s = server.open_episode()
    try:
        body = json.loads(json.dumps(body))
        key = "tools" if path == CHAT else "metadata"
        if path == CHAT:
            body["tools"][0]["function"]["parameters"]["properties"] = _deep(150)  # 300 levels
        else:
            body[key] = _deep(150)
        r = httpx.post(s.base_url(server.url) + path, json=body, timeout=30)
        assert r.status_code == 400, r.text
        assert "64 levels" in r.text
        assert s.num_calls == 0 and s.failures[-1].code == "json_too_deep"
    finally:
        server.close_episode(s.token)


@pytest.mark.parametrize("path", [CHAT, "/messages", "/responses"])
def test_lone_surrogates_never_make_a_500(server, path):
    """JSON allows ``"\\udfff"`` (JavaScript harnesses send it when they cut a string mid-emoji)."""
    s = server.open_episode()
    try:
        body = {CHAT: '{"model": "m\\udfff", "messages": [{"role": "user", "content": "cut \\ud83e"}]}',
                "/messages": '{"model": "m\\udfff", "max_tokens": 8, "messages": [{"role": "user", '
                             '"content": "cut \\ud83e"}]}',
                "/responses": '{"model": "m\\udfff", "input": "cut \\ud83e", "metadata": {"k\\udc00": "v"}}'}[path]
        r = httpx.post(s.base_url(server.url) + path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        assert "\ufffd" in r.content.decode("utf-8")
    finally:
        calls = server.close_episode(s.token)
    assert len(calls) == 1 and "cut \ufffd" in json.dumps(calls[0].request, ensure_ascii=False)


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing ``sock``, or None if it was still open after ``seconds``."""
    sock.settimeout(seconds)
    got = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return got
            got += chunk
    except TimeoutError:
        return None


def test_idle_and_stalled_connections_are_closed(server):
    idle = socket.create_connection(("127.0.0.1", server.port))
    assert _closed_within(idle, 4.0) is not None, "an idle connection was held open"
    slow = socket.create_connection(("127.0.0.1", server.port))
    slow.sendall(b"POST /ep/x/v1/chat/completions HTTP/1.1\r\nHost: p\r\n")
    closed = False
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:  # trickle a header byte every 0.2 s: still cut off
        try:
            slow.sendall(b"X")
        except OSError:
            closed = True
            break
        slow.settimeout(0.2)
        try:
            if slow.recv(4096) == b"":
                closed = True
                break
        except TimeoutError:
            pass
    assert closed, "a connection trickling its headers was held open"


def test_stalled_body_times_out_and_disconnect_is_not_a_crash(server, caplog):
    s = server.open_episode()
    path = f"/ep/{s.token}/v1{CHAT}"
    head = (f"POST {path} HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n").encode()
    try:
        stalled = socket.create_connection(("127.0.0.1", server.port))
        stalled.sendall(head + b'{"model": "m"')
        answer = _closed_within(stalled, 5.0) or b""
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"per-read timeout" in answer
        with caplog.at_level(logging.INFO, logger="clawgym.proxy"):
            gone = socket.create_connection(("127.0.0.1", server.port))
            gone.sendall(head + b'{"model": "m"')
            time.sleep(0.2)
            gone.close()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not any("disconnected" in r.message for r in caplog.records):
                time.sleep(0.05)
        assert any("disconnected mid-body" in r.message for r in caplog.records)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "a disconnect was logged as a crash"
        assert {f.code for f in s.failures} == {"request_timeout", "client_disconnected"}
        assert {f.boundary for f in s.failures} == {"client"}
    finally:
        server.close_episode(s.token)


def test_calls_stream_to_disk(server, tmp_path):
    path = tmp_path / "calls.jsonl"
    s = server.open_episode(calls_path=path)
    try:
        client = openai.OpenAI(base_url=s.base_url(server.url), api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "one"}]
        first = client.chat.completions.create(model="m", messages=msgs)
        msgs += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "two"}]
        client.chat.completions.create(model="m", messages=msgs)
        with pytest.raises(ProxyError, match="already open"):  # must not truncate the live episode's file
            server.open_episode(s.episode_id, calls_path=path)
        lines = path.read_text().splitlines()
        assert len(lines) == 2 and [json.loads(x)["call_index"] for x in lines] == [0, 1]
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert s.calls == []  # nothing kept in memory
    finally:
        calls = server.close_episode(s.token)
    assert [c.call_index for c in calls] == [0, 1]
    prev, nxt = calls
    assert nxt.token_exact, nxt.token_exact_reason  # splicing still works from the on-disk capture
    assert nxt.prompt_token_ids[:len(prev.prompt_token_ids) + len(prev.output_token_ids)] == \
        prev.prompt_token_ids + prev.output_token_ids


def test_failures_are_kept_with_their_boundary(server):
    s = server.open_episode()
    client = openai.OpenAI(base_url=s.base_url(server.url), api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[{"role": "nobody", "content": "x"}])
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": FAIL}])
    assert info.value.status_code == 502
    server.close_episode(s.token)
    assert [(f.status, f.boundary) for f in s.failures] == [(400, "client"), (502, "policy")]
    assert all(f.message and f.at > 0 for f in s.failures)



def test_serve_proxy_streams_private_calls(policy, tmp_path):
    from clawgym_env.proxy.server import serve_proxy

    out = tmp_path / "calls.jsonl"
    stop, lines = threading.Event(), []
    th = threading.Thread(target=lambda: lines.append(serve_proxy(
        policy, port=0, calls_out=out, announce=lines.append, stop_event=stop)))
    th.start()
    try:
        deadline = time.monotonic() + 30
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        base = lines[0].split("base URL ")[1].split()[0]
        assert httpx.post(base + CHAT, json=chat_body("fg")).status_code == 200
        assert out.read_text().count("\n") == 1  # on disk while serving, not only at exit
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
    finally:
        stop.set()
        th.join(30)
    assert len(lines[-1]) == 1 and stat.S_IMODE(out.stat().st_mode) == 0o600
