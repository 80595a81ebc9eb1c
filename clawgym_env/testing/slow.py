"""Slow policies: a real policy made to take longer on chosen calls, to test timeouts and retries.

A harness that gets no byte for longer than its read or idle timeout gives up on the call: it aborts, or
re-sends the same prompt (a retry). :class:`SlowPolicy` wraps any
:class:`~clawgym_env.policy.base.PolicyBackend` and sleeps ``delay_s`` on the calls you choose, so a test can
show both sides with a real harness:

* **keep-alives**: a call slower than the harness's idle timeout still ends well when the proxy's
  ``keepalive_s`` is below that timeout (the proxy sends the dialect's keep-alive events while it waits);
* **a forced retry** (:func:`fail_once`): with keep-alives off (``keepalive_s=0``) one call is held until
  the harness's client timeout made it drop the connection and send the identical prompt again. The proxy
  still records the held call when it is answered (a client that goes away cancels only the sending), so
  the episode holds a dead attempt that :func:`~clawgym_env.capture.call_kinds.find_discarded` pairs with
  its retry.

Calls are counted per episode (``GenerationContext.episode_id``), 0, 1, 2, ... in the order the policy is
asked, so a retry is a new ordinal and is not slowed again (``calls={1}`` slows only the first attempt of
the second call). ``when`` narrows the choice further, e.g. to calls whose last message is a tool result.

Invariants:
  * the answer is exactly the wrapped policy's (same ids, logprobs, finish reason, version): only its
    timing changes;
  * ``after_generate=True`` (the default) sleeps after the wrapped policy answered, so a slow call costs
    the wrapped policy nothing more and its answer is what the proxy records once the sleep ends;
    ``False`` sleeps before asking it;
  * with ``until_retry`` a held call is released by the first later call of its episode that is its retry
    (the identical prompt ids, or with ``retry_share`` that share of them as a prefix), and that retry
    answers ``settle_s`` later, so the abandoned attempt is recorded first (the proxy numbers calls in the
    order they finish); ``retry_first`` reverses that order;
  * every slowed call is noted in :attr:`SlowPolicy.delayed` (thread safe); ``name``, ``version`` and
    ``tokenizer`` are the wrapped policy's; the wrapper never streams text (``streams_text`` is False, so
    the proxy serves it as a whole-turn policy with keep-alives);
  * ``close()`` closes the wrapped policy.

Usage::

    from clawgym_env.proxy.server import ProxyServer
    from clawgym_env.testing import SlowPolicy, fail_once

    slow = SlowPolicy(make_policy("scripted:expert"), delay_s=4.0, calls={1})
    with ProxyServer(slow, keepalive_s=0.5) as proxy:   # keep-alives every 0.5 s: a 1.5 s idle timeout holds
        result = run_episode(task, adapter, proxy)

    flaky = fail_once(make_policy("scripted:expert"), call=1)
    with ProxyServer(flaky, keepalive_s=0) as proxy:    # no keep-alives: the harness times out and retries
        result = run_episode(task, adapter, proxy)
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from typing import Any

from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams

Selector = Callable[[int, GenerationContext], bool]
"""``(ordinal of the call in its episode, context) -> slow it?``"""


@dataclasses.dataclass(frozen=True)
class Delay:
    """One slowed call, noted when its wait ended."""

    episode_id: str
    """The episode the call belongs to (``""`` when the proxy gave none)."""
    call: int
    """Its ordinal among the episode's calls to the policy (0 = the first)."""
    held_s: float
    """How long it was held back."""
    retried: bool = False
    """Whether the wait ended because the harness re-sent the same prompt (``until_retry``)."""


@dataclasses.dataclass
class _Held:
    """A call waiting for its retry (``until_retry``)."""

    prompt: list[int]
    event: threading.Event = dataclasses.field(default_factory=threading.Event)


