"""Reading ``opencode run --format json`` output (one JSON event per stdout line).

Events seen from the pinned release, each with ``type``, ``timestamp``, ``sessionID``: ``step_start``,
``text`` (``part.text``, one finished text part), ``reasoning``, ``tool_use`` (``part.tool``,
``part.state`` with ``input``/``output``/``status``), ``step_finish`` (``part.reason``: ``tool-calls`` when
the step ends in tool calls, ``stop`` when the model answered, plus ``part.tokens``), and ``error``
(``error.name``, ``error.data.message``) when the session fails.

Invariant: :func:`parse_events` never raises; non-JSON lines are skipped. The final answer is the text
of the last step when that step finished for another reason than tool calls and no error followed it;
else None.
"""

from __future__ import annotations

from clawgym_env.harness import HarnessOutput
from clawgym_env.jsontypes import JSONObject
from harness_adapters.jsonl_events import typed_events


def _part(ev: JSONObject) -> JSONObject:
    part = ev.get("part")
    return part if isinstance(part, dict) else {}


def _entry(ev: JSONObject) -> JSONObject | None:
    """One transcript entry for an event (None for step boundaries)."""
    kind, part = ev["type"], _part(ev)
    if kind in ("text", "reasoning") and isinstance(part.get("text"), str):
        return {"role": "assistant", "type": kind, "content": part["text"]}
    if kind == "tool_use":
        raw = part.get("state")
        state: JSONObject = raw if isinstance(raw, dict) else {}
        return {"role": "tool", "type": "tool_use", "tool": part.get("tool"), "call_id": part.get("callID"),
                "status": state.get("status"), "input": state.get("input"), "output": state.get("output")}
    if kind == "error":
        return {"role": "harness", "type": "opencode_error", "error": ev.get("error")}
    return None


def parse_events(stdout: str) -> HarnessOutput:
    """Final answer (see the module doc) and the text, reasoning, tool and error entries in order."""
    transcript: list[JSONObject] = []
    step_text: list[str] = []
    final: str | None = None
    for ev in typed_events(stdout):
        kind = ev["type"]
        if kind == "step_start":
            step_text, final = [], None
        elif kind == "text" and isinstance(_part(ev).get("text"), str):
            step_text.append(_part(ev)["text"])
        elif kind == "step_finish":
            reason = _part(ev).get("reason")
            text = "\n".join(t for t in step_text if t.strip()).strip()
            final = text if reason != "tool-calls" and text else None
        elif kind == "error":
            final = None
        entry = _entry(ev)
        if entry is not None:
            transcript.append(entry)
    return HarnessOutput(final_message=final, transcript=transcript)
