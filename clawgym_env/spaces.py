"""Observation and action spaces of the ClawGym environments.

Observation (a ``Dict``), the same keys after ``reset`` and after ``step``:
  * ``task_id``, ``instruction``: the task (``reset`` picks it);
  * ``status``, ``final_message``: empty after ``reset``; after ``step`` the episode's status and
    the harness's final answer;
  * ``calls``: empty after ``reset``; after ``step`` one entry per captured model call with the exact
    ``prompt_token_ids``, ``output_token_ids`` (int64 arrays) and ``output_logprobs`` (float32).
Richer data (the full :class:`EpisodeRecord`, the calls as records, sub-scores, timings) is in ``info``.

Action (a ``Dict``), the sampling parameters and policy version for the episode:
  * ``temperature`` in [0, 2] and ``top_p`` in [0, 1] override what the harness asks for;
  * ``max_tokens``: a cap on tokens per model call (0 = the harness's own value);
  * ``policy_version``: the version tag recorded on every call (the policy itself is chosen at
    ``make`` time). ``step(None)`` uses the harness's own sampling parameters.
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np
from gymnasium import spaces

from clawgym_env.policy.base import SamplingOverrides

#: Every printable character of the Basic Multilingual Plane, plus newline, tab and return.
TEXT_CHARSET = "\n\t\r" + "".join(chr(c) for c in range(0x20, 0x10000)
                                    if not 0xD800 <= c < 0xE000 and chr(c).isprintable())
_CHARSET = frozenset(TEXT_CHARSET)
MAX_TEXT = 1 << 22


def clean_text(text: str | None) -> str:
    """Make ``text`` a member of the observation's Text spaces (other characters become ``\\uXXXX``-style escapes)."""
    if not text:
        return ""
    if all(c in _CHARSET for c in text):
        return text[:MAX_TEXT]
    return "".join(c if c in _CHARSET else c.encode("unicode_escape").decode("ascii") for c in text)[:MAX_TEXT]


class _ScalarBox(spaces.Box):
    """A 0-d Box that accepts numpy scalars (the items of a stacked ``Sequence``) without a cast warning."""

    def contains(self, x: Any) -> bool:
        return super().contains(np.asarray(x, dtype=self.dtype) if np.isscalar(x) else x)


def observation_space(vocab_size: int) -> spaces.Dict:
    """The observation ``Dict`` (see the module docstring); token ids range over ``vocab_size``."""
    text = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=TEXT_CHARSET)
    tokens = spaces.Sequence(spaces.Discrete(vocab_size), stack=True)
    logprobs = spaces.Sequence(_ScalarBox(-np.inf, 0.0, shape=(), dtype=np.float32), stack=True)
    call = spaces.Dict({"prompt_token_ids": tokens, "output_token_ids": tokens, "output_logprobs": logprobs})
    return spaces.Dict({"task_id": text, "instruction": text, "status": text, "final_message": text,
                        "calls": spaces.Sequence(call)})


def action_space() -> spaces.Dict:
    """The action ``Dict`` (see the module docstring): sampling overrides and the policy version."""
    return spaces.Dict({
        "temperature": spaces.Box(0.0, 2.0, shape=(), dtype=np.float32),
        "top_p": spaces.Box(0.0, 1.0, shape=(), dtype=np.float32),
        "max_tokens": spaces.Discrete(32769),
        "policy_version": spaces.Discrete(2**31 - 1),
    })


class CallObservation(TypedDict):
    """One captured model call in an observation's ``calls`` (see the module docstring)."""

    prompt_token_ids: np.ndarray  # int64
    output_token_ids: np.ndarray  # int64
    output_logprobs: np.ndarray  # float32, each <= 0


class Observation(TypedDict):
    """A member of :func:`observation_space` (see the module docstring)."""

    task_id: str
    instruction: str
    status: str
    final_message: str
    calls: tuple[CallObservation, ...]


class Action(TypedDict, total=False):
    """A member of :func:`action_space` (see the module docstring); a missing key is no override. Values are
    NumPy scalars or 0-d arrays as the space samples them, or plain numbers."""

    temperature: float | np.ndarray
    top_p: float | np.ndarray
    max_tokens: int | np.integer
    policy_version: int | np.integer


def action_to_sampling(action: Action | None) -> tuple[SamplingOverrides, int | None]:
    """(sampling overrides for the proxy, policy_version) from an action (``None`` = no overrides)."""
    if action is None:
        return SamplingOverrides(), None
    temperature = float(np.asarray(action["temperature"])) if "temperature" in action else None
    top_p = max(float(np.asarray(action["top_p"])), 1e-6) if "top_p" in action else None
    max_tokens = int(action["max_tokens"]) if int(action.get("max_tokens", 0) or 0) > 0 else None
    version = action.get("policy_version")
    return (SamplingOverrides(temperature=temperature, top_p=top_p, max_tokens=max_tokens),
            (int(version) if version is not None else None))
