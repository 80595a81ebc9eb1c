"""Streamed passthrough: a streaming client's text leaves the proxy while the upstream is still answering.

The upstream is a real HTTP server (stdlib, chunked SSE) that plays one scripted reply in the OpenAI chat
or Anthropic Messages wire format; the clients are the official ``openai`` / ``anthropic`` SDKs talking to
a real proxy whose policy is a :class:`PassthroughPolicy` pointed at that upstream. Streaming is proven by
event order, not by timing: the upstream holds the rest of its reply until the client has seen the first
text delta (a deadlock breaker ends the wait after ``HOLD_S`` and marks the run as failed).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from clawgym_env.policy.passthrough.policy import PassthroughPolicy
from clawgym_env.proxy.server import ProxyServer

HOLD_S = 20.0
TEXT = ["Hello", " from", " the", " upstream", "."]
CALL = ("write_file", {"path": "a.txt", "content": "hi"})
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {"name": "write_file", "description": "Write a file",
                                           "parameters": {"type": "object", "properties": {
                                               "path": {"type": "string"}, "content": {"type": "string"}}}}}]


class Upstream:
    """A scripted upstream API (OpenAI chat and Anthropic Messages) on a real socket.

    ``hold``: after the first text chunk, wait for ``release`` before sending the rest (False in ``held_out``
    if the wait ran out). ``wait_first``: before any chunk, wait for ``release``. ``fail``: after the first
    text chunk, drop the connection without ending the chunked body.
    """

    def __init__(self) -> None:
        self.hold = False
        self.wait_first = False
        self.fail = False
        self.text = list(TEXT)
        self.release = threading.Event()
        self.held_out = True
        self.log: list[str] = []
        self.requests: list[dict[str, Any]] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                upstream.requests.append(body)
                chat = self.path.endswith("/chat/completions")
                if not body.get("stream"):
                    data = json.dumps(_chat_reply() if chat else _messages_reply()).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                upstream.play(self, _chat_events(upstream.text) if chat else _messages_events())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def play(self, handler: BaseHTTPRequestHandler, events: Iterator[tuple[str, bool]]) -> None:
        """Send the SSE ``events`` (text, is a text delta), holding or failing as configured."""
        if self.wait_first and not self.release.wait(HOLD_S):
            self.held_out = False
        first = True
        for event, is_text in events:
            self._chunk(handler, event.encode())
            if is_text and first:
                first = False
                self.log.append("upstream sent its first text")
                if self.fail:
                    handler.wfile.flush()
                    handler.connection.shutdown(2)  # cut: the chunked body never ends
                    return
                if self.hold and not self.release.wait(HOLD_S):
                    self.held_out = False
        self.log.append("upstream sent its last event")
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

    @staticmethod
    def _chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        handler.wfile.flush()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Upstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _sse(data: dict[str, Any], event: str | None = None) -> str:
    return (f"event: {event}\n" if event else "") + "data: " + json.dumps(data) + "\n\n"


def _chat_events(text: list[str]) -> Iterator[tuple[str, bool]]:
    head = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "up"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return _sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""}), False
    for piece in text:
        yield chunk({"content": piece}), True
    args = json.dumps(CALL[1])
    yield chunk({"tool_calls": [{"index": 0, "id": "call_up", "type": "function",
                                 "function": {"name": CALL[0], "arguments": ""}}]}), False
    for part in (args[:10], args[10:]):
        yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}), False
    yield chunk({}, "tool_calls"), False
    yield "data: [DONE]\n\n", False


def _chat_reply() -> dict[str, Any]:
    message = {"role": "assistant", "content": "".join(TEXT),
               "tool_calls": [{"id": "call_up", "type": "function",
                               "function": {"name": CALL[0], "arguments": json.dumps(CALL[1])}}]}
    return {"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": "up",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def _messages_events() -> Iterator[tuple[str, bool]]:
    usage = {"input_tokens": 1, "output_tokens": 0}
    yield _sse({"type": "message_start", "message": {"id": "msg_up", "type": "message", "role": "assistant",
                                                     "model": "up", "content": [], "stop_reason": None,
                                                     "stop_sequence": None, "usage": usage}}, "message_start"), False
    yield _sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
               "content_block_start"), False
    for piece in TEXT:
        yield _sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
                   "content_block_delta"), True
    yield _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"), False
    yield _sse({"type": "content_block_start", "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_up", "name": CALL[0], "input": {}}},
               "content_block_start"), False
    args = json.dumps(CALL[1])
    for part in (args[:10], args[10:]):
        yield _sse({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta",
                                                                         "partial_json": part}},
                   "content_block_delta"), False
    yield _sse({"type": "content_block_stop", "index": 1}, "content_block_stop"), False
    yield _sse({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 9}}, "message_delta"), False
    yield _sse({"type": "message_stop"}, "message_stop"), False


def _messages_reply() -> dict[str, Any]:
    return {"id": "msg_up", "type": "message", "role": "assistant", "model": "up",
            "content": [{"type": "text", "text": "".join(TEXT)},
                        {"type": "tool_use", "id": "toolu_up", "name": CALL[0], "input": CALL[1]}],
            "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 9}}


def _policy(provider: str, upstream: Upstream, tokenizer: Any) -> PassthroughPolicy:
    base = upstream.url + ("/v1" if provider == "openai" else "")
    return PassthroughPolicy(provider, "up-model", base_url=base, api_key="sk-test", tokenizer=tokenizer,
                             max_retries=0, timeout=60)


def _ask(provider: str, base_url: str, *, stream: bool, on_first_text: Any = None) -> tuple[str, list[tuple]]:
    """One call through the proxy with the official SDK: (text the client got, its tool calls)."""
    messages = [{"role": "user", "content": "write a.txt"}]
    if provider == "openai":
        import openai

        client: Any = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        if not stream:
            msg = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
            return msg.content or "", [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls]
        text, calls = "", {}  # type: tuple[str, dict[int, list[str]]]
        for chunk in client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True):
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is not None and delta.content:
                if not text and on_first_text:
                    on_first_text()
                text += delta.content
            for tc in (delta.tool_calls or []) if delta is not None else []:
                slot = calls.setdefault(tc.index, ["", ""])
                slot[0] = slot[0] or tc.function.name or ""
                slot[1] += tc.function.arguments or ""
        return text, [(name, json.loads(args)) for name, args in calls.values()]
    if provider == "responses":
        return _ask_responses(base_url, stream=stream, on_first_text=on_first_text)
    import anthropic

    aclient: Any = anthropic.Anthropic(base_url=base_url[:-3], api_key="x", max_retries=0)
    tools: list[dict[str, Any]] = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    if not stream:
        msg = aclient.messages.create(model="m", max_tokens=256, messages=messages, tools=tools)
    else:
        with aclient.messages.stream(model="m", max_tokens=256, messages=messages, tools=tools) as events:
            seen = False
            for event in events:
                if event.type == "text" and event.text and not seen:
                    seen = True
                    if on_first_text:
                        on_first_text()
            msg = events.get_final_message()
    text = "".join(b.text for b in msg.content if b.type == "text")
    return text, [(b.name, b.input) for b in msg.content if b.type == "tool_use"]


def _ask_responses(base_url: str, *, stream: bool, on_first_text: Any = None) -> tuple[str, list[tuple]]:
    import openai

    client: Any = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    if not stream:
        resp = client.responses.create(model="m", input="write a.txt", tools=tools)
    else:
        resp, text = None, ""
        for event in client.responses.create(model="m", input="write a.txt", tools=tools, stream=True):
            if event.type == "response.output_text.delta":
                if not text and on_first_text:
                    on_first_text()
                text += event.delta
            elif event.type == "response.completed":
                resp = event.response
        assert resp is not None and resp.output_text == text
    calls = [(i.name, json.loads(i.arguments)) for i in resp.output if i.type == "function_call"]
    return resp.output_text, calls


def _same_capture(a: Any, b: Any) -> None:
    """Two records of the same reply: equal but for the wire (stream flag, request, ids, times)."""
    for field in ("prompt_token_ids", "output_token_ids", "output_logprobs", "finish_reason", "sampling",
                  "policy_name", "policy_version", "token_exact", "token_exact_reason", "dialect"):
        assert getattr(a, field) == getattr(b, field), field

    def no_ids(msg: dict[str, Any]) -> dict[str, Any]:
        calls = [{**c, "id": None} for c in msg.get("tool_calls") or []]
        return {**msg, "tool_calls": calls}

    assert no_ids(a.response_message) == no_ids(b.response_message)


@pytest.mark.parametrize("provider", ["openai", "anthropic", "responses"])
def test_first_delta_reaches_the_client_before_the_upstream_ends(provider, tokenizer):
    """``provider``: the client's dialect and SDK (the upstream speaks the same API; Responses: OpenAI chat)."""
    upstream_api = "anthropic" if provider == "anthropic" else "openai"
    with Upstream() as upstream, ProxyServer(_policy(upstream_api, upstream, tokenizer)) as proxy:
        session = proxy.open_episode("ep-live")
        base = session.base_url(proxy.url)

        def first_text() -> None:
            upstream.log.append("client saw the first text")
            upstream.release.set()

        upstream.hold = True
        text, calls = _ask(provider, base, stream=True, on_first_text=first_text)
        upstream.hold = False
        upstream.release.clear()
        plain_text, plain_calls = _ask(provider, base, stream=False)
        streamed, plain = proxy.close_episode(session.token)
    assert upstream.held_out, "the upstream's hold ran out: the client saw no text before the upstream ended"
    assert upstream.log[:3] == ["upstream sent its first text", "client saw the first text",
                                "upstream sent its last event"]
    assert text == plain_text == "".join(TEXT)
    assert calls == plain_calls == [CALL]
    assert streamed.stream is True and plain.stream is False
    assert streamed.token_exact is False and (streamed.token_exact_reason or "").startswith("passthrough: text-level")
    _same_capture(streamed, plain)
    assert [bool(r.get("stream")) for r in upstream.requests] == [True, False]  # the upstream was asked alike
    assert tokenizer.decode(streamed.output_token_ids).endswith("<|im_end|>")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_upstream_failing_mid_stream_is_an_in_stream_error_and_a_failure(provider, tokenizer):
    import anthropic
    import openai

    with Upstream() as upstream, ProxyServer(_policy(provider, upstream, tokenizer)) as proxy:
        policy = proxy.policy
        session = proxy.open_episode("ep-fail")
        upstream.fail = True
        with pytest.raises((openai.APIError, anthropic.APIError)) as err:
            _ask(provider, session.base_url(proxy.url), stream=True)
        records = proxy.close_episode(session.token)
    assert "the policy failed to generate" in str(err.value)
    assert records == []  # nothing recorded for a call that failed
    assert [(f.status, f.code, f.boundary) for f in session.failures] == [(502, "policy_error", "policy")]
    assert len(policy.pop_failures("ep-fail")) == 1  # type: ignore[attr-defined]