def _shared_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlowPolicy(PolicyBackend):
    """``inner``, slower by ``delay_s`` on the chosen calls (see the module doc).

    Args:
        inner: the policy that answers.
        delay_s: how long each chosen call is held back (seconds, >= 0); with ``until_retry``, the longest.
        calls: the per-episode ordinals of the calls to slow (0 = an episode's first call); None: every call.
        when: also required of a call to be slowed, given its ordinal and context; None: no further condition.
        after_generate: sleep after ``inner`` answered (True) or before asking it (False).
        until_retry: end a slowed call's wait early when a later call of its episode is its retry (see
            ``retry_share``). That retry is never slowed, and it waits ``settle_s`` before answering so
            that the abandoned attempt is recorded first.
        retry_share: what makes a later call a retry: None, an identical prompt; a share in (0, 1], a prompt
            that repeats at least that share of the held prompt's ids as its own prefix (for harnesses that
            add a note such as "the previous turn was interrupted" before retrying).
        settle_s: see ``until_retry``.
        retry_first: with ``until_retry``, answer the retry at once and release the held call ``settle_s`` after
            that answer instead, so the abandoned attempt is recorded *after* its retry (as when a slow model
            finishes a call whose client already gave up and was served again).
    """

    streams_text = False

    def __init__(self, inner: PolicyBackend, delay_s: float, *, calls: Collection[int] | None = None,
                 when: Selector | None = None, after_generate: bool = True, until_retry: bool = False,
                 retry_share: float | None = None, settle_s: float = 0.3, retry_first: bool = False) -> None:
        if delay_s < 0 or settle_s < 0:
            raise ValueError(f"delay_s={delay_s!r} and settle_s={settle_s!r} must be >= 0")
        if retry_share is not None and not 0 < retry_share <= 1:
            raise ValueError(f"retry_share={retry_share!r} must be None or in (0, 1]")
        self.inner = inner
        self.delay_s = float(delay_s)
        self.calls = None if calls is None else frozenset(int(c) for c in calls)
        self.when = when
        self.after_generate = after_generate
        self.until_retry = until_retry
        self.retry_share = retry_share
        self.settle_s = float(settle_s)
        self.retry_first = retry_first
        self.delayed: list[Delay] = []
        """Every slowed call, in the order their waits ended."""
        self._counts: defaultdict[str, int] = defaultdict(int)
        self._held: defaultdict[str, list[_Held]] = defaultdict(list)
        self._lock = threading.Lock()

    @property
    def name(self) -> str:  # type: ignore[override]
        """The wrapped policy's name."""
        return self.inner.name

    @property
    def version(self) -> int:  # type: ignore[override]
        """The wrapped policy's version (read live: a trainer may update it)."""
        return self.inner.version

    @property
    def tokenizer(self) -> Any:
        """The wrapped policy's tokenizer."""
        return self.inner.tokenizer

    def _is_retry(self, held: list[int], prompt: list[int]) -> bool:
        if self.retry_share is None:
            return held == prompt
        return bool(held) and _shared_prefix(held, prompt) >= self.retry_share * len(held)

    def _arrive(self, episode: str, prompt: list[int]) -> tuple[int, list[_Held]]:
        """Count the call; the held calls of its episode that it is the retry of (now released from the list)."""
        with self._lock:
            ordinal = self._counts[episode]
            self._counts[episode] = ordinal + 1
            held = self._held.get(episode, [])
            released = [h for h in held if self._is_retry(h.prompt, prompt)]
            if released:
                self._held[episode] = [h for h in held if h not in released]
            return ordinal, released

    def _chosen(self, ordinal: int, ctx: GenerationContext) -> bool:
        if self.delay_s <= 0 or (self.calls is not None and ordinal not in self.calls):
            return False
        return self.when is None or bool(self.when(ordinal, ctx))

    def _hold(self, ctx: GenerationContext, ordinal: int, held: _Held | None) -> None:
        start = time.monotonic()
        retried = False
        if held is not None:
            retried = held.event.wait(self.delay_s)
        else:
            time.sleep(self.delay_s)
        with self._lock:
            self.delayed.append(Delay(ctx.episode_id, ordinal, time.monotonic() - start, retried))

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """``inner.generate``, held back before or after it on a chosen call (see the class doc)."""
        ordinal, released = self._arrive(ctx.episode_id, list(prompt_ids))
        if released:  # a retry: the abandoned attempt is answered just before it (or just after: retry_first)
            if self.retry_first:
                gen = self.inner.generate(prompt_ids, params, ctx)
                for h in released:
                    timer = threading.Timer(self.settle_s, h.event.set)
                    timer.daemon = True
                    timer.start()
                return gen
            for h in released:
                h.event.set()
            time.sleep(self.settle_s)
            return self.inner.generate(prompt_ids, params, ctx)
        if not self._chosen(ordinal, ctx):
            return self.inner.generate(prompt_ids, params, ctx)
        held = None
        if self.until_retry:
            held = _Held(list(prompt_ids))
            with self._lock:
                self._held[ctx.episode_id].append(held)
        try:
            if not self.after_generate:
                self._hold(ctx, ordinal, held)
            gen = self.inner.generate(prompt_ids, params, ctx)
            if self.after_generate:
                self._hold(ctx, ordinal, held)
            return gen
        finally:
            if held is not None:
                with self._lock:
                    left = [h for h in self._held.get(ctx.episode_id, []) if h is not held]
                    if left:
                        self._held[ctx.episode_id] = left
                    else:
                        self._held.pop(ctx.episode_id, None)

    def close(self) -> None:
        """Close the wrapped policy."""
        self.inner.close()


def fail_once(inner: PolicyBackend, call: int, *, max_wait_s: float = 60.0, when: Selector | None = None,
              retry_share: float | None = None, settle_s: float = 0.3, retry_first: bool = False) -> SlowPolicy:
    """A policy that makes the harness give up on the ``call``-th call of each episode and retry it.

    Serve it so that the harness's client timeout (below ``max_wait_s``) fires, and with its retries on:
    keep-alives off (``ProxyServer(..., keepalive_s=0)``) for a timeout on the response headers, or sparser
    than the harness's idle timeout for one on the gaps of an open stream. The chosen call is answered only
    when the harness has sent its retry (see :class:`SlowPolicy`'s ``retry_share``) or after ``max_wait_s``;
    the retry is answered ``settle_s`` later (``retry_first``: the retry at once, the held call ``settle_s``
    after it). The proxy records the abandoned answer (a client that goes away cancels only the sending), so
    the episode's calls hold the dead first attempt and its retry. A harness that does not retry fails the
    call instead (after ``max_wait_s``).
    """
    if max_wait_s <= 0:
        raise ValueError("max_wait_s must be > 0")
    return SlowPolicy(inner, max_wait_s, calls={call}, when=when, after_generate=True, until_retry=True,
                      retry_share=retry_share, settle_s=settle_s, retry_first=retry_first)
