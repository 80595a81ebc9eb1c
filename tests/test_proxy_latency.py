"""What the proxy does to keep a call cheap changes nothing a call records or answers.

* ``start()`` loads the policy's tokenizer (and compiles its template) before it returns: the first call
  never pays it, and nothing loads it on the event loop;
* a small live-streamed call is prepared and recorded on the event loop (no thread hop), a large one in
  worker threads; both record exactly what the other would;
* either HTTP parser (``httptools``, ``h11``) and either loop (``uvloop``, ``asyncio``) serves the same
  answers, and bounds a request's line plus headers.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from clawgym_env.policy.base import GenerationContext, SamplingParams
from clawgym_env.proxy.listeners import MAX_HEAD_BYTES
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.testing import EchoScriptPolicy

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]


class _LazyEcho(EchoScriptPolicy):
    """The echo policy with a tokenizer loaded on first use, noting each load and every thread that reads it."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self._real, self._tokenizer = tokenizer, None
        self.loads = 0
        self.readers: set[str] = set()

    @property
    def tokenizer(self) -> Any:
        self.readers.add(threading.current_thread().name)
        if self._tokenizer is None:
            self.loads += 1
            self._tokenizer = self._real
        return self._tokenizer


class _LiveEcho(_LazyEcho):
    """...that streams its text (the proxy serves its streaming calls live, as a passthrough's)."""

    streams_text = True

    async def generate_stream(self, prompt_ids: list[int], params: SamplingParams,
                              ctx: GenerationContext) -> AsyncIterator[object]:
        yield self.generate(prompt_ids, params, ctx)


def _call(server: ProxyServer, stream: bool, messages: list[dict[str, Any]] = MESSAGES) -> tuple[str, Any]:
    session = server.open_episode(harness="pytest")
    client = openai.OpenAI(base_url=session.base_url(server.url), api_key="x", max_retries=0)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(model="m", messages=messages, stream=True)  # type: ignore
                       if c.choices)
    else:
        text = client.chat.completions.create(model="m", messages=messages).choices[0].message.content or ""  # type: ignore
    client.close()
    (record,) = server.close_episode(session.token)
    return text, record


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_start_loads_the_tokenizer_before_the_first_call(tokenizer, stream):
    policy = _LiveEcho(tokenizer)
    with ProxyServer(policy) as server:
        assert policy.loads == 1 and server.warmed, "start() returned before the tokenizer was loaded"
        assert policy.seen == [], "the warm-up must not call the policy"
        text, record = _call(server, stream)
    assert policy.loads == 1 and text.startswith("Echo: hi there") and record.output_token_ids


def test_a_tokenizer_that_fails_to_load_does_not_stop_the_server(tokenizer, caplog):
    class Broken(EchoScriptPolicy):
        @property
        def tokenizer(self) -> Any:
            raise OSError("no tokenizer here")

    with ProxyServer(Broken(tokenizer)) as server:
        assert not server.warmed and server.running
    assert "could not be warmed up" in caplog.text


def _fields(record: Any) -> tuple:
    return (record.prompt_token_ids, record.output_token_ids, record.response_message, record.finish_reason,
            record.token_exact)


def test_small_live_calls_make_no_thread_hop_and_record_the_same(tokenizer):
    records, readers = {}, {}
    for inline_bytes in (0, 1 << 20):  # never inline, always inline
        policy = _LiveEcho(tokenizer)
        with ProxyServer(policy, inline_bytes=inline_bytes) as server:
            policy.readers.clear()
            text, records[inline_bytes] = _call(server, True)
            readers[inline_bytes] = set(policy.readers)
            loop_thread = f"clawgym-proxy-{server.port}"
        assert text.startswith("Echo: hi there")
        assert loop_thread not in readers[0], "inline_bytes=0 prepared a call on the event loop"
    assert readers[1 << 20] == {loop_thread}, f"a small call hopped to a worker: {readers[1 << 20]}"
    assert _fields(records[0]) == _fields(records[1 << 20])


def test_a_large_live_call_runs_in_worker_threads(tokenizer):
    policy = _LiveEcho(tokenizer)
    big = [MESSAGES[0], {"role": "user", "content": "hi there " + "x" * 8000}]
    with ProxyServer(policy, inline_bytes=4096) as server:
        policy.readers.clear()
        text, record = _call(server, True, big)
        assert f"clawgym-proxy-{server.port}" not in policy.readers, "a large call was rendered on the event loop"
    assert text.startswith("Echo: hi there") and len(record.prompt_token_ids) > 1000


@pytest.mark.parametrize(("http", "loop"), [("h11", "asyncio"), ("httptools", "uvloop"), ("httptools", "asyncio")])
def test_parsers_and_loops_serve_the_same_answers(tokenizer, http, loop):
    pytest.importorskip(http)
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    policy = _LiveEcho(tokenizer)
    with ProxyServer(policy, http=http, loop=loop) as server:
        got = [_call(server, stream) for stream in (False, True)]
    with ProxyServer(policy, http="h11", loop="asyncio", inline_bytes=0) as server:
        want = [_call(server, stream) for stream in (False, True)]
    for (text, record), (want_text, want_record) in zip(got, want, strict=True):
        assert text == want_text and _fields(record) == _fields(want_record)


def _answer(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(head)
        except OSError:  # closed while sending: the refusal may already be in the buffer
            pass
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except OSError:
            pass
        return got


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_the_request_head_is_bounded_with_either_parser(tokenizer, http):
    """httptools: refused past MAX_HEAD_BYTES; h11: past its incomplete-event bound plus one read (256 KiB)."""
    pytest.importorskip(http)
    with ProxyServer(EchoScriptPolicy(tokenizer), http=http, idle_timeout_s=5.0) as server:
        huge = b"GET /healthz HTTP/1.1\r\nHost: p\r\nX-Pad: " + b"a" * (2 << 20) + b"\r\n\r\n"
        got = _answer(server.port, huge)
        assert got == b"" or got.startswith(b"HTTP/1.1 400"), f"a 2 MiB head was served: {got[:40]!r}"
        if http == "httptools":
            over = b"GET /healthz HTTP/1.1\r\nHost: p\r\n" + b"".join(
                b"X-H%d: %s\r\n" % (i, b"b" * 60) for i in range(MAX_HEAD_BYTES // 60)) + b"\r\n"
            assert _answer(server.port, over).startswith(b"HTTP/1.1 400"), "many headers escaped the bound"
        fine = b"GET /healthz HTTP/1.1\r\nHost: p\r\nX-Pad: " + b"c" * 4000 + b"\r\nConnection: close\r\n\r\n"
        assert _answer(server.port, fine).startswith(b"HTTP/1.1 200"), "a normal request was refused"
