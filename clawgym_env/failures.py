"""Who a failed episode's failure belongs to: one helper, applied where each failure happens.

A failure is classified at the boundary where it happened:

  ``sandbox``  the sandbox could not start, or ``bwrap``/Docker itself failed before the harness ran;
  ``harness``  the harness program: it exited with an error, hung, or ended without an answer —
               the agent's outcome, *unless* it never got a single model answer (then nothing the
               agent did can have caused it: the harness could not run, an infrastructure failure);
  ``proxy``    the serving proxy stopped or failed (5xx that is not the policy's);
  ``policy``   the policy/backend failed (5xx/502/504, queue timeout, a context overflow before any
               answer; an overflow after the agent's own history grew is its outcome: :data:`AGENT_GROWN`);
  ``grader``   grading could not produce a valid reward (its sandbox, its judge);
  ``internal`` ClawGym's own bookkeeping raised (a bug; logged with its traceback).

Invariants:
  * :func:`classify_run` is pure: the same facts give the same verdict;
  * a failure on the policy or proxy side turns an unfinished episode into ``infra_error``; one
    the harness recovered from (a later call succeeded and the episode finished) does not;
  * an episode with zero served calls that did not finish is never the agent's failure;
  * the agent's own failures keep their task status (``harness_error``, ``timeout``,
    ``no_final_answer``) with ``boundary="harness"``: they are scored and trained as outcomes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from clawgym_env.capture.records import EpisodeStatus, FailureBoundary

INFRA: EpisodeStatus = "infra_error"
AGENT_GROWN = ("context_length_exceeded", "prompt_too_long")
"""Refusals of a prompt that grew past the context *after* the policy had answered: the agent's own
history (its tool outputs, its turns) filled the window — its outcome, like a timeout. Counting them
as infrastructure would let a policy turn any failing episode into an untrained one by flooding its
context. An overflow before any answer (the harness's own prompt does not fit) stays infrastructure."""
SANDBOX_MARKS = ("bwrap: ", "docker: ", "Error response from daemon")
"""How bwrap and the docker CLI begin their own error lines (the harness never ran)."""


@dataclass(frozen=True)
class Verdict:
    """``status`` (an :data:`~clawgym_env.capture.records.EpisodeStatus`), ``boundary`` (None when
    ``ok``) and the error text (None when ``ok``)."""

    status: EpisodeStatus
    boundary: FailureBoundary | None = None
    error: str | None = None

    @property
    def infra(self) -> bool:
        """Whether this is an infrastructure failure (``infra_error``): never trained on, never scored."""
        return self.status == INFRA


def sandbox_failure(exc: BaseException, *, grading: bool = False) -> Verdict:
    """A :class:`~clawgym_env.errors.SandboxError` raised while starting or using a sandbox."""
    where = "grading sandbox" if grading else "sandbox"
    return Verdict(INFRA, "grader" if grading else "sandbox", f"{where} failure: {exc}")


def internal_failure(exc: BaseException, stage: str) -> Verdict:
    """ClawGym's own code raised while ``stage`` (a bug): reported, never the agent's outcome."""
    return Verdict(INFRA, "internal", f"internal error while {stage}: {type(exc).__name__}: {exc}")


def exception_failure(exc: BaseException) -> Verdict:
    """An exception that escaped a whole episode run: a sandbox error is the sandbox's, a policy or
    proxy error the policy's/proxy's, anything else ClawGym's own (``internal``)."""
    from clawgym_env.errors import PolicyError, ProxyError, SandboxError

    if isinstance(exc, SandboxError):
        return sandbox_failure(exc)
    if isinstance(exc, PolicyError):
        return Verdict(INFRA, "policy", f"policy failure: {exc}")
    if isinstance(exc, ProxyError):
        return Verdict(INFRA, "proxy", f"proxy failure: {exc}")
    return internal_failure(exc, "running the episode")


def _describe(f: Any) -> str:
    return f"HTTP {getattr(f, 'status', '?')} {getattr(f, 'code', '') or ''}: {getattr(f, 'message', '')}".strip()


def classify_run(*, returncode: int | None, timed_out: bool, final_message: str | None, stderr: str = "",
                 timeout_s: float | None = None, num_calls: int = 0, last_call_end: float | None = None,
                 call_failures: Iterable[Any] = (), proxy_running: bool = True) -> Verdict:
    """The verdict on a harness run that returned (the sandbox started).

    ``call_failures``: the proxy's ``session.failures`` (objects with ``status``, ``code``,
    ``message``, ``boundary`` in {client, policy, proxy} and ``at``, epoch seconds);
    ``last_call_end``: ``ended_at`` of the last served call (epoch seconds), if any.
    """
    finished = not timed_out and final_message is not None
    if not proxy_running and not finished:
        return Verdict(INFRA, "proxy", "the serving proxy stopped during the episode")
    infra_side = [f for f in call_failures if getattr(f, "boundary", None) in ("policy", "proxy")
                  and not (num_calls > 0 and getattr(f, "code", None) in AGENT_GROWN)]
    if infra_side:
        last = max(infra_side, key=lambda f: getattr(f, "at", 0.0))
        recovered = finished and last_call_end is not None and last_call_end >= getattr(last, "at", 0.0)
        if not recovered:
            what = "policy/backend" if last.boundary == "policy" else "proxy"
            return Verdict(INFRA, last.boundary, f"{what} failed {len(infra_side)} time(s), last {_describe(last)}")
    if finished:
        return Verdict("ok")
    if num_calls == 0:  # the agent never acted: whatever stopped the harness was not its doing
        mark = next((ln for ln in stderr[-8000:].splitlines() if ln.startswith(SANDBOX_MARKS)), None)
        if mark is not None:
            return Verdict(INFRA, "sandbox", f"the sandbox failed to start the harness: {mark[:300]}")
        client = [f for f in call_failures if getattr(f, "boundary", None) == "client"]
        why = (f"the proxy refused every request ({_describe(client[-1])})" if client
               else "timed out" if timed_out else f"exited with code {returncode}" if returncode
               else "ended without an answer")
        return Verdict(INFRA, "harness", f"the harness got no model answer at all: {why}")
    if timed_out:
        why = f"harness exceeded {timeout_s:.0f} s" if timeout_s else "harness timed out"
        return Verdict("timeout", "harness", why)
    if returncode not in (0, None):
        return Verdict("harness_error", "harness", f"harness exited with code {returncode}")
    return Verdict("no_final_answer", "harness", "harness ended without a final answer")
