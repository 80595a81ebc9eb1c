"""Slow policies against real harnesses: keep-alives under idle timeouts (issue 13 part 6) and forced retries
(part 1), with the real binaries in the bubblewrap sandbox and the scripted expert behind the real proxy.

Every harness gets a timeout far below its default and a policy (:class:`~clawgym_env.testing.SlowPolicy`)
slower than it on one call. What each harness times, as read from the pinned releases:

* Codex: ``stream_idle_timeout_ms`` (provider table) times the gaps between SSE *events* of an open
  response; the wait for the response headers is not timed. Keep-alives below it: the episode is ok with no
  retry; keep-alives sparser than it: the stream is dropped ("idle timeout waiting for SSE"); keep-alives off:
  no headers, nothing timed, the episode is ok. ``stream_max_retries`` > 0 turns the drop into a retry.
* Claude Code: ``API_TIMEOUT_MS`` is its SDK's request timeout, up to the response headers (the proxy's first
  keep-alive sends them). Its stream idle / first-byte watchdogs (``CLAUDE_STREAM_IDLE_TIMEOUT_MS``,
  ``CLAUDE_STREAM_FIRST_BYTE_TIMEOUT_MS``) are clamped to at least 10 s, so they are not used here.
  ``CLAUDE_CODE_MAX_RETRIES`` (the adapter's ``max_retries``) > 0 turns the timeout into a retry.
* Qwen Code: a guard on the SDK's parsed *chunks* (``QWEN_STREAM_IDLE_TIMEOUT_MS``, default 240 s) once the
  headers are in; on expiry it retries the identical request. The chat dialect's keep-alive is an empty
  ``chat.completion.chunk`` (no choices), which the SDK yields as a chunk, so it resets that guard; Qwen Code
  then skips the chunk (nothing to convert).
* OpenClaw: ``models.providers.<id>.timeoutSeconds`` caps the whole request (connect, headers, body), so
  keep-alives cannot help against it; with the proxy on a loopback address its own idle watchdog is the run
  timeout. Its retry after a timeout is not the same request: it inserts a ``<turn_aborted>`` note and a
  "Continue the current task" user turn before retrying.

Forced retries (:func:`~clawgym_env.testing.fail_once`): the chosen call is held until the harness gave up
on it and re-sent it; the proxy still records the abandoned answer (``close_episode`` drains the calls in
flight), and the episode's calls must mark it dead (``discarded_by``: the identical-prompt rule of
:func:`~clawgym_env.capture.call_kinds.find_discarded`, or OpenClaw's adapter rule for its retry with a
``<turn_aborted>`` note) while the episode ends ok.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from clawgym_env.episodes.run import run_episode
from clawgym_env.harness import Endpoint, LaunchSpec
from clawgym_env.policy.scripted import ScriptedPolicy
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.task import Task
from clawgym_env.testing import SlowPolicy, fail_once
from harness_adapters.claude_code import ClaudeCodeAdapter
from harness_adapters.codex import CodexAdapter
from harness_adapters.codex.config import PROVIDER as CODEX_PROVIDER
from harness_adapters.openclaw import PROVIDER as OPENCLAW_PROVIDER
from harness_adapters.openclaw import OpenClawAdapter
from harness_adapters.qwen_code import QwenCodeAdapter

try:
    from helpers_claude_codex import installed
except ImportError:  # tests run as a package
    from tests.helpers_claude_codex import installed

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")]

TASK = "json_merge_config"  # four calls with every harness: read, read, write, answer
SLOW_S = 4.0  # the slow call; every idle / client timeout below is shorter


@pytest.fixture
def task(builtin_suite) -> Task:
    return builtin_suite.get(TASK)


def _episode(task: Task, adapter, policy, keepalive_s: float, tmp_path):
    with ProxyServer(policy, keepalive_s=keepalive_s) as proxy:
        return run_episode(task, installed(adapter), proxy, out_dir=tmp_path / "episodes")


def _expert(tokenizer) -> ScriptedPolicy:
    return ScriptedPolicy("expert", tokenizer=tokenizer)


def _same_prompts(calls) -> list[tuple[Any, Any]]:
    """(earlier, later) by request start for every two calls with identical prompt ids."""
    by_start = sorted(calls, key=lambda c: c.started_at)
    return [(a, b) for i, a in enumerate(by_start) for b in by_start[i + 1:]
            if a.prompt_token_ids and a.prompt_token_ids == b.prompt_token_ids]


def _logs(rec) -> str:
    return rec.logs.get("stdout", "") + rec.logs.get("stderr", "")


def _solved(res) -> None:
    rec = res.record
    assert rec.status == "ok" and rec.reward == 1.0, (rec.status, rec.error, _logs(rec)[-3000:])


def _solved_without_retry(res, slow: SlowPolicy) -> None:
    _solved(res)
    assert [(d.call, d.retried, d.held_s >= SLOW_S) for d in slow.delayed] == [(1, False, True)]
    assert _same_prompts(res.calls) == [], "the harness re-sent a call: its idle timeout fired"
    assert all(c.discarded_by is None for c in res.calls)


def _check_forced_retry(res, policy: SlowPolicy) -> None:
    """Solved; exactly one call re-sent with the identical prompt, the abandoned first attempt recorded
    and marked dead by its retry; no other call marked."""
    _solved(res)
    assert [(d.call, d.retried) for d in policy.delayed] == [(1, True)], policy.delayed
    (first, retry), = _same_prompts(res.calls)
    assert first.output_token_ids == retry.output_token_ids  # the scripted expert answers a prompt one way
    assert first.discarded_by == retry.call_index, [(c.call_index, c.discarded_by) for c in res.calls]
    assert [c.call_index for c in res.calls if c.discarded_by is not None] == [first.call_index]


# ---- Codex ---------------------------------------------------------------------------------------------
def _codex(idle_ms: int, retries: int = 0) -> CodexAdapter:
    return CodexAdapter(extra_config={f"model_providers.{CODEX_PROVIDER}": {
        "stream_idle_timeout_ms": idle_ms, "stream_max_retries": retries}})


@pytest.mark.parametrize("keepalive_s,solved", [(0.5, True), (0.0, True), (3.0, False)],
                         ids=["keepalive-below-idle", "keepalive-off", "keepalive-sparser-than-idle"])
def test_codex_idle_timeout(task, tokenizer, tmp_path, keepalive_s, solved):
    slow = SlowPolicy(_expert(tokenizer), SLOW_S + 2, calls={1})
    res = _episode(task, _codex(1500), slow, keepalive_s, tmp_path)
    if solved:  # keep-alives reset the idle timer; without any, Codex waits for the headers untimed
        _solved(res)
        assert _same_prompts(res.calls) == []
    else:  # the first keep-alive opened the stream, the next one came too late: the turn failed
        assert res.record.status != "ok"
        assert "idle timeout waiting for SSE" in _logs(res.record)


def test_codex_forced_retry_marks_the_abandoned_call(task, tokenizer, tmp_path):
    # keep-alives sparser than the idle timeout drop the held call's stream; Codex retries it once
    policy = fail_once(_expert(tokenizer), call=1, max_wait_s=30)
    res = _episode(task, _codex(1000, retries=2), policy, 2.0, tmp_path)
    _check_forced_retry(res, policy)
    assert "Reconnecting... 1/2" in _logs(res.record)


# ---- Claude Code ---------------------------------------------------------------------------------------
def _claude(retries: int = 0) -> ClaudeCodeAdapter:
    # --bare: a ~1.1 k-token prompt keeps the proxy's first render well below the timeout
    return ClaudeCodeAdapter(bare=True, max_retries=retries, extra_env={"API_TIMEOUT_MS": "3000"})


def test_claude_code_request_timeout_is_held_off_by_keepalives(task, tokenizer, tmp_path):
    slow = SlowPolicy(_expert(tokenizer), SLOW_S, calls={1})
    _solved_without_retry(_episode(task, _claude(), slow, 0.5, tmp_path), slow)


def test_claude_code_request_timeout_fires_without_keepalives(task, tokenizer, tmp_path):
    slow = SlowPolicy(_expert(tokenizer), SLOW_S, calls={1})
    res = _episode(task, _claude(), slow, 0.0, tmp_path)
    assert res.record.status != "ok" and "Request timed out" in _logs(res.record)


def test_claude_code_forced_retry_marks_the_abandoned_call(task, tokenizer, tmp_path):
    policy = fail_once(_expert(tokenizer), call=1, max_wait_s=30)
    _check_forced_retry(_episode(task, _claude(retries=2), policy, 0.0, tmp_path), policy)


# ---- Qwen Code -----------------------------------------------------------------------------------------
def test_qwen_code_stream_idle_guard_is_held_off_by_keepalives(task, tokenizer, tmp_path):
    slow = SlowPolicy(_expert(tokenizer), SLOW_S, calls={1})
    adapter = QwenCodeAdapter(extra_env={"QWEN_STREAM_IDLE_TIMEOUT_MS": "1500"})
    _solved_without_retry(_episode(task, adapter, slow, 0.5, tmp_path), slow)


# ---- OpenClaw ------------------------------------------------------------------------------------------
class _OpenClawTimeout(OpenClawAdapter):
    """OpenClaw with ``models.providers.<id>.timeoutSeconds`` set (a cap on each whole model request)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__()
        self.timeout_s = timeout_s

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        spec = super().launch(task, endpoint, home=home)
        path = next(p for p in spec.files if p.endswith("/openclaw.json"))
        cfg = json.loads(spec.files[path])
        cfg["models"]["providers"][OPENCLAW_PROVIDER]["timeoutSeconds"] = self.timeout_s
        spec.files[path] = json.dumps(cfg, indent=2)
        return spec


