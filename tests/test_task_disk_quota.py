"""A task's own sandbox quota: ``TaskLimits.disk_mb`` / ``memory_mb`` from the task dir to the episode's sandbox.

The episode test runs the mini harness in a real bubblewrap sandbox with a scripted policy whose one
shell step writes 16 MB into the workspace: with the task's ``disk_mb`` at 8 the write fails and the
record says ``disk:workspace``; the same task with the default quota (2 GiB) writes it all.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from clawgym_env.envs.runtime import Runtime
from clawgym_env.errors import SandboxError, TaskError
from clawgym_env.plugins import load_suite, make_harness, sandboxes
from clawgym_env.sandbox import SandboxLimits
from clawgym_env.task import TaskLimits
from clawgym_env.testing import EchoTaskSpec, echo_suite
from tasks import load_task_dir

BIG = 16_000_000  # bytes the agent writes; over an 8 MiB quota, far under the default 2 GiB


# ---- validation and the task-dir format ----------------------------------------------------------

def test_task_limits_default_to_the_sandbox_defaults():
    limits = TaskLimits()
    assert limits.disk_mb is None and limits.memory_mb is None
    assert limits.sandbox_overrides() == {}
    assert SandboxLimits(**limits.sandbox_overrides()) == SandboxLimits()


def test_task_limits_overrides_only_what_the_task_sets():
    assert TaskLimits(disk_mb=8).sandbox_overrides() == {"disk_mb": 8}
    both = SandboxLimits(**TaskLimits(disk_mb=8, memory_mb=512).sandbox_overrides())
    assert (both.disk_mb, both.memory_mb) == (8, 512)
    assert dataclasses.replace(both, disk_mb=SandboxLimits().disk_mb, memory_mb=SandboxLimits().memory_mb) \
        == SandboxLimits()  # every other limit keeps its default


@pytest.mark.parametrize("bad", [0, -1, 2.5, "eight"])
@pytest.mark.parametrize("key", ["disk_mb", "memory_mb"])
def test_task_limits_reject_non_positive_or_fractional_quota(key, bad):
    with pytest.raises(ValidationError, match=key):
        TaskLimits(**{key: bad})


def _task_dir(root: Path, limits: object) -> Path:
    d = root / "t1"
    (d / "reward").mkdir(parents=True)
    (d / "reward" / "reward.sh").write_text("#!/usr/bin/env bash\necho 1.0\n")
    (d / "data_entry.json").write_text(json.dumps({"task_id": "t1", "user_query": "do it", "metadata": {},
                                                   "input_mount_dir": "/root/workspace", "limits": limits}))
    return d


def test_task_dir_sets_disk_and_memory(tmp_path):
    t = load_task_dir(_task_dir(tmp_path, {"timeout_s": 30, "disk_mb": 64, "memory_mb": 1024}))
    assert t.limits == TaskLimits(timeout_s=30, disk_mb=64, memory_mb=1024)


def test_task_dir_null_quota_is_the_default(tmp_path):
    assert load_task_dir(_task_dir(tmp_path, {"disk_mb": None, "memory_mb": None})).limits == TaskLimits()


@pytest.mark.parametrize("bad", [0, 8.5, "8", True])
def test_task_dir_bad_disk_quota_names_the_key(tmp_path, bad):
    with pytest.raises(TaskError, match=r"limits\.disk_mb"):
        load_task_dir(_task_dir(tmp_path, {"disk_mb": bad}))


def test_a_suite_written_with_a_quota_loads_back_with_it(tmp_path):
    limits = TaskLimits(timeout_s=60.0, max_turns=2, reward_timeout_s=30.0, disk_mb=8)
    written = echo_suite(tmp_path / "quota", [EchoTaskSpec("q", "x", expect="x")], limits=limits)
    plain = echo_suite(tmp_path / "plain", [EchoTaskSpec("p", "x", expect="x")])  # writes "disk_mb": null
    assert load_suite(str(written.root)).tasks[0].limits == limits
    assert load_suite(str(plain.root)).tasks[0].limits == plain.tasks[0].limits


# ---- the episode's sandbox gets the task's limits ------------------------------------------------

class SpecCatcher:
    """A backend that keeps the spec it was given, then fails to start (no process runs)."""

    seen: list = []

    def __init__(self, spec):
        SpecCatcher.seen.append(spec)

    def __enter__(self):
        raise SandboxError("not started (test)")

    def __exit__(self, *exc):
        return None


def test_episode_sandbox_gets_the_task_limits(tmp_path):
    suite = echo_suite(tmp_path / "s", [EchoTaskSpec("a", "x", expect="x"), EchoTaskSpec("b", "x", expect="x")])
    custom = suite.tasks[0].model_copy(deep=True)
    custom.limits.disk_mb, custom.limits.memory_mb = 8, 700
    SpecCatcher.seen = []
    with sandboxes.registered("spec-catcher", SpecCatcher), \
            Runtime("scripted:expert", sandbox="spec-catcher", out_dir=tmp_path / "eps") as rt:
        for task in (custom, suite.tasks[1]):
            assert rt.run(task, make_harness("mini")).record.failure_boundary == "sandbox"
    assert SpecCatcher.seen[0].limits == dataclasses.replace(SandboxLimits(), disk_mb=8, memory_mb=700)
    assert SpecCatcher.seen[1].limits == SandboxLimits()


# ---- a real episode in bubblewrap -----------------------------------------------------------------

def _bwrap_quota_problem() -> str | None:
    from clawgym_env.sandbox.bwrap.sandbox import check_bwrap

    if os.geteuid() != 0:
        return "only a root driver gives bubblewrap sandboxes a size-limited workspace"
    try:
        check_bwrap(True)
    except SandboxError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("disk_mb", [8, None])
def test_task_quota_is_enforced_and_recorded_in_bwrap(tmp_path, disk_mb):
    if (why := _bwrap_quota_problem()) is not None:
        pytest.skip(why)
    limits = TaskLimits(timeout_s=120.0, max_turns=4, reward_timeout_s=60.0, disk_mb=disk_mb)
    task = echo_suite(tmp_path / "suite", [EchoTaskSpec("fill", "write big.bin", expect="wrote")],
                      limits=limits).tasks[0]
    script = tmp_path / "fill.json"
    script.write_text(json.dumps({"steps": [
        {"tool": "bash", "command": f"head -c {BIG} /dev/zero > big.bin; echo rc=$?; wc -c < big.bin"},
        {"final": "wrote big.bin"}]}))
    with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "eps") as rt:
        rec = rt.run(task, make_harness("mini")).record
    assert rec.num_calls == 2, (rec.status, rec.error, rec.logs)
    changes = {c.path: c for c in rec.workspace_changes}
    if disk_mb is None:
        assert rec.limits_hit == [], rec.limits_hit
        assert rec.status == "ok" and rec.reward == 1.0, (rec.status, rec.error, rec.logs)
        assert changes["big.bin"].size == BIG
    else:
        assert rec.limits_hit == ["disk:workspace"], (rec.limits_hit, rec.status, rec.error, rec.logs)
        assert changes["big.bin"].size < BIG


@pytest.mark.parametrize("disk_mb,agent", [(None, SandboxLimits().disk_mb), (8, 8), (5000, 5000)])
def test_the_grader_gets_room_for_the_agents_workspace(tmp_path, disk_mb, agent):
    from clawgym_env.grading.reward import grade_workspace
    from clawgym_env.grading.room import GRADER_RESERVE_MB

    suite = echo_suite(tmp_path / "s", [EchoTaskSpec("a", "x", expect="x")])
    task = suite.tasks[0].model_copy(deep=True)
    task.limits.disk_mb, task.limits.memory_mb = disk_mb, 700
    SpecCatcher.seen = []
    with sandboxes.registered("spec-catcher", SpecCatcher), pytest.raises(SandboxError):
        grade_workspace(task, tmp_path / "s", sandbox="spec-catcher")
    (spec,) = SpecCatcher.seen
    # room for a workspace filled to the agent's quota and more, never less than the default
    assert spec.limits.disk_mb >= max(SandboxLimits().disk_mb, agent + GRADER_RESERVE_MB)
    assert spec.limits == dataclasses.replace(SandboxLimits(), disk_mb=spec.limits.disk_mb,
                                              inodes=spec.limits.inodes)  # memory: the default
