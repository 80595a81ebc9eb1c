"""The policy seam: token ids in → sampled token ids + logprobs out.

Invariants of :class:`Generation`: ``len(logprobs) == len(token_ids)``; ``token_ids`` are exactly
what was sampled (the terminating ``<|im_end|>`` included when the policy stopped on it);
``logprobs[i]`` is log p(token_ids[i]) under the distribution actually sampled from (after
temperature/top-p), 0.0 for a scripted policy that emits its text with certainty.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from clawgym_env.errors import ProxyError
from clawgym_env.jsontypes import JSONObject

if TYPE_CHECKING:
    from clawgym_env.policy.hf import Tokenizer
    from clawgym_env.task import Task


class SyncReport(TypedDict):
    """A policy's last weight sync (its ``last_sync``): the ``method`` used, how many ``seconds`` it took and
    the ``version`` served since."""

    method: str
    seconds: float
    version: int


@dataclasses.dataclass
class SamplingParams:
    """The sampling parameters of one model call, as the policy receives them."""

    max_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = dataclasses.field(default_factory=list)
    seed: int | None = None

    def as_dict(self) -> JSONObject:
        """The parameters as a plain dict (recorded in each ``CallRecord.sampling``)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SamplingOverrides:
    """What an episode imposes on every model call of its harness, whatever the harness asks for.

    One frozen type from the Gym action (:func:`clawgym_env.spaces.action_to_sampling`) or a trainer's
    config, through :class:`~clawgym_env.envs.runtime.Runtime` and :func:`~clawgym_env.episodes.run.run_episode`,
    to the proxy's episode session. ``None`` keeps the harness's own value. Invariants (checked at
    construction, :class:`~clawgym_env.errors.ProxyError` naming the field): ``temperature`` ≥ 0,
    ``0 < top_p ≤ 1``, ``max_tokens`` ≥ 1 (a cap: the call gets the smaller of it and the request's),
    ``stop`` a tuple of strings.
    """

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for key, low in (("temperature", 0.0), ("top_p", 0.0), ("max_tokens", 1)):
            value = getattr(self, key)
            if value is None:
                continue
            bad = isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
            if bad or value < low or (key == "top_p" and not 0.0 < value <= 1.0):
                raise ProxyError(f"sampling override {key}={value!r} must be a non-negative number "
                                 "(top_p in (0, 1], max_tokens at least 1)", field=f"sampling.{key}")
        if self.max_tokens is not None:
            object.__setattr__(self, "max_tokens", int(self.max_tokens))
        if self.stop is not None:
            stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
            if not all(isinstance(x, str) for x in stop):
                raise ProxyError(f"sampling override stop={self.stop!r} must be strings", field="sampling.stop")
            object.__setattr__(self, "stop", stop)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ProxyError(f"sampling override seed={self.seed!r} must be an integer", field="sampling.seed")

    @classmethod
    def of(cls, value: SamplingOverrides | Mapping[str, Any] | None) -> SamplingOverrides:
        """``value`` as overrides: itself, ``None`` → none, or a mapping of the field names (others refused)."""
        if isinstance(value, SamplingOverrides):
            return value
        data = dict(value or {})
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ProxyError(f"unknown sampling override(s) {unknown}; allowed: {allowed}", field="sampling")
        return cls(**{k: v for k, v in data.items() if v is not None})

    def as_dict(self) -> JSONObject:
        """The overrides that are set (for records on disk)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()
                if v is not None}


@dataclasses.dataclass
class GenerationContext:
    """What a policy may know besides the tokens: the parsed request and the episode.

    A learned policy uses only ``prompt_ids``; a scripted policy reads ``messages``/``tools`` (the
    normalised OpenAI-chat view of the request) and ``task`` (the episode's task) to decide.
    """

    episode_id: str = ""
    messages: list[JSONObject] = dataclasses.field(default_factory=list)
    tools: list[JSONObject] = dataclasses.field(default_factory=list)
    task: Task | None = None
    harness: str | None = None


@dataclasses.dataclass
class Generation:
    """What a policy returns for one call: the sampled ids with their logprobs (one per id) and why it
    stopped (``"stop"`` or ``"length"``), under the policy version that sampled them."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    policy_version: int = 0
    token_exact: bool = True
    """False when ``token_ids`` were not sampled by a model but re-encoded from text (a passthrough to
    an upstream API): the proxy then records the call as not token-exact, logprobs carrying no information."""


@dataclasses.dataclass(frozen=True)
class TextDelta:
    """A piece of an answer's text as a text-level backend receives it from its upstream (see
    :meth:`PolicyBackend.generate_stream`): ``content`` or ``reasoning`` text, in arrival order."""

    kind: Literal["content", "reasoning"]
    text: str


class PolicyBackend(abc.ABC):
    """A policy served behind the proxy. Must be safe to call from several threads."""

    name: str = "policy"
    version: int = 0

    @property
    @abc.abstractmethod
    def tokenizer(self) -> Tokenizer:
        """The (Qwen3) tokenizer whose ids this policy reads and writes."""

    @abc.abstractmethod
    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """Sample a continuation of ``prompt_ids``."""

    streams_text: bool = False
    """True when :meth:`generate_stream` is implemented: the proxy then serves a streaming request from it,
    forwarding text as it arrives. Only text-level backends (a passthrough to an upstream API) stream;
    a learned policy's ids are generated whole and this stays False."""

    def generate_stream(self, prompt_ids: list[int], params: SamplingParams,
                        ctx: GenerationContext) -> AsyncIterator[TextDelta | Generation]:
        """Like :meth:`generate`, streamed (only when :attr:`streams_text`): zero or more :class:`TextDelta`
        as the upstream sends them, then exactly one :class:`Generation` (what :meth:`generate` would
        return for the same answer), last. Runs on the proxy's event loop, so it must not block; a failure,
        before or after some deltas, raises :class:`~clawgym_env.errors.PolicyError`."""
        raise NotImplementedError(f"{type(self).__name__} does not stream; check streams_text first")

    def close(self) -> None:  # pragma: no cover  # noqa: B027 - optional hook, a no-op unless overridden
        """Release resources (idempotent)."""
