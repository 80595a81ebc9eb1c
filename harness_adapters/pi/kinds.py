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

from collections.abc import Sequence

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import KindVerdict
from harness_adapters.call_kinds_by_prompt import PromptMarks, kinds_by_system_prompt

MAIN_OPENING = "You are an expert coding assistant operating inside pi"
COMPACT_OPENING = "You are a context summarization assistant."
MARKS = PromptMarks(
    main_evidence="pi's agent system prompt (that of its first call offering tools)",
    main_opening=MAIN_OPENING,
    toolless={COMPACT_OPENING: ("compaction", "pi's summarization system prompt, no tools offered")},
)


def pi_kinds(calls: Sequence[CallRecord]) -> list[KindVerdict]:
    """Per call, main / compaction by system prompt and tools (see the module doc), else None. Never raises."""
    return kinds_by_system_prompt(calls, MARKS)
