"""The Anthropic Messages dialect's answer (see :mod:`~clawgym_env.proxy.dialects.anthropic.dialect`): the ``message``
object of a finished turn, its content blocks in order (thinking, text, tool_use, each with the deltas a
stream sends), stop reason and usage, and the API's error envelope.
"""

from __future__ import annotations

import hashlib
import json

from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.dialects.common import json_object, new_id, split_output
from clawgym_env.proxy.sessions import TurnResult

_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def signature(thinking: str) -> str:
    """The signature sent with a thinking block (a digest of its text; never checked on the way back)."""
    return "clawgym-" + hashlib.sha256(thinking.encode("utf-8")).hexdigest()


def answer_blocks(res: TurnResult) -> list[tuple[JSONObject, list[JSONObject]]]:
    """(final block, stream deltas) per content block, in order: thinking, text, tool_use."""
    out = split_output(res)
    blocks: list[tuple[JSONObject, list[JSONObject]]] = []
    if out.reasoning:
        sig = signature(out.reasoning)
        deltas = [{"type": "thinking_delta", "thinking": c} for c in out.reasoning_chunks]
        blocks.append(({"type": "thinking", "thinking": out.reasoning, "signature": sig},
                       deltas + [{"type": "signature_delta", "signature": sig}]))
    if out.content or not out.calls:
        blocks.append(({"type": "text", "text": out.content},
                       [{"type": "text_delta", "text": c} for c in out.content_chunks]))
    for call in out.calls:
        args = json_object(call.arguments)
        chunks = call.chunks
        if args is None:  # not a JSON object: wrap it so ``input`` stays an object
            args = {"_raw_arguments": call.arguments}
            chunks = [json.dumps(args, ensure_ascii=False)]
        blocks.append(({"type": "tool_use", "id": call.id, "name": call.name, "input": args},
                       [{"type": "input_json_delta", "partial_json": c} for c in chunks]))
    return blocks


def stop_reason(res: TurnResult) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a finished turn."""
    if res.stop_sequence is not None and res.finish_reason == "stop":
        return "stop_sequence", res.stop_sequence
    return _STOP.get(res.finish_reason, "end_turn"), None


def usage(res: TurnResult) -> dict[str, int]:
    """The ``usage`` object of a finished turn."""
    return {"input_tokens": res.prompt_tokens, "output_tokens": res.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def message_object(res: TurnResult, model: str, content: list[JSONObject]) -> JSONObject:
    """A ``message`` object with ``content`` and no stop reason yet (set by the caller)."""
    return {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": res.request.model or model,
            "content": content, "stop_reason": None, "stop_sequence": None, "usage": usage(res)}


def render_response(res: TurnResult, model: str) -> JSONObject:
    """The ``message`` object for a finished turn."""
    msg = message_object(res, model, [block for block, _ in answer_blocks(res)])
    msg["stop_reason"], msg["stop_sequence"] = stop_reason(res)
    return msg


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> JSONObject:
    """Anthropic's error envelope ``{"type": "error", "error": {"type", "message"}}``."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": new_id("req_")}
