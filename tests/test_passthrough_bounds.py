"""A passthrough policy bounds what its upstream may cost: an endless answer, a flood of bytes, a stream cut
without its terminator, an upstream that only sends keep-alives.

The upstream is a real HTTP server (stdlib, chunked SSE or JSON) playing one hostile behaviour in the OpenAI
chat or Anthropic Messages wire format; the clients are the official ``openai``/``anthropic`` SDKs talking to
a real proxy whose policy is a :class:`PassthroughPolicy` pointed at that upstream. Each attack is bounded
(the answer ends as ``length``) or fails the call with a reason (a 502, or the dialect's in-stream error),
and a failed call is never recorded.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import openai
import pytest

from clawgym_env.errors import PolicyError
from clawgym_env.policy.base import GenerationContext, SamplingParams
from clawgym_env.policy.passthrough.bounds import CHARS_PER_TOKEN, bounded_lines
from clawgym_env.policy.passthrough.policy import PassthroughPolicy
from clawgym_env.proxy.server import ProxyServer

CAP = 64 << 20
"""The most an upstream here sends: an unbounded reader would read all of it."""
MAX_TOKENS = 32


class Hostile:
    """A scripted upstream on a real socket. ``mode``: ``endless`` (text deltas until the reader stops),
    ``flood`` (tiny text in huge events), ``cut`` (a few deltas, then the body ends cleanly without the
    stream's terminator), ``silent`` (keep-alives only: SSE comments, and Anthropic pings), ``huge_json``
    (a non-streamed answer of 20 MB)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sent = 0  # bytes of the answer written before the reader went away (or CAP was reached)
        self.cut_off = False  # the reader closed the connection before the answer's end (or CAP)
        self.done = threading.Event()
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                chat = self.path.endswith("/chat/completions")
                try:
                    if hostile.mode == "huge_json":
                        hostile.reply_json(self, chat)
                    else:
                        hostile.reply_stream(self, chat)
                except OSError:
                    hostile.cut_off = True  # the reader went away: what a bounded reader does
                finally:
                    hostile.done.set()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def reply_json(self, handler: BaseHTTPRequestHandler, chat: bool) -> None:
        text = "word " * 4_000_000
        reply = ({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
                 if chat else {"type": "message", "role": "assistant", "content": [{"type": "text", "text": text}],
                               "stop_reason": "end_turn"})
        data = json.dumps(reply).encode()
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        handler.end_headers()
        for i in range(0, len(data), 1 << 16):
            handler.wfile.write(data[i:i + (1 << 16)])
            self.sent += min(1 << 16, len(data) - i)

    def reply_stream(self, handler: BaseHTTPRequestHandler, chat: bool) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        for event in (_chat_events if chat else _messages_events)(self.mode):
            data = event.encode()
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            handler.wfile.flush()
            self.sent += len(data)
            if self.sent > CAP:
                break
            if self.mode == "silent":
                time.sleep(0.05)
        handler.wfile.write(b"0\r\n\r\n")  # a clean end of the body, terminator or not
        handler.wfile.flush()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Hostile:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def _sse(data: dict[str, Any], event: str | None = None) -> str:
    return (f"event: {event}\n" if event else "") + "data: " + json.dumps(data) + "\n\n"


def _chat_events(mode: str) -> Iterator[str]:
    def chunk(delta: dict[str, Any], **extra: Any) -> str:
        return _sse({"id": "c", "object": "chat.completion.chunk", "model": "up",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra})

    yield chunk({"role": "assistant", "content": ""})
    if mode == "silent":
        for _ in range(600):  # 30 s of keep-alives
            yield ": keep-alive\n\n"
        return
    for i in range(3 if mode == "cut" else 10**9):
        yield chunk({"content": "a"}, junk="j" * (1 << 20)) if mode == "flood" else chunk({"content": f"w{i} "})


def _messages_events(mode: str) -> Iterator[str]:
    yield _sse({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "model": "up",
                                                     "content": [], "stop_reason": None, "usage": {}}}, "message_start")
    yield _sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
               "content_block_start")
    if mode == "silent":
        for i in range(600):
            yield ": keep-alive\n\n" if i % 2 else _sse({"type": "ping"}, "ping")
        return
    for i in range(3 if mode == "cut" else 10**9):
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"w{i} "}}
        yield _sse({**delta, "junk": "j" * (1 << 20)} if mode == "flood" else delta, "content_block_delta")


def _ask(provider: str, base_url: str, *, stream: bool = True) -> tuple[str, str]:
    """One call through the proxy with the official SDK: (text, finish reason)."""
    messages = [{"role": "user", "content": "hi"}]
    if provider == "openai":
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=120)
        if not stream:
            choice = client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS).choices[0]
            return choice.message.content or "", choice.finish_reason
        text, finish = "", ""
        for chunk in client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish
    aclient = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=120)
    if not stream:
        msg = aclient.messages.create(model="m", max_tokens=MAX_TOKENS, messages=messages)
    else:
        with aclient.messages.stream(model="m", max_tokens=MAX_TOKENS, messages=messages) as events:
            msg = events.get_final_message()
    return "".join(b.text for b in msg.content if b.type == "text"), str(msg.stop_reason)


def _assert_cut_off(upstream: Hostile) -> None:
    """The reader closed the connection mid-answer, long before the upstream's CAP. What the upstream managed
    to write is no measure of what was read: the kernel's socket buffers (up to tens of MB on loopback) take
    bytes nobody reads, so the bound is checked as "cut off before CAP", not as a byte count."""
    assert upstream.cut_off, f"the reader never closed the stream (the upstream wrote {upstream.sent} bytes)"
    assert upstream.sent < CAP, f"the upstream wrote {upstream.sent} bytes: an unbounded reader"


