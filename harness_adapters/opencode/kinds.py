"""How OpenCode marks its own calls: by the system prompt it writes and whether it offers tools.

Evidence (captured from the pinned release, ``opencode run`` through the proxy, all three client packages):

* **Title** (a side call): unless ``--title`` is given, the session's first request asks for a thread title; its
  system prompt opens with :data:`TITLE_OPENING` and it offers no tools. It runs beside the agent's first call.
* **Main agent**: the agent's requests share one system prompt (which of OpenCode's prompts depends on the
  model name; for an unknown name it opens "You are opencode, an interactive CLI tool") and offer its tools.
* **Subagent** (the ``task`` tool): the delegated agent's requests carry a system prompt of their own with
  their own tools.

Invariants: :func:`opencode_kinds` never raises and answers for every call. It reads only the system message
at position 0 (Chat Completions ``messages``, Responses ``instructions``/``input``, Messages ``system``) and
whether tools are offered. The main prompt is that of the first call offering tools; a call is main only when
its system prompt is exactly that one and it offers tools; a call with tools and another system prompt after
a main call is a subagent; the title prompt without tools is a side call; anything else is left to the
structural default (None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import KindVerdict

TITLE_OPENING = "You are a title generator."


def _text(content: Any) -> str | None:
    if isinstance(content, list):
        content = "".join(b.get("text", "") for b in content
                          if isinstance(b, Mapping) and isinstance(b.get("text"), str))
    return content if isinstance(content, str) else None


def system_prompt(call: CallRecord) -> str | None:
    """The system prompt of a captured request in any of the three dialects, or None."""
    request = call.request if isinstance(call.request, Mapping) else {}
    if "system" in request:  # Anthropic Messages
        return _text(request.get("system"))
    if isinstance(request.get("instructions"), str):  # Responses
        return request["instructions"]
    messages = request.get("messages", request.get("input"))
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], Mapping):
        return None
    first = messages[0]
    return _text(first.get("content")) if first.get("role") in ("system", "developer") else None


def has_tools(call: CallRecord) -> bool:
    """Whether a captured request offers any tools."""
    tools = call.request.get("tools") if isinstance(call.request, Mapping) else None
    return isinstance(tools, list) and bool(tools)


def opencode_kinds(calls: Sequence[CallRecord]) -> list[KindVerdict]:
    """Per call, side (title) / main / subagent by system prompt and tools (see the module doc), else None."""
    try:
        systems = [system_prompt(c) for c in calls]
        tools = [has_tools(c) for c in calls]
    except Exception:  # noqa: BLE001 - a malformed record: leave the whole episode to the structural default
        return [None] * len(calls)
    main = next((s for s, t in zip(systems, tools) if t and s is not None and not s.startswith(TITLE_OPENING)), None)
    out: list[KindVerdict] = []
    seen_main = False
    for system, offered in zip(systems, tools):
        if system is not None and system.startswith(TITLE_OPENING) and not offered:
            out.append(("side", "OpenCode's title generator prompt, no tools offered"))
        elif main is not None and offered and system == main:
            seen_main = True
            out.append(("main", "OpenCode's agent system prompt (that of its first call offering tools)"))
        elif seen_main and offered and system is not None:
            out.append(("subagent", "a system prompt other than the main agent's, with its own tools"))
        else:
            out.append(None)
    return out
