"""The OpenAI Responses dialect: ``POST /v1/responses`` (stateless: every call sends its whole input).

The request is mapped onto the pipeline's OpenAI-chat shape, then rendered by the Qwen3 template:
  * ``instructions`` → a leading system message; ``input`` as a string → one user message.
  * ``message`` items (role user/system/developer/assistant; content a string or parts:
    ``input_text``/``output_text`` → text, ``refusal`` → its text, ``input_image``/``input_file``/
    ``input_audio`` → ``[image]``/``[file]``/``[audio]``) → messages (developer renders as system).
  * ``function_call`` items → ``tool_calls`` (``id`` = ``call_id``, ``arguments`` verbatim) of the
    assistant message right before them, or of a new one; the item ``id`` (``fc_...``) is dropped.
  * ``function_call_output`` → a ``tool`` message (``tool_call_id`` = ``call_id``).
  * ``reasoning`` items → ``reasoning_content`` of the next assistant message (from our own
    ``encrypted_content`` if present, else ``content`` reasoning texts, else ``summary`` texts);
    reasoning not followed by assistant output is dropped. Other item types are rejected (400), among
    them ``compaction_trigger`` and ``compaction`` (server-side compaction needs server state), with a
    message that names the item and says how to avoid it.
  * tools: only ``type: "function"`` tools reach the template; hosted/namespace/custom tools (e.g.
    ``web_search``) are skipped. ``tool_choice: "none"`` hides the tools; other choices offer them
    unchanged. ``reasoning.effort`` none|minimal → ``enable_thinking=False``, low..xhigh → True, absent →
    the template default. ``store``, ``include``, ``parallel_tool_calls``, ``prompt_cache_key``,
    ``client_metadata``, ``metadata``, ``text``, ``truncation`` ... are accepted and ignored;
    ``previous_response_id``, ``conversation`` and ``background: true`` need server-side state
    this proxy does not keep (400).

Requests are validated by :mod:`~clawgym_env.proxy.dialects.responses.request`'s models; a 400 names the field.

Response: ``output`` = a ``reasoning`` item (if the model reasoned: the whole reasoning as one
summary part, plus an opaque, reversible ``encrypted_content`` when ``include`` asks for it), a
``message`` item (present unless the turn is only tool calls), ``function_call`` items (``fc_`` id,
``call_`` call id). A turn cut by the token limit is ``status: "incomplete"``. Keep-alives
(:func:`keepalive`) are the response's own lifecycle events (``response.created``, then repeated
``response.in_progress``); an in-stream error is ``response.failed`` followed by ``error``.

This module maps requests; the answer side lives in :mod:`~clawgym_env.proxy.dialects.responses.render` (the
``response`` object, the error envelope) and :mod:`~clawgym_env.proxy.dialects.responses.stream` (the events: whole,
live and keep-alive), and is re-exported here, where the dialect registry finds it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.dialects.common import JOIN
from clawgym_env.proxy.dialects.contract import DialectSpec, Route
from clawgym_env.proxy.dialects.request_base import bad, validate_body
from clawgym_env.proxy.dialects.responses.render import ENCRYPTED_PREFIX, error_body, render_response
from clawgym_env.proxy.dialects.responses.request import (
    EFFORT_THINKS,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
    RefusalPart,
    ResponsesContent,
    ResponsesRequest,
    TextPart,
)
from clawgym_env.proxy.dialects.responses.stream import (
    ResponsesKeepAlive,
    ResponsesLive,
    keepalive,
    live,
    stream_response,
)
from clawgym_env.proxy.sessions import TurnRequest

__all__ = ["DIALECT", "ResponsesKeepAlive", "ResponsesLive", "error_body", "keepalive", "live", "parse_request",
           "render_response", "stream_response"]

_PLACEHOLDERS = {"input_image": "[image]", "input_file": "[file]", "input_audio": "[audio]"}


DIALECT = DialectSpec(routes=(Route("/v1/responses"),), history_key="input")
"""``POST /ep/{token}/v1/responses``; the conversation is ``input``."""


def _parts_text(value: ResponsesContent) -> str:
    if isinstance(value, str):
        return value
    parts = []
    for part in value:
        if isinstance(part, TextPart):
            parts.append(part.text)
        elif isinstance(part, RefusalPart):
            parts.append(part.refusal)
        else:
            parts.append(_PLACEHOLDERS[part.type])
    return JOIN.join(parts)


def _reasoning_text(item: ReasoningItem) -> str:
    enc = item.encrypted_content
    if enc is not None and enc.startswith(ENCRYPTED_PREFIX):
        try:
            return base64.b64decode(enc[len(ENCRYPTED_PREFIX):], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            pass  # not ours after all: fall back to the readable parts
    for parts in (item.content, item.summary):
        texts = [p.text for p in parts or [] if isinstance(p, TextPart)]
        if texts:
            return JOIN.join(texts)
    return ""


def _messages(req: ResponsesRequest) -> list[JSONObject]:
    out: list[JSONObject] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    reasoning: list[str] = []
    open_turn = False  # the last item was assistant output that a function_call may join
    for item in items:
        if isinstance(item, ReasoningItem):
            text = _reasoning_text(item)
            if text:
                reasoning.append(text)
            open_turn = False
            continue
        if isinstance(item, MessageItem):
            msg: JSONObject = {"role": item.role, "content": _parts_text(item.content)}
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if open_turn and not reasoning:
                out[-1].setdefault("tool_calls", []).append(call)
                continue
            msg = {"role": "assistant", "content": "", "tool_calls": [call]}
        elif isinstance(item, FunctionCallOutputItem):
            msg = {"role": "tool", "tool_call_id": item.call_id, "content": _parts_text(item.output)}
        else:  # CompactionItem never validates; this keeps the mapping total
            raise bad("server-side compaction is not supported", "input")
        if msg["role"] == "assistant" and reasoning:
            msg["reasoning_content"] = JOIN.join(reasoning)
        reasoning = []
        open_turn = msg["role"] == "assistant"
        out.append(msg)
    if not out:
        raise bad("'input' must contain at least one item", "input")
    return out


def _tools(req: ResponsesRequest) -> list[JSONObject]:
    if req.tool_choice == "none":
        return []
    out = []
    for tool in req.function_tools():  # hosted, namespace or custom tools: nothing the template can offer
        fn: JSONObject = {"name": tool.name}
        if tool.description is not None:
            fn["description"] = tool.description
        if tool.parameters is not None:
            fn["parameters"] = tool.parameters
        out.append({"type": "function", "function": fn})
    return out


def parse_request(body: Any) -> TurnRequest:
    """Validate a Responses body and map it (see the module docstring); 400 names the bad field."""
    req = validate_body(ResponsesRequest, body)
    effort = req.reasoning.effort if req.reasoning else None
    return TurnRequest(messages=_messages(req), tools=_tools(req), max_tokens=req.max_output_tokens,
                       temperature=req.temperature, top_p=req.top_p, stream=bool(req.stream), model=req.model,
                       enable_thinking=None if effort is None else EFFORT_THINKS[effort], source=req)
