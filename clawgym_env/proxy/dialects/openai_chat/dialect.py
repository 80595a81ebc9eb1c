"""The OpenAI Chat Completions dialect: request mapping, response rendering and SSE streaming.

A dialect module provides ``parse_request(body) -> TurnRequest``, ``render_response(result, model) -> dict``,
``stream_response(result, model) -> Iterator[str]`` and ``error_body(status, message, field, code) -> dict``
(:class:`~clawgym_env.proxy.dialects.contract.DialectModule`) and declares its routes in ``DIALECT``
(:mod:`~clawgym_env.proxy.dialects.contract`).

Invariants:
  * ``parse_request`` validates the body with :class:`~clawgym_env.proxy.dialects.openai_chat.request.ChatRequest` and
    raises :class:`ProxyError` (HTTP 400, ``field`` set, message naming the field) for every malformed
    input it can see and never anything else; unknown fields are ignored.
  * The non-streamed message and the concatenation of the streamed deltas are the same message
    (both come from one :class:`~clawgym_env.proxy.deltas.Segmentation` of the recorded ids).
  * ``usage`` counts are the lengths of the recorded prompt and output ids.
  * Every chunk of one streamed answer, keep-alives included, carries the same ``id``, ``created`` and
    ``model`` (clients take them from the first chunk they see, which may be a keep-alive).
  * A keep-alive (:func:`keepalive_chunk`) is a ``chat.completion.chunk`` with ``"choices": []`` and
    ``"usage": null``: the shape of OpenAI's own usage chunk, without usage. Clients parse it as a chunk
    (so it resets idle timers kept on parsed chunks, as Qwen Code's) and find nothing in it; see
    :mod:`~clawgym_env.proxy.stream.keepalive` for why no client breaks on it. An in-stream error is a ``data:``
    line holding the error envelope, which the OpenAI SDKs raise as an ``APIError``.
  * A live answer (:func:`live`, :mod:`~clawgym_env.proxy.stream.live`) sends the chunks :func:`stream_response`
    sends for the recorded turn, its text chunks cut where the policy's text arrived.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.deltas import Delta, iter_deltas
from clawgym_env.proxy.dialects.contract import DialectSpec, Route
from clawgym_env.proxy.dialects.openai_chat.request import (
    ChatAssistantMessage,
    ChatMessage,
    ChatRequest,
    ChatTextPart,
    ChatToolMessage,
)
from clawgym_env.proxy.dialects.request_base import validate_body
from clawgym_env.proxy.sessions import TurnRequest, TurnResult
from clawgym_env.proxy.stream.live import Kind, LiveStart, rest

DIALECT = DialectSpec(routes=(Route("/v1/chat/completions"),), history_key="messages")
"""``POST /ep/{token}/v1/chat/completions``; the conversation is ``messages``."""


def _content(content: Any) -> Any:
    """Content as the pipeline reads it: parts the proxy does not read are passed on as sent."""
    if isinstance(content, list):
        return [p.sent if isinstance(p, ChatTextPart) else p for p in content]
    return content


def _arguments(args: str | JSONObject | None) -> str:
    if args is None:
        return "{}"
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _message(msg: ChatMessage | ChatToolMessage | ChatAssistantMessage) -> JSONObject:
    new: JSONObject = {"role": msg.role, "content": _content(msg.content)}
    if isinstance(msg, ChatToolMessage):
        new["tool_call_id"] = msg.tool_call_id
    elif isinstance(msg, ChatAssistantMessage):
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                 for c in msg.tool_calls or []]
        if calls:
            new["tool_calls"] = calls
        reasoning = msg.reasoning_text()
        if reasoning:
            new["reasoning_content"] = reasoning
    return new


def _offered_tools(req: ChatRequest) -> list[JSONObject]:
    if req.tool_choice == "none":
        return []
    return [dict(t.sent, type="function") for t in req.tools or []]


def _stop(stop: str | list[str] | None) -> list[str]:
    if isinstance(stop, str):
        return [stop] if stop else []
    return [s for s in stop or [] if s]


def parse_request(body: Any) -> TurnRequest:
    """Validate a Chat Completions body (see the module invariants)."""
    req = validate_body(ChatRequest, body)
    limits = [x for x in (req.max_tokens, req.max_completion_tokens) if x is not None]
    stream = bool(req.stream)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    kwargs = req.chat_template_kwargs
    return TurnRequest(
        messages=[_message(m) for m in req.messages], tools=_offered_tools(req),
        max_tokens=min(limits) if limits else None, temperature=req.temperature, top_p=req.top_p,
        stop=_stop(req.stop), seed=req.seed, stream=stream, include_usage=include_usage and stream,
        want_logprobs=bool(req.logprobs), model=req.model,
        enable_thinking=kwargs.enable_thinking if kwargs else None, source=req)


def _usage(res: TurnResult) -> dict[str, int]:
    return {"prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
            "total_tokens": res.prompt_tokens + res.completion_tokens}


def _ident() -> tuple[str, int]:
    """A fresh answer's ``id`` and ``created``."""
    return "chatcmpl-" + uuid.uuid4().hex, int(time.time())


