"""The Anthropic Messages dialect's events (see :mod:`~clawgym_env.proxy.dialects.anthropic.dialect`): a finished turn
streamed whole (:func:`stream_response`), a live answer written as the policy's text arrives
(:class:`MessagesLive`, :mod:`~clawgym_env.proxy.stream.live`) and the keep-alive stream (:class:`MessagesKeepAlive`,
:mod:`~clawgym_env.proxy.stream.keepalive`); all send the blocks
:func:`~clawgym_env.proxy.dialects.anthropic.render.answer_blocks` gives, in the API's event order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.dialects.anthropic.render import (
    answer_blocks,
    error_body,
    message_object,
    signature,
    stop_reason,
    usage,
)
from clawgym_env.proxy.dialects.common import new_id, split_output, sse
from clawgym_env.proxy.sessions import TurnRequest, TurnResult
from clawgym_env.proxy.stream.live import Kind, LiveStart, rest


def stream_response(res: TurnResult, model: str) -> Iterator[str]:
    """SSE events: message_start, ping, per block content_block_start / _delta... / _stop,
    message_delta (stop_reason, usage), message_stop. Deltas follow the sampled tokens."""
    start = message_object(res, model, [])
    start["usage"] = {**start["usage"], "output_tokens": 0}
    yield sse("message_start", {"type": "message_start", "message": start})
    yield sse("ping", {"type": "ping"})
    for index, (block, deltas) in enumerate(answer_blocks(res)):
        yield _block_start(index, block)
        for delta in deltas:
            yield _block_delta(index, delta)
        yield _block_stop(index)
    yield from _end(res)


_EMPTY: dict[str, JSONObject] = {"thinking": {"thinking": "", "signature": ""}, "text": {"text": ""},
                                     "tool_use": {"input": {}}}


def _block_start(index: int, block: JSONObject) -> str:
    head = {k: v for k, v in block.items() if k in ("type", "id", "name")}
    return sse("content_block_start", {"type": "content_block_start", "index": index,
                                       "content_block": {**head, **_EMPTY[block["type"]]}})


def _block_delta(index: int, delta: JSONObject) -> str:
    return sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _block_stop(index: int) -> str:
    return sse("content_block_stop", {"type": "content_block_stop", "index": index})


def _end(res: TurnResult) -> Iterator[str]:
    reason, seq = stop_reason(res)
    yield sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                                "usage": usage(res)})
    yield sse("message_stop", {"type": "message_stop"})


class MessagesLive:
    """Live writer of one Messages request (see :mod:`~clawgym_env.proxy.stream.live`): the events
    :func:`stream_response` sends, the thinking and text blocks opened as the policy's text arrives."""

    def __init__(self, req: TurnRequest, model: str, start: LiveStart) -> None:
        usage = {"input_tokens": start.prompt_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        self.start: JSONObject = {"id": new_id("msg_"), "type": "message", "role": "assistant",
                                      "model": req.model or model, "content": [], "stop_reason": None,
                                      "stop_sequence": None, "usage": usage}
        self.index = -1
        self.streamed: list[str] = []  # block types opened live, in order
        self.open: str | None = None  # the live block still open
        self.thinking = ""  # the thinking text sent so far

    def tick(self) -> str:
        """A ``ping`` event (as :class:`MessagesKeepAlive`)."""
        return sse("ping", {"type": "ping"})

    def head(self) -> str:
        """``message_start`` and a ``ping``."""
        return sse("message_start", {"type": "message_start", "message": self.start}) + self.tick()

    def _open(self, kind: str) -> str:
        self.index += 1
        self.open = kind
        self.streamed.append(kind)
        return _block_start(self.index, {"type": kind})

    def _close(self, thinking: str | None = None) -> str:
        out = ""
        if self.open == "thinking":
            sig = signature(self.thinking if thinking is None else thinking)
            out += _block_delta(self.index, {"type": "signature_delta", "signature": sig})
        self.open = None
        return out + _block_stop(self.index)

    def delta(self, kind: Kind, text: str) -> str:
        """A thinking or text delta, opening (and closing the thinking) block as needed."""
        out = ""
        if kind == "reasoning":
            if self.open is None and not self.streamed:
                out += self._open("thinking")
            if self.open != "thinking":
                return out
            self.thinking += text
            return out + _block_delta(self.index, {"type": "thinking_delta", "thinking": text})
        if self.open == "thinking":
            out += self._close()
        if self.open is None:
            out += self._open("text")
        return out + _block_delta(self.index, {"type": "text_delta", "text": text})

    def finish(self, res: TurnResult, sent: dict[Kind, str]) -> Iterator[str]:
        """The rest of the live blocks, the blocks not streamed (tool uses), then :func:`stream_response`'s end."""
        out = split_output(res)
        for block, deltas in answer_blocks(res):
            kind = block["type"]
            if kind in self.streamed:
                if self.open == kind:
                    final = out.reasoning if kind == "thinking" else out.content
                    text = rest(sent["reasoning" if kind == "thinking" else "content"], final, kind)
                    if text:
                        key = "thinking" if kind == "thinking" else "text"
                        yield _block_delta(self.index, {"type": f"{key}_delta", key: text})
                    yield self._close(final)
                continue
            if self.open is not None:
                yield self._close()
            self.index += 1
            yield _block_start(self.index, block)
            for delta in deltas:
                yield _block_delta(self.index, delta)
            yield _block_stop(self.index)
        if self.open is not None:
            yield self._close()
        yield from _end(res)

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """``event: error`` with :func:`error_body` (as :class:`MessagesKeepAlive`)."""
        return sse("error", error_body(status, message, field, code))


def live(req: TurnRequest, body: Any, model: str, start: LiveStart) -> MessagesLive:
    """The live writer of a streaming Messages request."""
    return MessagesLive(req, model, start)


class MessagesKeepAlive:
    """Keep-alive stream of one Messages request (see :mod:`~clawgym_env.proxy.stream.keepalive`)."""

    def __init__(self, model: str) -> None:
        self.model = model

    def tick(self) -> str:
        """The API's own ``ping`` event."""
        return sse("ping", {"type": "ping"})

    def answer(self, res: TurnResult) -> Iterator[str]:
        """The events :func:`stream_response` sends."""
        return stream_response(res, self.model)

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """``event: error`` with :func:`error_body`."""
        return sse("error", error_body(status, message, field, code))


def keepalive(req: TurnRequest, body: Any, model: str) -> MessagesKeepAlive:
    """The keep-alive stream of a streaming Messages request."""
    return MessagesKeepAlive(model)
