"""Reading pi's ``--mode json`` output (one JSON event per stdout line).

Events seen from the pinned release: ``session`` (header), ``agent_start``, ``turn_start``, ``message_start`` /
``message_update`` (each delta repeats the partial message) / ``message_end`` (a finished message: ``role``
``user``, ``assistant`` or ``toolResult``; an assistant message has ``content`` blocks ``text``, ``thinking``,
``toolCall`` and a ``stopReason``: ``stop``, ``toolUse``, ``length``, ``error`` or ``aborted``, with
``errorMessage`` on failure), ``tool_execution_*``, ``turn_end``, ``compaction_start`` / ``compaction_end``,
``auto_retry_*`` and, last, ``agent_end`` with every message of the run.

Invariants: :func:`parse_events` never raises; non-JSON lines (a tail cut mid-line) are skipped. The messages
are those of ``agent_end`` when present, else the ``message_end`` ones; the final answer is the text of the
last assistant message when it stopped with ``stop``, else None.
"""

from __future__ import annotations

from clawgym_env.harness import HarnessOutput
from clawgym_env.jsontypes import JSONObject
from harness_adapters.jsonl_events import typed_events

HARNESS_EVENTS = ("compaction_start", "compaction_end", "auto_retry_start", "auto_retry_end")


def _text(message: JSONObject) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    blocks = content if isinstance(content, list) else []
    return "".join(b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"
                   and isinstance(b.get("text"), str))


def final_answer(messages: list[JSONObject]) -> str | None:
    """The text of the last assistant message when it stopped with ``stop`` (see the module doc)."""
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    if last is None or last.get("stopReason") != "stop":
        return None
    text = _text(last).strip()
    return text or None


def parse_events(stdout: str) -> HarnessOutput:
    """Final answer and transcript (the run's messages, then compaction and retry events) from the output."""
    evs = typed_events(stdout)
    ended = [m for m in (evs[-1].get("messages") if evs and evs[-1]["type"] == "agent_end" else None) or []
             if isinstance(m, dict)]
    messages = ended or [ev["message"] for ev in evs
                         if ev["type"] == "message_end" and isinstance(ev.get("message"), dict)]
    transcript: list[JSONObject] = [dict(m) for m in messages]
    transcript += [{"role": "harness", "type": f"pi_{ev['type']}", **{k: v for k, v in ev.items() if k != "type"}}
                   for ev in evs if ev["type"] in HARNESS_EVENTS]
    return HarnessOutput(final_message=final_answer(messages), transcript=transcript)