def _head(res: TurnResult, model: str, obj: str, ident: tuple[str, int] | None = None) -> JSONObject:
    """The fields every chunk of the answer shares (``ident``: the id and time keep-alives already used)."""
    cid, created = ident or _ident()
    return {"id": cid, "object": obj, "created": created, "model": res.request.model or model,
            "system_fingerprint": f"clawgym-{res.record.policy_name}-v{res.record.policy_version}"}


def keepalive_chunk(head: JSONObject) -> str:
    """A keep-alive of the answer whose chunks share ``head``: an empty ``chat.completion.chunk``.

    Only ``id``, ``object``, ``created``, ``model`` and (when known) ``system_fingerprint`` are taken from
    ``head``; ``choices`` is empty and ``usage`` null, so a client's accumulator has nothing to add.
    """
    keep = {k: head[k] for k in ("id", "object", "created", "model", "system_fingerprint") if k in head}
    return "data: " + json.dumps({**keep, "choices": [], "usage": None}, ensure_ascii=False) + "\n\n"


def _logprobs(res: TurnResult) -> JSONObject | None:
    if res.token_bytes is None:
        return None
    return {"content": [{"token": raw.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(raw),
                         "top_logprobs": []} for raw, lp in zip(res.token_bytes, res.logprobs)],
            "refusal": None}


def render_response(res: TurnResult, model: str) -> JSONObject:
    """The ``chat.completion`` object for a finished turn."""
    return {**_head(res, model, "chat.completion"),
            "choices": [{"index": 0, "message": res.message, "logprobs": _logprobs(res),
                         "finish_reason": res.finish_reason}],
            "usage": _usage(res)}


def stream_response(res: TurnResult, model: str, ident: tuple[str, int] | None = None) -> Iterator[str]:
    """SSE lines (``data: {...}\\n\\n``) of ``chat.completion.chunk`` objects, then ``data: [DONE]``.

    Order: a role delta; reasoning/content/tool-call deltas token by token in text order (a tool
    call's first chunk carries index, id, type, name and empty arguments, later ones argument text);
    a chunk with ``finish_reason``; a usage chunk with empty choices if ``include_usage``; ``[DONE]``.
    ``ident`` is the ``(id, created)`` that keep-alives of this answer already sent (fresh when None).
    """
    head = _head(res, model, "chat.completion.chunk", ident)
    if res.request.include_usage:
        head["usage"] = None

    def chunk(delta: JSONObject, finish: str | None = None) -> str:
        obj = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"

    yield chunk({"role": "assistant", "content": ""})
    for d in iter_deltas(res.pieces, res.seg):
        yield chunk(_delta(d))
    yield from _tail(res, head, chunk)


