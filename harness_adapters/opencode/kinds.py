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

from collections.abc import Sequence

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import KindVerdict
from harness_adapters.call_kinds_by_prompt import PromptMarks, kinds_by_system_prompt

TITLE_OPENING = "You are a title generator."
MARKS = PromptMarks(
    main_evidence="OpenCode's agent system prompt (that of its first call offering tools)",
    toolless={TITLE_OPENING: ("side", "OpenCode's title generator prompt, no tools offered")},
    subagent_evidence="a system prompt other than the main agent's, with its own tools",
)


def opencode_kinds(calls: Sequence[CallRecord]) -> list[KindVerdict]:
    """Per call, side (title) / main / subagent by system prompt and tools (see the module doc), else None."""
    return kinds_by_system_prompt(calls, MARKS)
