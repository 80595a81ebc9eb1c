"""Shared checks for the real-harness adapter tests (Claude Code, Codex): real binaries, real bwrap
sandbox, real proxy, scripted expert through the real tokenizer."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid

import pytest

from clawgym_env.capture.records import read_calls
from clawgym_env.envs.runtime import Runtime
from clawgym_env.errors import HarnessError


def installed(adapter):
    """Install the pinned harness (a quick no-op when present); skip only if npm truly cannot."""
    try:
        adapter.install()
    except HarnessError as exc:
        pytest.skip(f"cannot install {adapter.package.spec} with npm: {exc}")
    return adapter


def multi_step_tasks(suite, n, want=()):
    """``want`` first (by id), then other builtin tasks whose expert uses >= 2 tool steps."""
    def steps(t):
        return sum("tool" in s for s in json.loads(t.expert_path.read_text())["steps"])

    tasks = [suite.get(t) for t in want] + [t for t in suite.tasks if t.id not in want]
    tasks = [t for t in tasks if steps(t) >= 2]
    assert len(tasks) >= n, "the builtin suite needs enough multi-step tasks"
    return tasks[:n]


def check_expert_episode(res, tokenizer, dialect: str, route: str):
    """An expert episode: ok, reward 1, token-level calls in ``dialect``, final answer = last sample."""
    rec = res.record
    assert rec.status == "ok", (rec.task_id, rec.error, rec.logs)
    assert rec.reward == 1.0, (rec.task_id, rec.subscores, rec.reward_reason, rec.logs)
    on_disk = read_calls(rec.calls_path)
    assert rec.num_calls == len(res.calls) == len(on_disk) >= 3
    assert [c.output_token_ids for c in on_disk] == [c.output_token_ids for c in res.calls]
    for call in res.calls:
        assert call.dialect == dialect and call.path.endswith(route), (call.dialect, call.path)
        assert call.prompt_token_ids and call.output_token_ids
        assert len(call.output_logprobs) == len(call.output_token_ids)
    # tool calls in every call but the last, then a plain answer
    assert all(c.finish_reason == "tool_calls" for c in res.calls[:-1])
    assert res.calls[-1].finish_reason == "stop"
    last = tokenizer.decode(res.calls[-1].output_token_ids, skip_special_tokens=True)
    assert rec.final_message and rec.final_message.strip() in last
    assert rec.workspace_changes, "the expert changed the workspace"


def pgrep(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return out.split()


def survivors(marker: str, grace_s: float = 5.0) -> list[str]:
    """Processes matching ``marker`` still alive after ``grace_s`` (the kernel reaps a killed tree quickly)."""
    deadline = time.monotonic() + grace_s
    while (left := pgrep(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def run_hanging_episode(suite, adapter, tmp_path, timeout_s: float = 15.0):
    """A script whose commands sleep far past the task's timeout; returns (result, pids seen, marker).

    The sleeping command carries a unique marker, so ``pgrep -f`` finds exactly its processes. (It is
    not a leading ``sleep N``: Claude Code refuses those and tells the model to use a background task.)
    """
    marker = f"clawgym-hang-{uuid.uuid4().hex[:10]}"
    task = multi_step_tasks(suite, 1)[0].model_copy(deep=True)
    task.limits.timeout_s = timeout_s
    script = tmp_path / "hang.json"
    hang = {"tool": "bash", "command": f"python3 -c 'import time; time.sleep(300)' {marker}"}
    # three hanging steps: a harness that hands a still-running command back to the model after a while
    # (Codex does after 10 s) gets the next one, so the episode cannot finish before its timeout
    script.write_text(json.dumps({"steps": [hang, hang, hang, {"final": "done"}]}))
    seen: list[str] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set() and not seen:
            seen.extend(pgrep(marker))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "eps") as rt:
            res = rt.run(task, adapter)
    finally:
        stop.set()
        watcher.join(5)
    return res, seen, marker
