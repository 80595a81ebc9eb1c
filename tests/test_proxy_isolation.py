"""The proxy as a boundary, from the host: episode-bound sockets, disclosure, stateful continuations, NODELAY.

Every test talks to a real :class:`ProxyServer` (uvicorn in a thread) over real sockets, with the
official ``openai``/``anthropic`` SDKs as clients. The bounds and timeouts are in
``test_proxy_limits.py``; the sandbox-side attacks (socket tampering, leaked tokens) in
``tests/security/test_proxy_attacks.py``.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import httpx
import openai
import pytest

from clawgym_env.policy.passthrough.policy import PassthroughPolicy
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.testing import EchoScriptPolicy

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


# --- 10.5: one socket per episode, bound to its token -------------------------------------------------

def test_each_episode_has_its_own_socket_bound_to_its_token(server):
    a, b = server.open_episode(), server.open_episode()
    try:
        assert a.socket_path != b.socket_path != server.socket_path
        for s in (a, b):
            st = s.socket_path.stat()
            assert stat.S_ISSOCK(st.st_mode) and st.st_mode & 0o777 == 0o666
            assert s.socket_path.parent.stat().st_mode & 0o777 == 0o700
        with uds_client(a.socket_path) as c:
            ok = c.post(f"/ep/{a.token}/v1{CHAT}", json=chat_body("mine"))
            assert ok.status_code == 200, ok.text
            # b's token on a's socket: answered exactly like an unknown token, in each dialect's shape
            r = c.post(f"/ep/{b.token}/v1{CHAT}", json=chat_body("not mine"))
            assert r.status_code == 404 and r.json()["error"]["code"] == "episode_not_found"
            r = c.post(f"/ep/{b.token}/v1/messages", json={"model": "m", "max_tokens": 8,
                                                             "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 404 and r.json()["type"] == "error"
            r = c.post(f"/ep/{b.token}/v1/responses", json={"model": "m", "input": "x"})
            assert r.status_code == 404 and "error" in r.json()
            assert c.get(f"/ep/{b.token}/v1/models").status_code == 404
            assert c.get(f"/ep/{a.token}/v1/models").status_code == 200
        assert b.num_calls == 0 and b.failures == []  # nothing reached the other episode
        assert a.num_calls == 1 and {f.boundary for f in a.failures} == {"client"}
        # the host-side listeners still serve any token
        with uds_client(server.socket_path) as c:
            assert c.post(f"/ep/{b.token}/v1{CHAT}", json=chat_body()).status_code == 200
        path = a.socket_path
    finally:
        server.close_episode(a.token)
        server.close_episode(b.token)
    assert not path.exists(), "an episode's socket is removed when it closes"


def test_healthz_discloses_nothing(server):
    s = server.open_episode()
    try:
        with uds_client(s.socket_path) as c:
            assert c.get("/healthz").json() == {"status": "ok"}
        body = httpx.get(server.url + "/healthz").json()
        assert body == {"status": "ok"}
    finally:
        server.close_episode(s.token)


# --- 10.7: secrets ------------------------------------------------------------------------------------

class _EchoKeyUpstream(BaseHTTPRequestHandler):
    """An upstream that rejects every call and echoes the API key it was sent (as some do)."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        key = self.headers.get("authorization", "").removeprefix("Bearer ")
        body = json.dumps({"error": {"message": f"Incorrect API key provided: {key}", "type": "invalid_request_error",
                                     "code": "invalid_api_key"}}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_upstream_echoing_the_key_never_reaches_agent_or_records(tokenizer):
    key = "sk-live-" + os.urandom(12).hex()
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _EchoKeyUpstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        pol = PassthroughPolicy("openai", "up-model", base_url=f"http://127.0.0.1:{upstream.server_port}/v1",
                                api_key=key, tokenizer=tokenizer, max_retries=0)
        with ProxyServer(pol) as srv:
            s = srv.open_episode("leaky")
            r = httpx.post(s.base_url(srv.url) + CHAT, json=chat_body(), timeout=30)
            assert r.status_code == 502
            assert "Incorrect API key" in r.text and key not in r.text  # the agent's view
            srv.close_episode(s.token)
        assert s.failures and all(key not in f.message for f in s.failures)
        assert all(key not in m for m in pol.pop_failures("leaky"))
    finally:
        upstream.shutdown()


# --- 11.7: stateful continuations ---------------------------------------------------------------------

def test_anthropic_thread_continuation_is_refused(server):
    s = server.open_episode()
    try:
        client = anthropic.Anthropic(base_url=s.base_url(server.url).removesuffix("/v1"), api_key="x",
                                     max_retries=0)
        ok = client.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
        assert ok.content
        for thread in ({"type": "continue", "previous_message_id": ok.id}, {"type": "create"}):
            with pytest.raises(anthropic.BadRequestError) as info:
                client.beta.messages.create(model="m", max_tokens=16, thread=thread,
                                            messages=[{"role": "user", "content": "only the new turn"}])
            assert "'thread'" in str(info.value)
        assert s.num_calls == 1  # no 200 over a truncated prompt
    finally:
        server.close_episode(s.token)


def test_responses_compaction_trigger_is_refused(server):
    s = server.open_episode()
    try:
        client = openai.OpenAI(base_url=s.base_url(server.url), api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="m", input=[{"type": "message", "role": "user", "content": "hi"},
                                                      {"type": "compaction_trigger"}])
        assert info.value.param == "input[1].type" and "compaction" in info.value.message
        assert "server-side compaction" in info.value.message
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model="m", input="hi", previous_response_id="resp_1")
        assert info.value.param == "previous_response_id"
        assert s.num_calls == 0
    finally:
        server.close_episode(s.token)


# --- 16.1: no delayed-ACK stall -----------------------------------------------------------------------

def test_accepted_tcp_connections_have_nodelay(server):
    s = server.open_episode()
    try:
        client = openai.OpenAI(base_url=s.base_url(server.url), api_key="x", max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "warm"}])
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            times.append(time.perf_counter() - t0)
        median = sorted(times)[len(times) // 2]
        assert median < 0.030, f"median call {median * 1000:.1f} ms: responses wait for delayed ACKs"
    finally:
        server.close_episode(s.token)


def test_relay_adds_no_delayed_ack_stall(server):
    """The in-sandbox relay (TCP → the episode's unix socket), run as the sandbox runs it."""
    import subprocess
    import sys
    from pathlib import Path

    import clawgym_env.sandbox.relay as relay_mod

    s = server.open_episode()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(Path(relay_mod.__file__)), str(port), str(s.socket_path)])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the relay did not start listening"
                time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/ep/{s.token}/v1", api_key="x", max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "warm"}])
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            times.append(time.perf_counter() - t0)
        median = sorted(times)[len(times) // 2]
        assert median < 0.030, f"median call through the relay {median * 1000:.1f} ms: delayed-ACK stall"
        assert s.num_calls == 16
    finally:
        proc.terminate()
        proc.wait(10)
        server.close_episode(s.token)