def _proxy(provider: str, upstream: Hostile, tokenizer: Any, **kw: Any) -> ProxyServer:
    base = upstream.url + ("/v1" if provider == "openai" else "")
    policy = PassthroughPolicy(provider, "up-model", base_url=base, api_key="sk-test", tokenizer=tokenizer,
                               max_retries=0, timeout=60, **kw)
    return ProxyServer(policy)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_endless_streamed_answer_is_ended_at_its_bound(provider, tokenizer):
    """The issue's 60 MB streamed answer: the reader stops once the text passes what ``max_tokens`` can keep,
    closes the upstream's stream, and the call ends as ``length``."""
    with Hostile("endless") as upstream, _proxy(provider, upstream, tokenizer) as proxy:
        session = proxy.open_episode("ep-endless")
        text, finish = _ask(provider, session.base_url(proxy.url))
        (record,) = proxy.close_episode(session.token)
        assert upstream.done.wait(30)
    assert finish in ("length", "max_tokens") and record.finish_reason == "length"
    assert len(record.output_token_ids) <= MAX_TOKENS and text.startswith("w0 w1 ")
    _assert_cut_off(upstream)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_flood_of_bytes_fails_the_call_naming_the_bound(provider, tokenizer):
    """Tiny text in 1 MB events: the text bound never trips, the byte bound does."""
    with Hostile("flood") as upstream, _proxy(provider, upstream, tokenizer) as proxy:
        session = proxy.open_episode("ep-flood")
        with pytest.raises((openai.APIError, anthropic.APIError)) as err:
            _ask(provider, session.base_url(proxy.url))
        records = proxy.close_episode(session.token)
        assert upstream.done.wait(30)
    assert "bytes in one streamed answer" in str(err.value) and records == []
    assert [(f.code, f.boundary) for f in session.failures] == [("policy_error", "policy")]
    _assert_cut_off(upstream)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_stream_cut_without_its_terminator_is_a_failure_not_an_answer(provider, tokenizer):
    """Three deltas and a clean end of the body, but no ``[DONE]`` / ``message_stop``: a PolicyError, never a
    recorded answer with ``finish_reason: "stop"``."""
    with Hostile("cut") as upstream, _proxy(provider, upstream, tokenizer) as proxy:
        session = proxy.open_episode("ep-cut")
        with pytest.raises((openai.APIError, anthropic.APIError)) as err:
            _ask(provider, session.base_url(proxy.url))
        records = proxy.close_episode(session.token)
        failures = proxy.policy.pop_failures("ep-cut")  # type: ignore[attr-defined]
    end = "data: [DONE]" if provider == "openai" else "message_stop"
    assert f"without {end}" in str(err.value) and records == [] and len(failures) == 1
    assert [f.code for f in session.failures] == ["policy_error"]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_upstream_sending_only_keepalives_fails_past_the_silence_bound(provider, tokenizer):
    """Keep-alive comments (and Anthropic pings) every 50 ms for 30 s, no data: the call fails after
    ``silence_s`` (1 s here) with a reason, instead of holding the harness until it gives up."""
    with Hostile("silent") as upstream, _proxy(provider, upstream, tokenizer, silence_s=1.0) as proxy:
        session = proxy.open_episode("ep-silent")
        with pytest.raises((openai.APIError, anthropic.APIError)) as err:
            _ask(provider, session.base_url(proxy.url))
        records = proxy.close_episode(session.token)
        assert upstream.done.wait(30)
    assert "sent no data for 1 s (keep-alives aside)" in str(err.value) and records == []
    assert upstream.sent < 100_000  # it stopped well before its 30 s of keep-alives


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_huge_non_streamed_answer_fails_naming_the_bound(provider, tokenizer):
    with Hostile("huge_json") as upstream, _proxy(provider, upstream, tokenizer) as proxy:
        session = proxy.open_episode("ep-json")
        with pytest.raises((openai.APIError, anthropic.APIError)) as err:
            _ask(provider, session.base_url(proxy.url), stream=False)
        records = proxy.close_episode(session.token)
    assert "bytes in one answer" in str(err.value) and records == []


def test_a_long_non_streamed_answer_within_the_bytes_is_ended_as_length(tokenizer):
    """Text past what ``max_tokens`` can keep, in a body within the byte bound: ended, not encoded whole."""
    with Hostile("huge_json") as upstream:
        policy = PassthroughPolicy("openai", "up", base_url=upstream.url + "/v1", api_key="k", tokenizer=tokenizer,
                                   max_stream_bytes=64 << 20)
        try:
            gen = policy.generate([1], SamplingParams(max_tokens=MAX_TOKENS),
                                  GenerationContext(episode_id="e", messages=[{"role": "user", "content": "hi"}]))
        finally:
            policy.close()
    assert gen.finish_reason == "length"
    assert len(tokenizer.decode(gen.token_ids)) <= CHARS_PER_TOKEN * MAX_TOKENS + 40  # + the chat format's marks


def test_bounded_lines_splits_like_sse_and_stops_at_the_byte_bound():
    text = "a\r\nbb\rccc\n\nd\u20ac\u00e9\r\n\r\nlast"
    want = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    data = text.encode()

    async def read(chunks: list[bytes], limit: int) -> list[str]:
        async def feed() -> Any:
            for c in chunks:
                yield c
        return [line async for line in bounded_lines(feed(), limit, "upstream x")]
    rng = random.Random(7)
    for _ in range(300):  # every split of the bytes, "\r\n" and multi-byte characters included
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, len(data) - 2)))
        chunks = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)])]
        assert asyncio.run(read(chunks, len(data))) == want
    with pytest.raises(PolicyError, match="more than 100 bytes"):
        asyncio.run(read([b"x" * 60, b"y" * 60], 100))  # one endless line: refused, never held whole
