"""The proxy defends itself against one request's shape: body size, JSON values, unknown fields, records.

Each attack is sent to a real :class:`ProxyServer` (uvicorn in a thread) over real HTTP, with the official
``openai``/``anthropic`` SDKs where they can send it and raw HTTP (httpx) where the key order or the
body matters; each is refused with a clear reason in its dialect's error shape, or bounded. Connections and
bytes in flight across many requests are in ``test_proxy_bounds_load.py``.
"""

from __future__ import annotations

import json
import threading

import anthropic
import httpx
import openai
import pytest

from clawgym_env.proxy.dialects.registry import spec
from clawgym_env.proxy.guards.bounds import VALUE_BYTES, ProxyLimits
from clawgym_env.proxy.recorded import ELIDED_KEY
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.testing import EchoScriptPolicy

PATHS = {"openai_chat": "/chat/completions", "anthropic_messages": "/messages", "openai_responses": "/responses"}
DEFAULTS = ProxyLimits()


@pytest.fixture(scope="module")
def policy(tokenizer):
    return EchoScriptPolicy(tokenizer)


@pytest.fixture(scope="module")
def server(policy):
    with ProxyServer(policy) as srv:
        yield srv


def body_for(dialect: str, text: str = "hi", **extra: object) -> dict:
    """A minimal valid body of ``dialect`` (``extra`` first: key order is what a record keeps)."""
    if dialect == "openai_chat":
        return {**extra, "model": "m", "messages": [{"role": "user", "content": text}]}
    if dialect == "anthropic_messages":
        return {**extra, "model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": text}]}
    return {**extra, "model": "m", "input": [{"type": "message", "role": "user", "content": text}]}


def send_with_sdk(server, session, dialect: str, **extra_body: object) -> None:
    """One call of ``dialect`` through its official SDK, ``extra_body`` merged into the request."""
    base = session.base_url(server.url)
    if dialect == "anthropic_messages":
        client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key="x", max_retries=0, timeout=120)
        client.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}],
                               extra_body=extra_body)
        return
    oai = openai.OpenAI(base_url=base, api_key="x", max_retries=0, timeout=120)
    if dialect == "openai_chat":
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], extra_body=extra_body)
    else:
        oai.responses.create(model="m", input="hi", extra_body=extra_body)


def error_kind(dialect: str, exc: Exception) -> str | None:
    """What the dialect's error shape says the error is: OpenAI's ``code``, Anthropic's ``error.type``."""
    body = getattr(exc, "body", None)
    if dialect == "anthropic_messages":
        assert isinstance(body, dict) and body.get("type") == "error", body
        return body["error"]["type"]
    assert isinstance(body, dict) and {"message", "type", "code"} <= set(body), body  # the SDK unwraps "error"
    return body["code"]


@pytest.mark.parametrize("dialect", list(PATHS))
def test_a_body_past_the_cap_is_a_413_whatever_field_carries_it(server, dialect):
    """The issue's 60 MB unknown field: every field counts toward ``max_body_bytes`` (16 MiB by default)."""
    s = server.open_episode()
    try:
        with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as info:
            send_with_sdk(server, s, dialect, pad="x" * (DEFAULTS.max_body_bytes + 1))
        assert info.value.status_code == 413
        assert error_kind(dialect, info.value) == "request_too_large"
        assert "max_body_bytes" in str(info.value)
        assert s.num_calls == 0 and [(f.status, f.boundary) for f in s.failures] == [(413, "client")]
    finally:
        server.close_episode(s.token)


