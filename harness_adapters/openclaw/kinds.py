"""How OpenClaw marks its own calls: the main agent's turns and its compaction (summary) calls.

Evidence (captured from the pinned release, ``openclaw agent exec`` through the proxy, OpenAI chat dialect):

* **Main agent**: the first message is the system prompt OpenClaw writes, opening with
  :data:`MAIN_MARK` (an HTML comment naming the attempt) and ``You are a personal assistant running inside
  OpenClaw``; the agent's tools are offered.
* **Compaction** (when a prompt outgrows the context: the proxy refused it as too long, or usage crossed
  ``contextWindow`` minus the reserve): a separate request whose system prompt opens with
  :data:`SUMMARY_OPENING`, offering no tools, with one user message holding the serialised conversation. After
  it the main agent goes on with the summary in place of the older turns.
* **Subagents** (``sessions_spawn``): not reachable headless. ``agent exec`` runs without a gateway and the spawn
  fails (``published reply runtime missing``), so no subagent call was seen; such calls are left to the
  structural default.
* **Side calls**: none seen.

Invariants: :func:`openclaw_kinds` never raises and answers for every call; it reads only the system message at
position 0 and whether tools are offered (OpenClaw writes both; what a model says lands in later messages).
A call matching neither shape is left to the structural default (None). The Anthropic dialect's ``system``
field is read the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import KindVerdict, verdicts_per_call

MAIN_MARK = "<!-- openclaw:attempt:"
MAIN_OPENING = "You are a personal assistant running inside OpenClaw."
SUMMARY_OPENING = "You are a context summarization assistant."


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, Mapping) and isinstance(b.get("text"), str))
    return ""


def system_prompt(request: Mapping[str, Any]) -> str | None:
    """The system prompt OpenClaw sent: the first message when it is ``system``/``developer`` (chat), the
    ``system`` field (Anthropic) or ``instructions`` (Responses); None when there is none."""
    for key in ("system", "instructions"):
        if request.get(key):
            return _text(request[key])
    for key in ("messages", "input"):
        items = request.get(key)
        if isinstance(items, list) and items and isinstance(items[0], Mapping) \
                and items[0].get("role") in ("system", "developer"):
            return _text(items[0].get("content"))
    return None


def openclaw_kind(call: CallRecord) -> KindVerdict:
    """The kind of one OpenClaw call, with its evidence (see the module doc)."""
    request = call.request if isinstance(call.request, Mapping) else {}
    system = system_prompt(request)
    if system is None:
        return None
    tools = request.get("tools")
    has_tools = isinstance(tools, list) and bool(tools)
    head = system.lstrip()[:400]
    if head.startswith(SUMMARY_OPENING) and not has_tools:
        return "compaction", "OpenClaw's summarisation system prompt, no tools offered"
    if (head.startswith(MAIN_MARK) or head.startswith(MAIN_OPENING)) and MAIN_OPENING in head and has_tools:
        return "main", "OpenClaw's agent system prompt with the agent's tools"
    return None


def openclaw_kinds(calls: Sequence[CallRecord]) -> list[KindVerdict]:
    """Per call, :func:`openclaw_kind`; a call it cannot read is left to the default (None). Never raises."""
    return verdicts_per_call(calls, openclaw_kind)
