"""Shared helpers for the real-harness tests: installed harnesses, run in the bubblewrap sandbox against the
real proxy. The left-behind process checks they use (``Marked``, ``Watch``, ``assert_no_survivors``) ship in
:mod:`clawgym_env.testing.processes`.

Invariants:
  * :func:`installed` installs through the adapter's own ``install()`` (a no-op when present) and
    skips only when the installer itself is missing or its registry cannot be reached (``offline_hints``);
    any other install failure fails the test;
  * :func:`check_expert_episode` states what a solved episode must show (status, reward, token
    ids, every call captured under the episode's own proxy path, no DNS attempt in the logs);
    :func:`check_main_thread_episode` adds token-exact calls marked by the adapter: its side calls, and one
    main thread that extends call by call;
  * :func:`hanging_episode` and :func:`check_wrong_token_episode` run one marked episode each and check that
    no process it started outlives it.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from clawgym_env.envs.runtime import Runtime
from clawgym_env.errors import HarnessError
from clawgym_env.harness import Endpoint, HarnessAdapter
from clawgym_env.plugins import make_harness
from clawgym_env.task import Task
from clawgym_env.testing import Marked, Watch, assert_no_survivors

OFFLINE_HINTS = ("needs npm", "ENOTFOUND", "EAI_AGAIN", "ETIMEDOUT", "ECONNREFUSED", "ENETUNREACH",
                 "network request", "request to https://registry")
PYPI_OFFLINE_HINTS = ("No matching distribution", "Could not find a version", "Failed to establish a new connection",
                      "Temporary failure in name resolution", "Network is unreachable", "No module named pip",
                      "ensurepip")
DNS_FAILURES = re.compile(r"ENOTFOUND|EAI_AGAIN|getaddrinfo|ENETUNREACH", re.I)
EXPERT_TASKS = ["backup_and_edit_config", "archive_site", "implement_function"]  # shell+read; +write; overwrite
"""Builtin tasks the scripted expert solves in several tool steps, through each harness's own tools."""
ENDPOINT = Endpoint(base_url="http://127.0.0.1:18080/ep/tok123/v1", api_key="tok123")
"""A fixed endpoint for launch specs built without running anything."""
ROUTES = {"openai_chat": "/chat/completions", "openai_responses": "/responses", "anthropic_messages": "/messages"}
"""Each dialect's route under the episode's ``/ep/<token>/v1``."""


def installed(name: str, *, offline_hints: tuple[str, ...] = OFFLINE_HINTS, installer: str = "npm or the registry",
              **options) -> HarnessAdapter:
    """The adapter registered as ``name``, with its harness installed (skips only if ``installer`` is unusable)."""
    adapter = make_harness(name, **options)
    try:
        adapter.install()
    except HarnessError as exc:
        if any(h in str(exc) for h in offline_hints):
            pytest.skip(f"cannot install the {name} harness ({installer} is unavailable): {exc}")
        raise
    return adapter


def tools_called(calls) -> set[str]:
    """The names of the tools the policy called over ``calls`` (Chat Completions shape, as the proxy records)."""
    return {tc["function"]["name"] for c in calls for tc in c.response_message.get("tool_calls") or []}


def assert_no_host_lookups(rec) -> None:
    """The harness's logs show no attempt to resolve a host name (its only endpoint is the proxy's address)."""
    logs = rec.logs.get("stdout", "") + rec.logs.get("stderr", "")
    assert not DNS_FAILURES.search(logs), "the harness tried to resolve a host name: " + logs[-2000:]


def multi_step_tasks(suite, ids: list[str]) -> list[Task]:
    """The named builtin tasks, each checked to need at least two tool steps from the expert."""
    tasks = [suite.get(i) for i in ids]
    for t in tasks:
        steps = json.loads(Path(t.expert_path).read_text())["steps"]
        assert sum("tool" in s for s in steps) >= 2, f"{t.id} is not a multi-step task"
    return tasks


def check_expert_episode(result, tokenizer, route: str = "/chat/completions") -> None:
    """Assert that ``result`` is a solved episode whose every call went through the proxy."""
    rec = result.record
    assert rec.status == "ok", (rec.task_id, rec.error, rec.logs)
    assert rec.reward == 1.0, (rec.task_id, rec.subscores, rec.reward_reason, rec.logs)
    assert rec.num_calls == len(result.calls) >= 3, (rec.num_calls, rec.logs)
    paths = {c.path for c in result.calls}
    assert len(paths) == 1 and re.fullmatch(r"/ep/[^/]+/v1" + re.escape(route), paths.pop())
    for call in result.calls:
        assert call.prompt_token_ids and call.output_token_ids
        assert len(call.output_logprobs) == len(call.output_token_ids)
    assert [c.call_index for c in result.calls] == list(range(len(result.calls)))
    assert all(c.finish_reason == "tool_calls" for c in result.calls[:-1])
    last = tokenizer.decode(result.calls[-1].output_token_ids, skip_special_tokens=True)
    assert rec.final_message and rec.final_message.strip() in last
    assert_no_host_lookups(rec)


