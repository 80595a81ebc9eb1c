"""The audit's policy: one scripted policy that plays a different script in each episode.

Every adversary, the do-nothing baseline and the gold gate run on one :class:`~clawgym_env.Runtime`
(one proxy, one tokenizer) at once, so the script is chosen per episode: the runner
:meth:`~AuditPolicy.assign` s a :class:`~leaderboards.audit.steps.AuditScript` to an episode id before
the episode starts and :meth:`~AuditPolicy.release` s it after. Turns are emitted exactly as
:class:`~clawgym_env.policy.scripted.ScriptedPolicy` emits them (real Qwen3 token ids through the real
harness; each step expressed with a tool the harness offered).

Invariants: stateless per call (the step is the number of assistant turns already in the
conversation); an episode with no script assigned is the do-nothing agent; an adaptive final answer
(``final=None``) is the last tool result, its ``exit code: N`` line dropped, cut to
:data:`MAX_FINAL` characters and stripped of chat-template markers, so hostile tool output cannot
forge a tool call or end the turn.
"""

from __future__ import annotations

import re
import threading

from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.base import GenerationContext
from clawgym_env.policy.chat_format import assistant_text, content_to_text
from clawgym_env.policy.scripted import NOOP_ANSWER, ScriptedPolicy, plan_call, resolve_tools
from leaderboards.audit.steps import NOOP, AuditScript

MAX_FINAL = 2000
_EXIT_LINE = re.compile(r"^\s*exit[ _]code\s*[:=]\s*-?\d+\s*$", re.I | re.M)
_MARKERS = re.compile(r"<\|[^|>]*\|>|</?tool_call>|</?think>|</?tool_response>")


def last_tool_output(messages: list[JSONObject]) -> str:
    """The last tool result of the conversation as a final answer (see the module invariants)."""
    for message in reversed(messages):
        if message.get("role") == "tool":
            text = _EXIT_LINE.sub("", content_to_text(message.get("content"))).strip()
            text = _MARKERS.sub(" ", text)[-MAX_FINAL:].strip()
            return text or NOOP_ANSWER
    return NOOP_ANSWER


class AuditPolicy(ScriptedPolicy):
    """A :class:`ScriptedPolicy` whose script is looked up by the episode id of each call."""

    def __init__(self, tokenizer=None) -> None:
        super().__init__("noop", tokenizer)
        self.name = "scripted:audit"
        self._scripts: dict[str, AuditScript] = {}
        self._lock = threading.Lock()

    def assign(self, episode_id: str, script: AuditScript) -> None:
        """Play ``script`` in the episode ``episode_id`` (before it starts)."""
        with self._lock:
            self._scripts[episode_id] = script

    def release(self, episode_id: str) -> None:
        """Forget the episode's script (after it ended)."""
        with self._lock:
            self._scripts.pop(episode_id, None)

    def script_for(self, episode_id: str) -> AuditScript:
        """The script assigned to ``episode_id`` (the do-nothing agent when none is)."""
        with self._lock:
            return self._scripts.get(episode_id, NOOP)

    def decide(self, ctx: GenerationContext, prompt_ids: list[int] | None = None) -> str:
        """The assistant turn for this point of the episode's script (``<|im_end|>`` included)."""
        script = self.script_for(ctx.episode_id)
        mount_dir = ctx.task.mount_dir if ctx.task is not None else "/"
        specs = resolve_tools(ctx.tools)
        calls = [c for c in (plan_call(s, specs, mount_dir) for s in script.steps) if c is not None]
        turn = sum(1 for m in ctx.messages if m.get("role") == "assistant")
        if turn < len(calls):
            name, args = calls[turn]
            thought = f"Step {turn + 1} of {len(calls)}: call {name}."
            return assistant_text("", reasoning=self._reasoning(thought, prompt_ids), tool_calls=[(name, args)])
        final = script.final if script.final is not None else last_tool_output(ctx.messages)
        return assistant_text(final, reasoning=self._reasoning("The work is done; I will answer.", prompt_ids))
