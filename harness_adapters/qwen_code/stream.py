"""Reading Qwen Code's ``--output-format stream-json`` output (one JSON event per stdout line).

Events seen from the pinned release: ``system`` (subtype ``init``: tools, model, session id),
``assistant`` and ``user`` (a ``message`` with content blocks: ``text``, ``thinking``,
``tool_use``, ``tool_result``), and one closing ``result`` (``subtype`` ``success`` or an error
subtype, ``is_error``, ``result`` text, ``num_turns``, ``usage``, ``duration_ms``).

Invariant: :func:`parse_stream` never raises; non-JSON lines are skipped; the final answer is the
``result`` text of a successful ``result`` event, else None.
"""

from __future__ import annotations

from clawgym_env.harness import HarnessOutput
from clawgym_env.jsontypes import JSONObject
from harness_adapters.jsonl_events import typed_events

SUMMARY_KEYS = ("subtype", "is_error", "num_turns", "duration_ms", "duration_api_ms", "usage", "session_id",
                "error", "stop_reason")


def _message(ev: JSONObject) -> JSONObject | None:
    msg = ev.get("message")
    if not isinstance(msg, dict):
        return None
    content = msg.get("content")
    return {"role": msg.get("role") or ev["type"], "content": content if content is not None else ""}


def parse_stream(stdout: str) -> HarnessOutput:
    """Final answer (the successful ``result`` event's text) and the assistant/user messages."""
    transcript: list[JSONObject] = []
    final = None
    for ev in typed_events(stdout):
        kind = ev["type"]
        if kind in ("assistant", "user"):
            msg = _message(ev)
            if msg is not None:
                transcript.append(msg)
        elif kind == "result":
            transcript.append({"role": "harness", "type": "qwen_result",
                               **{k: ev[k] for k in SUMMARY_KEYS if k in ev}})
            text = ev.get("result")
            ok = not ev.get("is_error") and ev.get("subtype", "success") == "success"
            final = text if ok and isinstance(text, str) and text.strip() else None
    return HarnessOutput(final_message=final, transcript=transcript)