def _delta(d: Delta) -> JSONObject:
    """The chunk ``delta`` of one streamed increment."""
    if d.kind == "content":
        return {"content": d.text}
    if d.kind == "reasoning":
        return {"reasoning_content": d.text}
    if d.kind == "tool_start":
        return {"tool_calls": [{"index": d.index, "id": d.call_id, "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}


def _tail(res: TurnResult, head: JSONObject, chunk: Callable[..., str]) -> Iterator[str]:
    """The finish chunk, the usage chunk (when asked for) and ``[DONE]``."""
    yield chunk({}, res.finish_reason)
    if res.request.include_usage:
        yield "data: " + json.dumps({**head, "choices": [], "usage": _usage(res)}, ensure_ascii=False) + "\n\n"
    yield "data: [DONE]\n\n"


class ChatLive:
    """Live writer of one chat request (see :mod:`~clawgym_env.proxy.stream.live`): the chunks :func:`stream_response`
    sends, the text ones as the policy's text arrives."""

    def __init__(self, req: TurnRequest, model: str, start: LiveStart) -> None:
        self.head_obj: JSONObject = {
            "id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": req.model or model,
            "system_fingerprint": f"clawgym-{start.policy_name}-v{start.policy_version}"}
        if req.include_usage:
            self.head_obj["usage"] = None

    def _chunk(self, delta: JSONObject, finish: str | None = None) -> str:
        obj = {**self.head_obj, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"

    def tick(self) -> str:
        """An empty chunk of this answer (:func:`keepalive_chunk`), before or between the text chunks."""
        return keepalive_chunk(self.head_obj)

    def head(self) -> str:
        """The role chunk."""
        return self._chunk({"role": "assistant", "content": ""})

    def delta(self, kind: Kind, text: str) -> str:
        """A content or reasoning chunk."""
        return self._chunk({"content": text} if kind == "content" else {"reasoning_content": text})

    def finish(self, res: TurnResult, sent: dict[Kind, str]) -> Iterator[str]:
        """The text not sent yet, the tool-call chunks, then :func:`stream_response`'s tail."""
        fields: tuple[tuple[Kind, str], ...] = (("reasoning", "reasoning_content"), ("content", "content"))
        for kind, key in fields:
            text = rest(sent[kind], res.message.get(key) or "", kind)
            if text:
                yield self.delta(kind, text)
        for d in iter_deltas(res.pieces, res.seg):
            if d.kind in ("tool_start", "tool_args"):
                yield self._chunk(_delta(d))
        yield from _tail(res, self.head_obj, self._chunk)

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """The error envelope as one data line (as :class:`ChatKeepAlive`)."""
        return "data: " + json.dumps(error_body(status, message, field, code), ensure_ascii=False) + "\n\n"


def live(req: TurnRequest, body: Any, model: str, start: LiveStart) -> ChatLive:
    """The live writer of a streaming chat request."""
    return ChatLive(req, model, start)


class ChatKeepAlive:
    """Keep-alive stream of one chat request (see :mod:`~clawgym_env.proxy.stream.keepalive`).

    The answer's ``id`` and ``created`` are fixed when keep-alives start; the keep-alives and the answer's
    chunks share them. The keep-alives carry no ``system_fingerprint`` (the policy version that answers is
    not known yet); the answer's chunks do, and clients take it from the first chunk that has one.
    """

    def __init__(self, req: TurnRequest, model: str) -> None:
        self.model = model
        self.ident = _ident()
        self.head: JSONObject = {"id": self.ident[0], "object": "chat.completion.chunk",
                                     "created": self.ident[1], "model": req.model or model}

    def tick(self) -> str:
        """An empty chunk of this answer (:func:`keepalive_chunk`)."""
        return keepalive_chunk(self.head)

    def answer(self, res: TurnResult) -> Iterator[str]:
        """The chunks :func:`stream_response` sends, with the keep-alives' id and time."""
        return stream_response(res, self.model, self.ident)

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """The error envelope as one data line (no ``[DONE]`` follows)."""
        return "data: " + json.dumps(error_body(status, message, field, code), ensure_ascii=False) + "\n\n"


def keepalive(req: TurnRequest, body: Any, model: str) -> ChatKeepAlive:
    """The keep-alive stream of a streaming chat request."""
    return ChatKeepAlive(req, model)


def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> JSONObject:
    """OpenAI's error envelope ``{"error": {message, type, param, code}}``."""
    if status == 500:
        kind = "server_error"
    elif status >= 500:
        kind = "api_error"
    elif status == 401:
        kind = "authentication_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": field,
                      "code": None if code == kind else code}}


def models_body(model: str, created: int) -> JSONObject:
    """``GET /models``: a list holding the served model."""
    return {"object": "list", "data": [model_body(model, created)]}


def model_body(model: str, created: int) -> JSONObject:
    """``GET /models/{id}``: the served model."""
    return {"id": model, "object": "model", "created": created, "owned_by": "clawgym"}