@pytest.mark.parametrize("dialect", list(PATHS))
def test_a_chunked_body_past_the_cap_is_a_413(server, dialect):
    """No Content-Length to refuse up front: the body is read up to the cap, then refused."""
    s = server.open_episode()
    raw = json.dumps(body_for(dialect, pad="y" * (DEFAULTS.max_body_bytes + 1))).encode()

    def chunks():
        for i in range(0, len(raw), 1 << 20):
            yield raw[i:i + (1 << 20)]
    try:
        r = httpx.post(s.base_url(server.url) + PATHS[dialect], content=chunks(),
                       headers={"content-type": "application/json"}, timeout=120)
        assert r.status_code == 413, r.text[:300]
        assert "max_body_bytes" in r.text and s.num_calls == 0
    finally:
        server.close_episode(s.token)


@pytest.mark.parametrize("dialect", list(PATHS))
def test_unknown_fields_are_never_recorded_whole(server, dialect):
    """A field no dialect model reads, at the top or inside a message, is recorded only up to
    ``max_unknown_bytes`` (64 KiB by default); declared fields and small unknown ones are kept as sent."""
    s = server.open_episode()
    body = body_for(dialect, "hello", user="u-1")
    body["pad"] = "p" * 1_000_000
    message = body["messages"][0] if "messages" in body else body["input"][0]
    message["pad2"] = ["q" * 100_000]
    try:
        r = httpx.post(s.base_url(server.url) + PATHS[dialect], json=body, timeout=60)
        assert r.status_code == 200, r.text[:300]
    finally:
        (call,) = server.close_episode(s.token)
    kept = call.request
    assert kept["user"] == "u-1" and "pad" not in kept
    assert "max_unknown_bytes" in kept[ELIDED_KEY]
    inner = kept["messages"][0] if "messages" in kept else kept["input"][0]
    assert "pad2" not in inner and inner["content"] == "hello"
    assert len(json.dumps(kept)) < DEFAULTS.max_unknown_bytes + 2000
    module = spec(dialect).load()
    assert module.parse_request(kept).messages == module.parse_request(body).messages  # the record still parses


def test_known_fields_are_recorded_whole_however_large(server):
    """The bound is on unknown fields only: a large prompt and a large tool schema are recorded as sent."""
    s = server.open_episode()
    tool = {"type": "function", "function": {"name": "f", "description": "describe " * 9000,
                                             "parameters": {"type": "object", "properties": {}}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "w " * 1000}], "tools": [tool]}
    try:
        assert httpx.post(s.base_url(server.url) + PATHS["openai_chat"], json=body, timeout=60).status_code == 200
    finally:
        (call,) = server.close_episode(s.token)
    assert call.request == body


@pytest.mark.parametrize("dialect", list(PATHS))
def test_padded_json_is_refused_before_it_is_parsed(server, dialect):
    """The issue's ``"pad": [{},{},...]``: a body that may hold more than ``max_json_values`` values is a 413,
    counted on its bytes (the values are never built)."""
    s = server.open_episode()
    try:
        with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as info:
            send_with_sdk(server, s, dialect, pad=[{}] * (DEFAULTS.max_json_values + 1))
        assert info.value.status_code == 413 and error_kind(dialect, info.value) == "request_too_large"
        assert "max_json_values" in str(info.value) and s.num_calls == 0
        assert server.budget.usage()["inflight_bytes"] == 0  # released once answered
    finally:
        server.close_episode(s.token)


def test_other_episodes_are_served_while_one_sends_padded_bodies(server):
    """Padded bodies just under the value bound, sent in parallel by one episode (parsed in worker threads,
    charged to that episode): another episode's small calls complete meanwhile."""
    abuser, victim = server.open_episode(), server.open_episode()
    pad = [{}] * (DEFAULTS.max_json_values - 100)
    statuses: list[int] = []
    started = threading.Event()

    def abuse() -> None:
        with httpx.Client(timeout=120) as c:
            for _ in range(3):
                started.set()
                statuses.append(c.post(abuser.base_url(server.url) + PATHS["openai_chat"],
                                       json=body_for("openai_chat", pad=pad)).status_code)
    threads = [threading.Thread(target=abuse) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        started.wait(30)
        client = openai.OpenAI(base_url=victim.base_url(server.url), api_key="x", max_retries=0, timeout=120)
        answers = [client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"n{i}"}])
                   for i in range(5)]
        assert [a.choices[0].message.content for a in answers] == [f"Echo: n{i}" for i in range(5)]
        for t in threads:
            t.join(300)
        assert len(statuses) == 12 and set(statuses) <= {200, 429} and 200 in statuses
        assert [f.code for f in abuser.failures] == ["episode_inflight_limit"] * statuses.count(429)
        assert victim.failures == []
    finally:
        server.close_episode(abuser.token)
        server.close_episode(victim.token)
    assert server.budget.usage()["inflight_bytes"] == 0