def _keepalive(line: str) -> bool:
    """A chat keep-alive: an empty chunk (no choices, null usage)."""
    if not line.startswith("data: {"):
        return False
    chunk = json.loads(line[6:])
    return chunk.get("choices") == [] and chunk.get("usage") is None


def test_keepalives_while_the_upstream_is_silent(tokenizer):
    with Upstream() as upstream, ProxyServer(_policy("openai", upstream, tokenizer), keepalive_s=0.05) as proxy:
        session = proxy.open_episode("ep-ka")
        upstream.wait_first = True
        lines = []
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", session.base_url(proxy.url) + "/chat/completions", json=body, timeout=60) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if _keepalive(line):
                    upstream.release.set()  # the upstream starts only once a keep-alive arrived
                lines.append(line)
        (record,) = proxy.close_episode(session.token)
    assert upstream.held_out
    data = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in data if c["choices"])
    first = next(i for i, x in enumerate(lines) if _keepalive(x))
    assert first < min(i for i, c in enumerate(lines) if c.startswith("data: {") and json.loads(c[6:])["choices"])
    assert text == record.response_message["content"] == "".join(TEXT)
    assert lines[-1] == "data: [DONE]" or lines[-2] == "data: [DONE]"


def test_text_the_record_cuts_is_never_sent(tokenizer):
    """A stop string the upstream ignored: the proxy cuts the record there, and the live stream never sent
    what follows it, not even the stop string's first half (held back until the next piece showed it)."""
    import openai

    with Upstream() as upstream, ProxyServer(_policy("openai", upstream, tokenizer)) as proxy:
        session = proxy.open_episode("ep-stop")
        upstream.text = ["  Hello", " world ST", "OP and more", " text"]
        client = openai.OpenAI(base_url=session.base_url(proxy.url), api_key="x", max_retries=0)
        pieces = []
        for chunk in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                    stop=["STOP"], stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
        (record,) = proxy.close_episode(session.token)
    assert "".join(pieces) == record.response_message["content"] == "Hello world"
    assert pieces[0] == "Hello" and all("ST" not in p for p in pieces)


