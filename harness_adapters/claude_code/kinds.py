"""How Claude Code marks its own calls: which captured call was the main agent, a subagent or a compaction.

Evidence (captured from the pinned release, print mode, through the proxy):

* **Subagent** (the ``Agent`` tool; nested agents too): every request of a delegated agent carries the header
  ``x-claude-code-agent-id`` (a nested one also ``x-claude-code-parent-agent-id``); the main agent's requests
  never do. The subagent's system prompt also opens with a billing line holding ``cc_is_subagent=true``.
* **Compaction** (auto-compact, e.g. with ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` and
  ``CLAUDE_AUTOCOMPACT_PCT_OVERRIDE``): the summary request is the main conversation re-sent with one more
  top-level ``text`` block appended by Claude Code after the last user turn's blocks, opening with
  :data:`COMPACT_OPENING`; same headers, system prompt and tools as the main agent. After it the main agent
  continues in a new conversation opened by the summary (and a new billing hash at the head of the system
  prompt, which is why the prompt-prefix default cannot see it as one conversation).
* **Side calls**: none in print mode, with or without ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``.

Invariants: :func:`claude_code_kinds` never raises and answers for every call; it reads only what Claude Code
itself controls (headers, the system prompt's billing line, the position and type of a top-level content block).
The model cannot forge a header, and what it makes a tool print lands inside a ``tool_result`` block, never as a
top-level text block of its own; the first user message (the task's instruction) is never read as a compaction.
A call with no ``x-claude-code-agent-id`` that offers tools is the main agent's (Claude Code sends nothing else
in print mode); a call offering no tools is left to the structural default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import KindVerdict, verdicts_per_call

AGENT_ID_HEADER = "x-claude-code-agent-id"
PARENT_ID_HEADER = "x-claude-code-parent-agent-id"
SUBAGENT_BILLING_MARK = "cc_is_subagent=true"
BILLING_PREFIX = "x-anthropic-billing-header:"
COMPACT_OPENING = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."
"""How Claude Code's compaction instruction opens (appended as the last top-level text block)."""


def _header(headers: Mapping[str, Any] | None, name: str) -> str | None:
    if not isinstance(headers, Mapping):
        return None
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == name and isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _billing_line(request: Mapping[str, Any]) -> str | None:
    system = request.get("system")
    first = system[0] if isinstance(system, list) and system else None
    text = first.get("text") if isinstance(first, Mapping) else system if isinstance(system, str) else None
    if isinstance(text, str) and text.startswith(BILLING_PREFIX):
        return text.split("\n", 1)[0]
    return None


def is_compaction(request: Mapping[str, Any]) -> bool:
    """True when the request's last user turn ends with Claude Code's own compaction block (see the module doc)."""
    messages = request.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return False
    if not any(isinstance(m, Mapping) and m.get("role") == "assistant" for m in messages):
        return False  # the first user message is the task's instruction, never Claude Code's summary request
    last = messages[-1]
    if not isinstance(last, Mapping) or last.get("role") != "user":
        return False
    content = last.get("content")
    if not isinstance(content, list) or not content:
        return False
    block = content[-1]
    return (isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str)
            and block["text"].startswith(COMPACT_OPENING))


def claude_code_kind(call: CallRecord) -> KindVerdict:
    """The kind of one Claude Code call, with its evidence (see the module doc)."""
    request = call.request if isinstance(call.request, Mapping) else {}
    agent = _header(call.headers, AGENT_ID_HEADER)
    if agent is not None:
        parent = _header(call.headers, PARENT_ID_HEADER)
        nested = f", nested under {parent[:40]}" if parent else ""
        return "subagent", f"header {AGENT_ID_HEADER}={agent[:40]}{nested}"
    billing = _billing_line(request)
    if billing is not None and SUBAGENT_BILLING_MARK in billing:
        return "subagent", f"system prompt billing line marks {SUBAGENT_BILLING_MARK}"
    if is_compaction(request):
        return "compaction", "last user turn ends with Claude Code's compaction instruction block"
    tools = request.get("tools")
    if isinstance(tools, list) and tools and all(isinstance(t, Mapping) and isinstance(t.get("name"), str)
                                                 for t in tools):
        return "main", f"no {AGENT_ID_HEADER} header, the agent's tools offered: the main agent"
    return None  # not a request shape seen from Claude Code: the structural default decides


def claude_code_kinds(calls: Sequence[CallRecord]) -> list[KindVerdict]:
    """Per call, :func:`claude_code_kind`; a call it cannot read is left to the default (None). Never raises."""
    return verdicts_per_call(calls, claude_code_kind)