def test_an_episode_past_its_recorded_bytes_is_refused_and_memory_records_are_bounded(policy, tmp_path):
    limits = ProxyLimits(max_episode_recorded_bytes=60_000, max_recorded_bytes=100_000)
    with ProxyServer(policy, max_context_tokens=4096, bounds=limits) as srv:
        a, b, disk = srv.open_episode(), srv.open_episode(), srv.open_episode(calls_path=tmp_path / "calls.jsonl")

        def call(session, text="x " * 4000) -> openai.types.chat.ChatCompletion:
            client = openai.OpenAI(base_url=session.base_url(srv.url), api_key="x", max_retries=0, timeout=60)
            return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
        served = 0
        with pytest.raises(openai.APIStatusError) as info:
            for _ in range(50):
                call(a)
                served += 1
        assert info.value.status_code == 413 and info.value.code == "episode_record_limit"
        assert "max_episode_recorded_bytes" in info.value.message
        per_call = a.recorded_bytes // served
        assert 60_000 <= a.recorded_bytes < 60_000 + per_call and a.memory_bytes == a.recorded_bytes
        with pytest.raises(openai.APIStatusError) as full:
            for _ in range(50):
                call(b)
        assert full.value.status_code == 503 and full.value.code == "proxy_record_limit"
        assert srv.registry.memory_bytes() >= 100_000 and [f.boundary for f in b.failures] == ["proxy"]
        assert call(disk).choices[0].message.content  # a calls file keeps nothing in memory: still served
        assert disk.memory_bytes == 0 < disk.recorded_bytes
        srv.close_episode(a.token)
        assert call(b).choices[0].message.content  # closing an episode frees its share


def test_limits_are_checked_and_name_the_fix():
    with pytest.raises(ValueError, match="max_episode_inflight_bytes"):
        ProxyLimits(max_body_bytes=64 << 20)
    with pytest.raises(ValueError, match="positive integer"):
        ProxyLimits(max_connections=0)
    with pytest.raises(ValueError, match="raise max_connections"):
        ProxyLimits(max_connections=8, max_episode_connections=16)
    small = ProxyLimits(max_body_bytes=1000, max_json_values=10, max_episode_inflight_bytes=1000 + 10 * VALUE_BYTES)
    assert small.max_episode_inflight_bytes == 1640 and "max_json_values" in ProxyLimits.field_names()


def test_serve_proxy_takes_the_limits_from_the_command_line(monkeypatch):
    from clawgym_cli.commands import cmd_serve_proxy
    from clawgym_cli.main import build_parser
    from clawgym_env.errors import ClawGymError
    from clawgym_env.proxy import server as server_mod

    seen: dict = {}
    monkeypatch.setattr(server_mod, "serve_proxy", lambda policy, **kw: seen.update(kw))
    args = build_parser().parse_args(["serve-proxy", "--policy", "scripted:noop", "--limit", "max_connections=2048",
                                      "--limit", "max-episode-connections=64"])
    assert cmd_serve_proxy(args) == 0
    assert seen["bounds"] == ProxyLimits(max_connections=2048, max_episode_connections=64)
    bad = build_parser().parse_args(["serve-proxy", "--limit", "max_conections=1"])
    with pytest.raises(ClawGymError, match="max_connections"):
        cmd_serve_proxy(bad)