def _continues(call, later) -> bool:
    """Whether ``later``'s prompt holds ``call``'s prompt and then its answer (the harness went on from it)."""
    head = list(call.prompt_token_ids) + list(call.output_token_ids)
    return list(later.prompt_token_ids[:len(head)]) == head


def test_openclaw_forced_retry_leaves_a_dead_attempt(task, tokenizer, tmp_path):
    policy = fail_once(_expert(tokenizer), call=1, max_wait_s=60, retry_share=0.9)
    res = _episode(task, _OpenClawTimeout(3), policy, 0.0, tmp_path)
    _solved(res)
    assert [(d.call, d.retried) for d in policy.delayed] == [(1, True)], policy.delayed
    first = max(res.calls, key=lambda c: c.ended_at - c.started_at)  # the held call
    later = [c for c in res.calls if c.started_at > first.started_at]
    retry = min(later, key=lambda c: c.started_at)
    # OpenClaw's retry is a new request: the interrupted prompt, a <turn_aborted> note, "Continue ..."
    assert retry.prompt_token_ids != first.prompt_token_ids
    assert "turn_aborted" in tokenizer.decode(retry.prompt_token_ids[len(first.prompt_token_ids) // 2:])
    assert not any(_continues(first, c) for c in later), "the abandoned answer was carried on"
    assert all(c.discarded_by is None for c in res.calls if c is not first)
    # not the identical prompt: the OpenClaw adapter pairs it (harness_adapters.openclaw.kinds.openclaw_discarded)
    assert first.discarded_by == retry.call_index, [(c.call_index, c.discarded_by) for c in res.calls]
    assert [c.kind for c in res.calls] == ["main"] * len(res.calls)


def test_claude_code_abandoned_call_finishing_after_its_retry_is_the_dead_one(task, tokenizer, tmp_path):
    # a slow model finishes a call its client already gave up on after the retry was answered
    policy = fail_once(_expert(tokenizer), call=1, max_wait_s=30, retry_first=True)
    res = _episode(task, _claude(retries=2), policy, 0.0, tmp_path)
    _solved(res)
    (first, retry), = _same_prompts(res.calls)
    assert first.call_index > retry.call_index  # recorded after its retry
    assert first.discarded_by == retry.call_index and retry.discarded_by is None
