"""Helpers shared by the Anthropic Messages and OpenAI Responses dialects.

Requests are validated by pydantic models (:mod:`~clawgym_env.proxy.dialects.request_base` and the ``requests_*``
modules); this module holds the response side: :func:`split_output` regroups a finished turn into the pieces
both dialects render as typed blocks/items (reasoning, text, tool calls), each with its per-token stream chunks.

Invariants:
  * ``"".join(out.reasoning_chunks) == out.reasoning`` (or both empty), ``"".join(out.content_chunks)
    == out.content`` and ``"".join(call.chunks) == call.arguments`` for every call; these are exactly
    the reasoning, content and tool calls of the recorded ``response_message``, so a streamed answer
    and a non-streamed one carry the same text.
  * Chunks follow the sampled tokens (one chunk per token share, never half a character).
  * Multi-part text inputs are flattened with :data:`JOIN` between parts (a one-part list and a plain
    string therefore render identically).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.deltas import iter_deltas
from clawgym_env.proxy.sessions import TurnResult

JOIN = "\n"


def new_id(prefix: str) -> str:
    """``prefix`` + 24 random hex digits (message, response, item ids)."""
    return prefix + uuid.uuid4().hex[:24]


def sse(event: str, data: JSONObject) -> str:
    """One server-sent event with a named type and a JSON payload."""
    return f"event: {event}\ndata: " + json.dumps(data, ensure_ascii=False) + "\n\n"


def json_object(text: str) -> JSONObject | None:
    """``text`` parsed as a JSON object (NaN/Infinity rejected), else None."""
    def no_constants(name: str) -> Any:
        raise ValueError(name)

    try:
        value = json.loads(text, parse_constant=no_constants)
    except (ValueError, TypeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


@dataclasses.dataclass
class CallOut:
    """One tool call of a finished turn, with its argument stream chunks."""

    id: str
    name: str
    arguments: str  # the JSON string of the recorded response_message
    chunks: list[str]


@dataclasses.dataclass
class Output:
    """A finished turn regrouped for rendering (see the module invariants)."""

    reasoning: str  # "" when the turn has no (or empty) reasoning
    reasoning_chunks: list[str]
    content: str
    content_chunks: list[str]
    calls: list[CallOut]


def _checked(chunks: list[str], whole: str) -> list[str]:
    return chunks if "".join(chunks) == whole else ([whole] if whole else [])


def split_output(res: TurnResult) -> Output:
    """Group the turn's ordered deltas by what they belong to (see the module invariants)."""
    msg = res.message
    reasoning = msg.get("reasoning_content") or ""
    content = msg.get("content") or ""
    calls = [CallOut(tc["id"], tc["function"]["name"], tc["function"]["arguments"], [])
             for tc in msg.get("tool_calls") or []]
    r_chunks: list[str] = []
    c_chunks: list[str] = []
    for d in iter_deltas(res.pieces, res.seg):
        if d.kind == "reasoning":
            r_chunks.append(d.text)
        elif d.kind == "content":
            c_chunks.append(d.text)
        elif d.kind == "tool_args" and d.index < len(calls):
            calls[d.index].chunks.append(d.text)
    for call in calls:
        call.chunks = _checked(call.chunks, call.arguments)
    return Output(reasoning, _checked(r_chunks, reasoning), content, _checked(c_chunks, content), calls)


def reasoning_tokens(res: TurnResult) -> int:
    """How many output tokens end at or before the closing ``</think>`` (0 without reasoning)."""
    text = res.seg.text
    at = text.find("</think>")
    if res.seg.reasoning_span is None or at < 0:
        return 0
    limit, pos, n = at + len("</think>"), 0, 0
    for piece in res.pieces:
        pos += len(piece)
        if pos > limit:
            break
        n += 1
    return n