def check_main_thread_episode(result, tokenizer, *, harness: str, dialect: str = "openai_chat",
                              side_calls: int = 0) -> None:
    """A solved episode: every call through the episode's proxy path and token-exact, its kind set by the
    ``harness`` adapter; ``side_calls`` side calls offering no tools, the rest one main thread offering tools
    that extends call by call (each prompt continues the previous turn) and ends in the final answer."""
    rec = result.record
    assert rec.status == "ok" and rec.reward == 1.0, (rec.task_id, rec.status, rec.error, rec.subscores, rec.logs)
    assert rec.num_calls == len(result.calls) >= 3
    paths = {c.path for c in result.calls}
    assert len(paths) == 1 and re.fullmatch(r"/ep/[^/]+/v1" + re.escape(ROUTES[dialect]), paths.pop())
    assert {c.dialect for c in result.calls} == {dialect}
    for call in result.calls:
        assert call.prompt_token_ids and call.output_token_ids and call.token_exact, call.token_exact_reason
        assert len(call.output_logprobs) == len(call.output_token_ids)
        assert call.kind_reason.startswith(f"{harness}: "), call.kind_reason
    side = [c for c in result.calls if c.kind == "side"]
    main = sorted((c for c in result.calls if c.kind == "main"), key=lambda c: c.call_index)
    assert len(side) == side_calls and len(main) == len(result.calls) - len(side), \
        [(c.kind, c.kind_reason) for c in result.calls]
    assert all(not c.request.get("tools") for c in side) and all(c.request.get("tools") for c in main)
    for prev, nxt in zip(main, main[1:]):
        head = prev.prompt_token_ids + prev.output_token_ids
        assert nxt.prompt_token_ids[:len(head)] == head, (prev.call_index, nxt.call_index)
    assert all(c.finish_reason == "tool_calls" for c in main[:-1]) and main[-1].finish_reason == "stop"
    last = tokenizer.decode(main[-1].output_token_ids, skip_special_tokens=True)
    assert rec.final_message and rec.final_message.strip() in last
    assert_no_host_lookups(rec)


def hanging_episode(adapter: HarnessAdapter, suite, tmp_path: Path, *, steps: int, timeout_s: float):
    """``(result, marker)`` of an episode whose every step hangs (:func:`hanging_script`), run to its timeout:
    checked to time out unrewarded, with the harness's processes seen while it ran and none left after."""
    marker = uuid.uuid4().hex
    script = hanging_script(tmp_path, marker, steps=steps)
    task = marked_task(suite.get("csv_total"), marker, timeout_s=timeout_s)
    with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "eps") as rt:
        with Watch(marker) as watch:
            res = rt.run(task, Marked(adapter, marker))
    rec = res.record
    assert watch.seen, "the harness's processes were visible to the survivor check while it ran"
    assert rec.status == "timeout", (rec.status, rec.error, rec.logs)
    assert rec.reward < 1.0
    assert_no_survivors(marker)
    return res, marker


def check_wrong_token_episode(adapter: HarnessAdapter, runtime, suite, *, evidence: str) -> None:
    """An episode whose every request carries a wrong token is an infra failure at the harness boundary (the
    proxy refused it before the model answered: never the agent's failure, never trained), with ``evidence``
    of the refusal in the harness's logs and no process left behind."""
    marker = uuid.uuid4().hex
    res = runtime.run(marked_task(suite.get("csv_total"), marker), Marked(adapter, marker, wrong_token=True))
    rec = res.record
    assert rec.status == "infra_error" and rec.failure_boundary == "harness", (rec.status, rec.logs)
    assert rec.num_calls == 0 and rec.final_message is None and rec.reward < 1.0
    assert evidence in rec.logs["stdout"] + rec.logs["stderr"], rec.logs
    assert_no_survivors(marker)


def marked_task(task: Task, marker: str, *, timeout_s: float | None = None) -> Task:
    """A copy of ``task`` whose workspace path carries ``marker`` (visible in sandbox command lines)."""
    t = task.model_copy(deep=True)
    t.mount_dir = f"/root/ws-{marker}"
    if timeout_s is not None:
        t.limits.timeout_s = timeout_s
    return t


def hanging_script(tmp_path: Path, marker: str, steps: int) -> Path:
    """A scripted-policy file whose every step is a 10-minute wait carrying ``marker``.

    The wait is not a bare ``sleep N``: harnesses refuse those (Qwen Code: "Blocked: standalone sleep").
    """
    path = tmp_path / f"hang-{marker}.json"
    wait = "python3 -c 'import time; time.sleep(600)'"
    body = [{"tool": "bash", "command": f"{wait} # {marker}"} for _ in range(steps)]
    path.write_text(json.dumps({"steps": body + [{"final": "done"}]}))
    return path
