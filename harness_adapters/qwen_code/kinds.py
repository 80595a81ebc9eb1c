"""How Qwen Code marks its own calls: the main agent and its subagents differ by the system prompt it writes.

Evidence (captured from the pinned release, headless ``--prompt`` mode through the proxy, OpenAI chat dialect):

* **Main agent**: the first message is the system prompt opening with :data:`MAIN_OPENING`; it is the same text
  on every main-agent call of an episode, and the episode's first call is the main agent's.
* **Subagent** (the ``agent`` tool; nested ones too): the delegated agent's requests open with a system prompt
  of its own (the built-in one opens with :data:`SUBAGENT_OPENING`) and offer their own tool set. Headers are
  the same as the main agent's (only ``user-agent``), so the system prompt is the only mark.
* **Compaction** (auto-compact, e.g. ``extra_settings={"context": {"autoCompactThreshold": 0.2}, "model":
  {"generationConfig": {"contextWindowSize": 60000}}}``): a separate request whose system prompt opens with
  :data:`COMPACT_OPENING`, offering no tools, the history and a final request for the ``<state_snapshot>``. The
  main agent then goes on with its own system prompt and the snapshot in place of the older turns.
* **Side calls** (next-speaker or loop checks): none seen in headless mode with the adapter's settings
  (``skipNextSpeakerCheck`` defaults on); such calls are left to the structural default.

Invariants: :func:`qwen_code_kinds` never raises and answers for every call. It reads only the system message at
position 0 and whether tools are offered; the compaction prompt counts only without tools. Because a workspace
may define custom subagents (whose prompts the model could write), "main" is not decided by text alone: a call is
main only when its system prompt is exactly the one of the episode's first call and opens with
:data:`MAIN_OPENING`; a call offering tools under any other system prompt, after a main call, is a subagent;
anything else is left to the structural default (None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import KindVerdict
from harness_adapters.call_kinds_by_prompt import content_text, has_tools

MAIN_OPENING = "You are Qwen Code, a non-interactive CLI agent"
SUBAGENT_OPENING = "You are a general-purpose subagent working for a parent agent."
COMPACT_OPENING = "You are the component that summarizes a conversation when its context window is about to overflow."


def _system(call: CallRecord) -> str | None:
    """The text of a Chat Completions request's first message when it is ``system`` (else None: the call is left
    to the structural default)."""
    request = call.request if isinstance(call.request, Mapping) else {}
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], Mapping):
        return None
    first = messages[0]
    return content_text(first.get("content")) if first.get("role") == "system" else None


def qwen_code_kinds(calls: Sequence[CallRecord]) -> list[KindVerdict]:
    """Per call, main / subagent / compaction by the system prompt (see the module doc), else None. Never raises."""
    try:
        systems = [_system(c) for c in calls]
    except Exception:  # noqa: BLE001 - a malformed record: leave the whole episode to the structural default
        return [None] * len(calls)
    main = systems[0] if systems and systems[0] is not None and systems[0].startswith(MAIN_OPENING) else None
    out: list[KindVerdict] = []
    seen_main = False
    for call, system in zip(calls, systems):
        try:
            if system is not None and system.startswith(COMPACT_OPENING) and not has_tools(call):
                out.append(("compaction", "Qwen Code's compaction system prompt, no tools offered"))
            elif main is not None and system == main and has_tools(call):
                seen_main = True
                out.append(("main", "Qwen Code's main system prompt (that of the episode's first call)"))
            elif main is not None and seen_main and system is not None and has_tools(call):
                which = "the built-in general-purpose" if system.startswith(SUBAGENT_OPENING) else "a"
                out.append(("subagent", f"{which} subagent system prompt, not the main agent's, with its own tools"))
            else:
                out.append(None)
        except Exception:  # noqa: BLE001 - a malformed record is left to the structural default
            out.append(None)
    return out
