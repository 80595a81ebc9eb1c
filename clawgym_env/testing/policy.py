"""The echo policy: a tiny rule-based :class:`~clawgym_env.policy.base.PolicyBackend` for tests.

It needs no model, only the real Qwen3 tokenizer, so a test can drive the serving proxy, a harness
or a trainer's data path end to end in seconds. :class:`EchoScriptPolicy` decides its reply from
the :class:`~clawgym_env.policy.base.GenerationContext` only:

  * tools offered and no tool result in the conversation yet → call the first tool with ``tool_args``;
  * after a tool result → ``"Tool said: <result>"``;
  * otherwise → ``"Echo: <last user text>"`` (or ``reply`` when set).

A last user message starting with ``THINK:`` adds ``<think>`` reasoning to the reply; a last user
message equal to :data:`FAIL` makes ``generate`` raise :class:`~clawgym_env.errors.PolicyError`.

Invariants: the reply is written with :func:`~clawgym_env.policy.chat_format.assistant_text` (so it
ends with ``<|im_end|>``), tokenised with the real tokenizer and returned with logprob 0.0 per
token; ``max_tokens`` truncates the ids (finish ``"length"``); every call is remembered in ``seen``
(thread-safe); ``delay_s`` simulates a slow model.

Usage::

    from clawgym_env import Runtime
    from clawgym_env.testing import EchoScriptPolicy

    with Runtime(EchoScriptPolicy(), out_dir=tmp_path) as rt:
        ...                                  # every answer is "Echo: <the user's text>"

or by name, after registering the factory: ``plugins.policies.registered("echo", echo_policy)``
makes ``make_policy("echo")`` (and ``echo:TEXT``, a fixed reply) build one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from clawgym_env.errors import PolicyError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams
from clawgym_env.policy.chat_format import assistant_text
from clawgym_env.policy.tokenizer import load_tokenizer

FAIL = "__please_fail__"
"""A last user message equal to this makes :meth:`EchoScriptPolicy.generate` raise ``PolicyError``."""

DEFAULT_TOOL_ARGS: JSONObject = {"path": "notes/ünïcode.txt", "limit": 5}


class EchoScriptPolicy(PolicyBackend):
    """Echoes the user, calls the first offered tool once, reports the tool's result (see the module doc)."""

    name = "echo-script"
    version = 3

    def __init__(self, tokenizer: Any = None, *, reply: str | None = None, reasoning: str | None = None,
                 tool_args: JSONObject | None = None, delay_s: float = 0.0) -> None:
        self._tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
        self.reply = reply
        """A fixed answer instead of ``"Echo: <last user text>"``."""
        self.reasoning = reasoning
        """Reasoning put in a ``<think>`` block of every reply (None: none, unless ``THINK:``)."""
        self.tool_args = tool_args if tool_args is not None else dict(DEFAULT_TOOL_ARGS)
        """The arguments of the one tool call made when tools are offered."""
        self.delay_s = delay_s
        self.seen: list[tuple[list[int], SamplingParams, GenerationContext]] = []
        """Every ``generate`` call: (prompt ids, sampling parameters, context), in call order."""
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> Any:
        """The real Qwen3 tokenizer the replies are encoded with."""
        return self._tokenizer

    def decide(self, ctx: GenerationContext) -> str:
        """The full assistant text (``<|im_end|>`` included) this policy emits for ``ctx``."""
        msgs = ctx.messages
        last_user = next((m.get("content", "") for m in reversed(msgs) if m.get("role") == "user"), "")
        if last_user == FAIL:
            raise PolicyError("scripted failure requested by the test")
        reasoning = self.reasoning
        if str(last_user).startswith("THINK:"):
            reasoning = "Thinking about " + str(last_user)[6:].strip() + " 🤔"
        tool_results = [m for m in msgs if m.get("role") == "tool"]
        if ctx.tools and not tool_results:
            name = ctx.tools[0]["function"]["name"]
            return assistant_text("", reasoning=reasoning, tool_calls=[(name, self.tool_args)])
        if tool_results and msgs[-1].get("role") == "tool":
            return assistant_text("Tool said: " + str(tool_results[-1].get("content", "")), reasoning=reasoning)
        text = self.reply if self.reply is not None else "Echo: " + str(last_user)
        return assistant_text(text, reasoning=reasoning)

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """Record the call, then return :meth:`decide`'s text as token ids with logprob 0.0 each."""
        with self._lock:
            self.seen.append((list(prompt_ids), params, ctx))
        if self.delay_s:
            time.sleep(self.delay_s)
        ids = list(self._tokenizer.encode(self.decide(ctx), add_special_tokens=False))
        finish = "stop"
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish,
                          policy_version=self.version)


def echo_policy(rest: str = "", *, tokenizer: object = None, reply: str | None = None,
                reasoning: str | None = None, tool_args: JSONObject | None = None,
                delay_s: float = 0.0) -> EchoScriptPolicy:
    """A policy-registry factory: ``echo`` builds an :class:`EchoScriptPolicy`, ``echo:TEXT`` one
    that always answers ``TEXT`` (an explicit ``reply`` wins); the keywords are the constructor's."""
    return EchoScriptPolicy(tokenizer, reply=reply if reply is not None else (rest or None), reasoning=reasoning,
                            tool_args=tool_args, delay_s=delay_s)
