"""Reading Claude Code's ``--output-format stream-json`` output (one JSON event per stdout line).

Events seen with ``-p --verbose``: ``system`` (subtype ``init`` with the tool list and session id,
``api_retry``, ...), ``assistant`` (one per content block: ``text``, ``thinking``, ``tool_use``),
``user`` (``tool_result`` blocks), and one closing ``result`` event (``result`` text, ``is_error``,
``subtype``, ``num_turns``, ``usage``, ``terminal_reason``).

Invariants of :func:`parse_stream`:
  * it never raises on bad input: non-JSON lines (a crash trace, a warning) are skipped;
  * the final answer is the last ``result`` event's ``result`` text, only when that event is not
    an error (``is_error`` false and ``subtype == "success"``); an error result (API error, turn
    limit) gives ``None``, and its text is kept in the transcript as an ``error`` entry;
  * the transcript is the conversation in order, Anthropic message shape: ``{"role": "assistant" |
    "user", "content": [blocks]}``; consecutive events of one API message (same message id) are
    merged into one assistant message, as the harness sent them to the model.
"""

from __future__ import annotations

from typing import Any

from clawgym_env.jsontypes import JSONObject
from harness_adapters.jsonl_events import json_objects


def _blocks(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def parse_stream(stdout: str) -> tuple[str | None, list[JSONObject], JSONObject]:
    """``(final answer or None, transcript, summary)`` from Claude Code's stream-json stdout.

    ``summary`` holds the ``init`` event's ``tools``/``model``/``session_id`` and the ``result``
    event's ``subtype``/``is_error``/``num_turns``/``terminal_reason``/``usage`` when present.
    """
    transcript: list[JSONObject] = []
    summary: JSONObject = {}
    final: str | None = None
    last_id: str | None = None
    for ev in json_objects(stdout):
        kind = ev.get("type")
        if kind == "system" and ev.get("subtype") == "init":
            summary.update({k: ev.get(k) for k in ("tools", "model", "session_id", "cwd", "permissionMode")})
        elif kind == "assistant":
            msg = ev.get("message") or {}
            blocks = _blocks(msg)
            if ev.get("is_api_error_message"):
                transcript.append({"role": "error", "content": blocks, "error": ev.get("api_error")})
                last_id = None
                continue
            mid = msg.get("id") if isinstance(msg, dict) else None
            if mid and mid == last_id and transcript and transcript[-1]["role"] == "assistant":
                transcript[-1]["content"].extend(blocks)
            else:
                transcript.append({"role": "assistant", "content": blocks})
            last_id = mid
        elif kind == "user":
            transcript.append({"role": "user", "content": _blocks(ev.get("message") or {})})
            last_id = None
        elif kind == "result":
            summary.update({k: ev.get(k) for k in ("subtype", "is_error", "num_turns", "terminal_reason",
                                                    "usage", "duration_ms", "api_error")})
            text = ev.get("result")
            ok = not ev.get("is_error") and ev.get("subtype") == "success"
            final = text if ok and isinstance(text, str) else None
            if not ok:
                transcript.append({"role": "error", "content": [{"type": "text", "text": str(text or "")}],
                                   "error": ev.get("subtype")})
    return final, transcript, summary
