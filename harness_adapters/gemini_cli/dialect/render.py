"""The Gemini API's answers: ``GenerateContentResponse`` (whole, or as ``alt=sse`` chunks), keep-alives, errors.

Invariants:
  * The parts of an answer are, in order: the reasoning as one ``thought`` text part (when the model reasoned),
    the text (when there is any), one ``functionCall`` part per tool call (``id`` = the recorded call's id,
    ``args`` = its parsed arguments). The streamed chunks' parts, concatenated, are exactly these parts; only
    the last chunk carries ``finishReason`` and ``usageMetadata``.
  * ``finishReason`` is ``STOP`` (a finished turn, with or without calls) or ``MAX_TOKENS`` (cut by the budget).
  * Errors are Google's envelope ``{"error": {"code", "message", "status"}}``, ``status`` the canonical name of
    the HTTP status (400 ``INVALID_ARGUMENT``, 404 ``NOT_FOUND``, 429 ``RESOURCE_EXHAUSTED``, ...).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.sessions import TurnRequest, TurnResult

STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                405: "UNIMPLEMENTED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
                499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
                504: "DEADLINE_EXCEEDED"}


def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> JSONObject:
    """Google's error envelope; the status name of ``status`` (``UNKNOWN`` for one without a canonical name)."""
    return {"error": {"code": status, "message": message, "status": STATUS_NAMES.get(status, "UNKNOWN")}}


def _args(arguments: Any) -> JSONObject:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else {}
    except json.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_value": value}


def answer_parts(res: TurnResult) -> list[JSONObject]:
    """The answer's parts, in the order of the module invariants."""
    msg = res.message
    parts: list[JSONObject] = []
    if msg.get("reasoning_content"):
        parts.append({"text": msg["reasoning_content"], "thought": True})
    if msg.get("content"):
        parts.append({"text": msg["content"]})
    for call in msg.get("tool_calls") or []:
        fn = call["function"]
        parts.append({"functionCall": {"id": call["id"], "name": fn["name"], "args": _args(fn.get("arguments"))}})
    return parts


def _usage(res: TurnResult) -> JSONObject:
    return {"promptTokenCount": res.prompt_tokens, "candidatesTokenCount": res.completion_tokens,
            "totalTokenCount": res.prompt_tokens + res.completion_tokens}


def _response(parts: list[JSONObject], model: str, rid: str, finish: str | None = None,
              usage: JSONObject | None = None) -> JSONObject:
    candidate: JSONObject = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    out: JSONObject = {"candidates": [candidate]}
    if usage is not None:
        out["usageMetadata"] = usage
    out["modelVersion"] = model
    out["responseId"] = rid
    return out


def _finish(res: TurnResult) -> str:
    return "MAX_TOKENS" if res.finish_reason == "length" else "STOP"


def render_response(res: TurnResult, model: str) -> JSONObject:
    """The whole answer of ``generateContent``."""
    return _response(answer_parts(res), model, uuid.uuid4().hex, _finish(res), _usage(res))


def _data(obj: JSONObject) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False) + "\r\n\r\n"


def stream_response(res: TurnResult, model: str, rid: str | None = None) -> Iterator[str]:
    """The ``alt=sse`` chunks of ``streamGenerateContent``: one per text part, the calls with the finish last."""
    rid = rid or uuid.uuid4().hex
    parts = answer_parts(res)
    texts = [p for p in parts if "functionCall" not in p]
    calls = [p for p in parts if "functionCall" in p]
    for part in texts if calls else texts[:-1]:
        yield _data(_response([part], model, rid))
    yield _data(_response(calls if calls else texts[-1:], model, rid, _finish(res), _usage(res)))


class GeminiKeepAlive:
    """Keep-alives of one streamed request: chunks with no parts (clients add nothing for them); the answer's
    chunks share their ``responseId``."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.rid = uuid.uuid4().hex

    def tick(self) -> str:
        """An empty chunk of this answer."""
        return _data(_response([], self.model, self.rid))

    def answer(self, res: TurnResult) -> Iterator[str]:
        """The chunks :func:`stream_response` sends, with the keep-alives' ``responseId``."""
        return stream_response(res, self.model, self.rid)

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """The error envelope as one data line (the stream ends after it)."""
        return _data(error_body(status, message, field, code))


def keepalive(req: TurnRequest, body: Any, model: str) -> GeminiKeepAlive:
    """The keep-alive stream of a ``streamGenerateContent`` request."""
    return GeminiKeepAlive(model)
