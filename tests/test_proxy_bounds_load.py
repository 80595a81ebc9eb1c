"""The proxy defends itself against many requests at once: connections and request bytes in flight,
per episode and overall (:mod:`clawgym_env.proxy.guards.bounds`).

The attacks are the issue's uploads held just before their last bytes and connection floods, scaled down
by small limits; they run against a real :class:`ProxyServer` over raw TCP and the episode's own unix
socket (an attack on the wire itself), with the official ``openai`` SDK for the calls that must still be
served. What is asserted is the answer (status and the dialect's error code) and the server's own count
of what it holds, never a time.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from clawgym_env.proxy.guards.bounds import ProxyLimits
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.testing import EchoScriptPolicy

CHAT = "/chat/completions"


@pytest.fixture(scope="module")
def policy(tokenizer):
    return EchoScriptPolicy(tokenizer)


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"the proxy never reached: {what}")
        time.sleep(0.01)


def answer(sock: socket.socket, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    """(status, headers, body) of the one response ``sock`` gets."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"the connection closed without an answer: {data[:200]!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


def connect(server: ProxyServer, path=None) -> socket.socket:
    """A raw connection to the proxy's TCP port, or to a unix socket at ``path``."""
    if path is None:
        return socket.create_connection(("127.0.0.1", server.port))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock


def held_upload(server: ProxyServer, token: str, length: int, sent: int) -> socket.socket:
    """A chat request declaring ``length`` body bytes that sends ``sent`` of them and then holds."""
    sock = connect(server)
    sock.sendall(f"POST /ep/{token}/v1{CHAT} HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode() + b" " * sent)
    return sock


def error_code(body: bytes) -> str:
    return json.loads(body)["error"]["code"]


def test_uploads_held_before_their_last_bytes_are_bounded_per_episode_and_overall(policy):
    """The issue's 96 uploads held just before their last bytes, scaled: one episode holds at most its share
    of bytes in flight (the rest: 429), all episodes together at most the proxy's (the rest: 503), and
    another episode's call is still served."""
    limits = ProxyLimits(max_body_bytes=200_000, max_json_values=1000, max_episode_inflight_bytes=600_000,
                         max_inflight_bytes=1_000_000)
    with ProxyServer(policy, bounds=limits, read_timeout_s=60) as srv:
        a, b, c = srv.open_episode(), srv.open_episode(), srv.open_episode()
        usage = srv.budget.usage
        held: list[socket.socket] = []
        try:
            for i in range(3):  # 3 x 199,000 bytes fit A's 600,000
                held.append(held_upload(srv, a.token, 200_000, 199_000))
                wait_for(lambda i=i: usage()["episode_inflight"].get(a.token) == 199_000 * (i + 1), "A's upload held")
            over = held_upload(srv, a.token, 200_000, 199_000)
            status, headers, body = answer(over)
            assert (status, error_code(body)) == (429, "episode_inflight_limit")
            assert "max_episode_inflight_bytes" in json.loads(body)["error"]["message"]
            held.append(held_upload(srv, b.token, 200_000, 199_000))  # B: 796,000 overall
            held.append(held_upload(srv, b.token, 200_000, 199_000))  # 995,000 overall
            wait_for(lambda: usage()["inflight_bytes"] == 995_000, "B's uploads held")
            status, _, body = answer(held_upload(srv, b.token, 200_000, 199_000))
            assert (status, error_code(body)) == (503, "proxy_inflight_limit")
            assert usage()["peak_inflight_bytes"] <= limits.max_inflight_bytes
            client = openai.OpenAI(base_url=c.base_url(srv.url), api_key="x", max_retries=0, timeout=30)
            reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "still here"}])
            assert reply.choices[0].message.content == "Echo: still here"
            assert [f.code for f in a.failures] == ["episode_inflight_limit"]
            assert [(f.code, f.boundary) for f in b.failures] == [("proxy_inflight_limit", "proxy")]
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: usage()["inflight_bytes"] == 0 and not usage()["episode_inflight"], "everything released")
        for s in (a, b, c):
            srv.close_episode(s.token)


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_connections_past_the_bounds_are_answered_and_closed(policy, http):
    """An episode's own socket takes at most ``max_episode_connections`` connections, the proxy at most
    ``max_connections`` over every listener; a request on a connection past a bound is answered 429/503 in
    the dialect's error shape and the connection is closed, one past twice the bound is closed at once.
    The others keep being served."""
    limits = ProxyLimits(max_connections=6, max_episode_connections=3)
    with ProxyServer(policy, bounds=limits, http=http) as srv:
        a = srv.open_episode()
        usage = srv.budget.usage
        idle = [connect(srv, a.socket_path) for _ in range(3)]
        wait_for(lambda: usage()["episode_connections"].get(a.token) == 3, "three connections on A's socket")
        fourth = connect(srv, a.socket_path)
        fourth.sendall(f"POST /ep/{a.token}/v1{CHAT} HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
                       "Content-Length: 2\r\n\r\n{}".encode())
        status, headers, body = answer(fourth)
        assert (status, error_code(body)) == (429, "episode_connection_limit")
        assert headers.get("connection") == "close" and fourth.recv(1) == b""  # closed after the answer
        wait_for(lambda: usage()["episode_connections"].get(a.token) == 3, "the refused connection gone")
        extra = [connect(srv, a.socket_path) for _ in range(3)]  # past A's bound: refused on their first request
        wait_for(lambda: usage()["episode_connections"].get(a.token) == 6, "six connections on A's socket")
        assert usage()["connections"] == 3  # past its episode's bound, a connection is not one of the proxy's
        dropped = connect(srv, a.socket_path)  # past twice the bound: closed at once, unanswered
        dropped.settimeout(10)
        assert dropped.recv(1) == b""
        for sock in extra:
            sock.close()
        wait_for(lambda: usage()["episode_connections"].get(a.token) == 3, "A's extra connections closed")
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(a.socket_path)), timeout=10) as c:
            idle.pop().close()  # one of A's connections ends: a new one is served
            wait_for(lambda: usage()["episode_connections"].get(a.token) == 2, "A's connection closed")
            r = c.post(f"http://proxy/ep/{a.token}/v1{CHAT}", json={"messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 200, r.text
        wait_for(lambda: usage()["connections"] == 2, "the client's connection closed")
        idle += [connect(srv) for _ in range(4)]  # 6 connections: the proxy's bound
        wait_for(lambda: usage()["connections"] == 6, "six connections")
        seventh = connect(srv)
        seventh.sendall(f"GET /ep/{a.token}/v1/models HTTP/1.1\r\nHost: p\r\n\r\n".encode())
        status, headers, body = answer(seventh)
        assert (status, error_code(body)) == (503, "proxy_connection_limit") and headers.get("connection") == "close"
        wait_for(lambda: usage()["connections"] == 6, "the refused connection gone")
        idle += [connect(srv) for _ in range(6)]  # past the proxy's bound: answered 503 on their first request
        wait_for(lambda: usage()["connections"] == 12, "twelve connections")
        dropped = connect(srv)  # past twice the bound: closed at once
        dropped.settimeout(10)
        assert dropped.recv(1) == b""
        for sock in idle:
            sock.close()
        wait_for(lambda: usage()["connections"] == 0, "every connection closed")
        assert [f.code for f in a.failures] == ["episode_connection_limit", "proxy_connection_limit"]
        srv.close_episode(a.token)


def test_requests_in_progress_on_shared_listeners_count_as_the_episodes_connections(policy):
    """Over TCP an episode is known by its token only once a request names it: its requests in progress count
    toward ``max_episode_connections`` (a fourth held upload of the same token is refused), other episodes'
    do not."""
    limits = ProxyLimits(max_episode_connections=3)
    with ProxyServer(policy, bounds=limits, read_timeout_s=60) as srv:
        a, b = srv.open_episode(), srv.open_episode()
        held = [held_upload(srv, a.token, 1000, 10) for _ in range(3)]
        wait_for(lambda: srv.budget.usage()["episode_connections"].get(a.token) == 3, "A's three requests")
        status, headers, body = answer(held_upload(srv, a.token, 1000, 10))
        assert (status, error_code(body)) == (429, "episode_connection_limit")
        client = openai.OpenAI(base_url=b.base_url(srv.url), api_key="x", max_retries=0, timeout=30)
        assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}]).choices
        for sock in held:
            sock.close()
        wait_for(lambda: not srv.budget.usage()["episode_connections"], "A's requests ended")
        client = openai.OpenAI(base_url=a.base_url(srv.url), api_key="x", max_retries=0, timeout=30)
        assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}]).choices
        for s in (a, b):
            srv.close_episode(s.token)