def test_async_clients_close_with_the_proxy_loop_and_with_the_policy(tokenizer):
    """The async SDK client a streaming call builds is bound to the proxy's loop: it is closed when that loop
    shuts down (the proxy stops), and ``close()`` from another thread closes it on its loop while it runs."""
    with Upstream() as upstream:
        policy = _policy("openai", upstream, tokenizer)
        assert policy.open_clients() == [policy._client]  # the sync client only, until a stream needs one
        with ProxyServer(policy) as proxy:
            base = proxy.open_episode("ep-a").base_url(proxy.url)
            assert _ask("openai", base, stream=True)[0] == "".join(TEXT)
            sync, first = policy.open_clients()
            assert not first.is_closed()
        assert first.is_closed(), "the proxy's loop ended, its async client stayed open"
        assert policy.open_clients() == [sync]

        with ProxyServer(policy) as proxy:  # the policy outlives a proxy: a new loop gets a new client
            base = proxy.open_episode("ep-b").base_url(proxy.url)
            assert _ask("openai", base, stream=True)[0] == "".join(TEXT)
            second = policy.open_clients()[1]
            assert second is not first and not second.is_closed()
            policy.close()  # while the proxy's loop runs, from this thread
            assert second.is_closed() and sync.is_closed()
            assert policy.open_clients() == []
            policy.close()  # idempotent
