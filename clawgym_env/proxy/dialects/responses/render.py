"""The OpenAI Responses dialect's answer (see :mod:`~clawgym_env.proxy.dialects.responses.dialect`): the ``response``
object of a finished turn (its output items: reasoning, message, function calls, each with the deltas a
stream sends) and OpenAI's error envelope.
"""

from __future__ import annotations

import base64
import time

from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.dialects.common import new_id, reasoning_tokens, split_output
from clawgym_env.proxy.dialects.openai_chat.dialect import error_body as _openai_error_body
from clawgym_env.proxy.sessions import TurnResult

ENCRYPTED_PREFIX = "clawgym-reasoning-v1:"  # our "encrypted" reasoning is base64 text, so it round-trips exactly


def encrypted(reasoning: str) -> str:
    """Our reversible ``encrypted_content`` of a reasoning text (base64 behind :data:`ENCRYPTED_PREFIX`)."""
    return ENCRYPTED_PREFIX + base64.b64encode(reasoning.encode("utf-8")).decode("ascii")


def output_items(res: TurnResult) -> list[JSONObject]:
    """The final output items, each with a private ``_chunks`` list (stream deltas) removed on render."""
    out = split_output(res)
    body = res.record.request
    items: list[JSONObject] = []
    if out.reasoning:
        item = {"id": new_id("rs_"), "type": "reasoning", "summary": [{"type": "summary_text", "text": out.reasoning}]}
        if "reasoning.encrypted_content" in (body.get("include") or []):
            item["encrypted_content"] = encrypted(out.reasoning)
        items.append({**item, "_chunks": out.reasoning_chunks})
    if out.content or not out.calls:
        status = "incomplete" if res.finish_reason == "length" else "completed"
        items.append({"id": new_id("msg_"), "type": "message", "status": status, "role": "assistant",
                      "content": [{"type": "output_text", "text": out.content, "annotations": [], "logprobs": []}],
                      "_chunks": out.content_chunks})
    for call in out.calls:
        items.append({"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call", "status": "completed",
                      "call_id": call.id, "name": call.name, "arguments": call.arguments, "_chunks": call.chunks})
    return items


def public(item: JSONObject) -> JSONObject:
    """An output item as sent (its private ``_chunks`` list removed)."""
    return {k: v for k, v in item.items() if k != "_chunks"}


def response_object(res: TurnResult, model: str, rid: str, created: int, output: list[JSONObject] | None,
              ) -> JSONObject:
    """The ``response`` object of ``res``: in progress (``output`` None) or finished with ``output``."""
    done = output is not None
    status = "in_progress" if not done else "incomplete" if res.finish_reason == "length" else "completed"
    usage = {"input_tokens": res.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": res.completion_tokens,
             "output_tokens_details": {"reasoning_tokens": reasoning_tokens(res)},
             "total_tokens": res.prompt_tokens + res.completion_tokens}
    return envelope(res.record.request, res.request.model or model, res.record.sampling, rid, created, status,
                     usage if done else None, output)


def envelope(body: JSONObject, model: str, sampling: JSONObject, rid: str, created: int, status: str,
              usage: JSONObject | None, output: list[JSONObject] | None) -> JSONObject:
    """The ``response`` object's fields for a request ``body`` in any ``status``."""
    asked = body.get("reasoning")
    reasoning: JSONObject = asked if isinstance(asked, dict) else {}
    return {"id": rid, "object": "response", "created_at": created, "status": status, "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "model": model, "output": output or [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "previous_response_id": None,
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "store": body.get("store", True), "temperature": sampling.get("temperature"),
            "text": {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "top_p": sampling.get("top_p"), "truncation": "disabled",
            "usage": usage, "metadata": body.get("metadata") or {}}


def render_response(res: TurnResult, model: str) -> JSONObject:
    """The ``response`` object for a finished turn."""
    return response_object(res, model, new_id("resp_"), int(time.time()), [public(i) for i in output_items(res)])

def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> JSONObject:
    """OpenAI's error envelope ``{"error": {message, type, param, code}}`` (as in chat completions)."""
    return _openai_error_body(status, message, field, code)
