"""How pi marks its own calls: the main agent by its system prompt and tools, compaction by its own prompt.

Evidence (captured from the pinned release, ``-p --mode json`` through the proxy):

* **Main agent**: every request carries the same system prompt (built in, opening with :data:`MAIN_OPENING`, plus
  the workspace's context files) and offers pi's tools (``read``, ``bash``, ``edit``, ``write``). pi makes no
  side calls in print mode (no title, no probes) and has no subagents.
* **Compaction** (when the context nears the model's window): a separate request whose system prompt opens with
  :data:`COMPACT_OPENING` and that offers no tools.

Invariants: :func:`pi_kinds` never raises and answers for every call. It reads only the system prompt (Chat
Completions ``messages[0]``, Responses ``instructions``, Messages ``system``) and whether tools are offered. A
call is main only when its system prompt is exactly that of the first call offering tools and it offers tools
(so a prompt written into the workspace cannot claim "main" by its opening words); the compaction prompt counts
only without tools; anything else is left to the structural default (None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import KindVerdict

MAIN_OPENING = "You are an expert coding assistant operating inside pi"
COMPACT_OPENING = "You are a context summarization assistant."


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


def pi_kinds(calls: Sequence[CallRecord]) -> list[KindVerdict]:
    """Per call, main / compaction by system prompt and tools (see the module doc), else None. Never raises."""
    try:
        systems = [system_prompt(c) for c in calls]
        tools = [has_tools(c) for c in calls]
    except Exception:  # noqa: BLE001 - a malformed record: leave the whole episode to the structural default
        return [None] * len(calls)
    main = next((s for s, t in zip(systems, tools) if t and s is not None and s.startswith(MAIN_OPENING)), None)
    out: list[KindVerdict] = []
    for system, offered in zip(systems, tools):
        if system is not None and system.startswith(COMPACT_OPENING) and not offered:
            out.append(("compaction", "pi's summarization system prompt, no tools offered"))
        elif main is not None and offered and system == main:
            out.append(("main", "pi's agent system prompt (that of its first call offering tools)"))
        else:
            out.append(None)
    return out
