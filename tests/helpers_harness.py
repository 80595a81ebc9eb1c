"""Shared helpers for the OpenClaw and Qwen Code tests: real npm-installed harnesses, run in the
bubblewrap sandbox against the real proxy. The left-behind process checks they use (``Marked``,
``Watch``, ``assert_no_survivors``) ship in :mod:`clawgym_env.testing.processes`.

Invariants:
  * :func:`installed` installs through the adapter's own ``install()`` (a no-op when present) and
    skips only when npm itself is missing or the registry cannot be reached; any other install
    failure fails the test;
  * :func:`check_expert_episode` states what a solved episode must show (status, reward, token
    ids, every call captured under the episode's own proxy path, no DNS attempt in the logs).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clawgym_env.errors import HarnessError
from clawgym_env.harness import HarnessAdapter
from clawgym_env.plugins import make_harness
from clawgym_env.task import Task

OFFLINE_HINTS = ("needs npm", "ENOTFOUND", "EAI_AGAIN", "ETIMEDOUT", "ECONNREFUSED", "ENETUNREACH",
                 "network request", "request to https://registry")
DNS_FAILURES = re.compile(r"ENOTFOUND|EAI_AGAIN|getaddrinfo|ENETUNREACH", re.I)


def installed(name: str, **options) -> HarnessAdapter:
    """The adapter registered as ``name``, with its harness installed (skips only if npm is unusable)."""
    adapter = make_harness(name, **options)
    try:
        adapter.install()
    except HarnessError as exc:
        if any(h in str(exc) for h in OFFLINE_HINTS):
            pytest.skip(f"cannot install the {name} harness (npm or the registry is unavailable): {exc}")
        raise
    return adapter


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
    logs = rec.logs.get("stdout", "") + rec.logs.get("stderr", "")
    assert not DNS_FAILURES.search(logs), "the harness tried to resolve a host name: " + logs[-2000:]


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
