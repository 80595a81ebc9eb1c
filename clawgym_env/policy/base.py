"""The policy seam: token ids in → sampled token ids + logprobs out.

Invariants of :class:`Generation`: ``len(logprobs) == len(token_ids)``; ``token_ids`` are exactly
what was sampled (the terminating ``<|im_end|>`` included when the policy stopped on it);
``logprobs[i]`` is log p(token_ids[i]) under the distribution actually sampled from (after
temperature/top-p), 0.0 for a scripted policy that emits its text with certainty.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any


@dataclasses.dataclass
class SamplingParams:
    max_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = dataclasses.field(default_factory=list)
    seed: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class GenerationContext:
    """What a policy may know besides the tokens: the parsed request and the episode.

    A learned policy uses only ``prompt_ids``; a scripted policy reads ``messages``/``tools`` (the
    normalised OpenAI-chat view of the request) and ``task`` (the episode's task) to decide.
    """

    episode_id: str = ""
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    task: Any = None
    harness: str | None = None


@dataclasses.dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    policy_version: int = 0
    token_exact: bool = True
    """False when ``token_ids`` were not sampled by a model but re-encoded from text (a passthrough to
    an upstream API): the proxy then records the call as not token-exact, logprobs carrying no information."""


class PolicyBackend(abc.ABC):
    """A policy served behind the proxy. Must be safe to call from several threads."""

    name: str = "policy"
    version: int = 0

    @property
    @abc.abstractmethod
    def tokenizer(self):
        """The (Qwen3) tokenizer whose ids this policy reads and writes."""

    @abc.abstractmethod
    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """Sample a continuation of ``prompt_ids``."""

    def close(self) -> None:  # pragma: no cover - optional
        """Release resources (idempotent)."""
