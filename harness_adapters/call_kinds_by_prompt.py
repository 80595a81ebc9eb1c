"""Telling a harness's calls apart by the system prompt it writes and whether it offers tools.

For harnesses that mark nothing else (no header, no request field of their own), what a call was for shows
in two places the harness alone controls: the system prompt at the head of the request and the tool list.
This module reads those two in any of the three dialects and applies one rule, parameterised per harness by
the openings of its prompts (:class:`PromptMarks`).

The rule (:func:`kinds_by_system_prompt`):

* a call offering **no tools** whose system prompt opens with one of the harness's tool-less openings (a title
  generator, a summariser) is the kind that opening names;
* the **main** prompt is that of the first call offering tools whose prompt opens with ``main_opening`` (any
  prompt when None) and with none of the tool-less openings; a call is main only when it offers tools and its
  system prompt is exactly that one, so a prompt written into the workspace cannot claim "main" by its words;
* when the harness has subagents (``subagent_evidence`` set), a call offering tools under any other system
  prompt, after a main call, is a **subagent**;
* anything else is left to the structural default (None).

Invariants: :func:`kinds_by_system_prompt` never raises and answers for every call, in order; every verdict's
evidence is a fixed string of the harness's marks; it reads only the system prompt (Chat Completions and
Responses ``messages``/``input`` item 0 with role ``system`` or ``developer``, Responses ``instructions``,
Messages ``system``) and the ``tools`` list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clawgym_env.capture.records import CallKind, CallRecord
from clawgym_env.harness import KindVerdict


@dataclass(frozen=True)
class PromptMarks:
    """One harness's prompt openings and the evidence its verdicts carry.

    ``toolless`` maps an opening to ``(kind, evidence)`` for a call offering no tools; ``subagent_evidence``
    None means the harness has no subagents (a call under another prompt is then left to the default).
    """

    main_evidence: str
    main_opening: str | None = None
    toolless: Mapping[str, tuple[CallKind, str]] = field(default_factory=dict)
    subagent_evidence: str | None = None


def content_text(content: Any) -> str | None:
    """A message content's text: a string as is, the ``text`` of its blocks joined, else None."""
    if isinstance(content, list):
        content = "".join(b.get("text", "") for b in content
                          if isinstance(b, Mapping) and isinstance(b.get("text"), str))
    return content if isinstance(content, str) else None


def system_prompt(call: CallRecord) -> str | None:
    """The system prompt of a captured request in any of the three dialects, or None."""
    request = call.request if isinstance(call.request, Mapping) else {}
    if "system" in request:  # Anthropic Messages
        return content_text(request.get("system"))
    if isinstance(request.get("instructions"), str):  # Responses
        return request["instructions"]
    messages = request.get("messages", request.get("input"))
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], Mapping):
        return None
    first = messages[0]
    return content_text(first.get("content")) if first.get("role") in ("system", "developer") else None


def has_tools(call: CallRecord) -> bool:
    """Whether a captured request offers any tools."""
    tools = call.request.get("tools") if isinstance(call.request, Mapping) else None
    return isinstance(tools, list) and bool(tools)


def kinds_by_system_prompt(calls: Sequence[CallRecord], marks: PromptMarks) -> list[KindVerdict]:
    """Per call, its kind by system prompt and tools under ``marks`` (see the module doc), else None."""
    try:
        systems = [system_prompt(c) for c in calls]
        tools = [has_tools(c) for c in calls]
    except Exception:  # noqa: BLE001 - a malformed record: leave the whole episode to the structural default
        return [None] * len(calls)
    openings = tuple(marks.toolless)

    def toolless_opening(system: str | None) -> str | None:
        return next((o for o in openings if system is not None and system.startswith(o)), None)

    main = next((s for s, t in zip(systems, tools) if t and s is not None and toolless_opening(s) is None
                 and (marks.main_opening is None or s.startswith(marks.main_opening))), None)
    out: list[KindVerdict] = []
    seen_main = False
    for system, offered in zip(systems, tools):
        opening = toolless_opening(system)
        if opening is not None and not offered:
            out.append(marks.toolless[opening])
        elif main is not None and offered and system == main:
            seen_main = True
            out.append(("main", marks.main_evidence))
        elif marks.subagent_evidence is not None and seen_main and offered and system is not None:
            out.append(("subagent", marks.subagent_evidence))
        else:
            out.append(None)
    return out
