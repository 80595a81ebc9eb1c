"""The agent owns its resources: per-task inode and CPU limits, the grader's own room, and a grading copy
that is bounded in bytes, entries and time whatever the agent left (units and real sandboxes; whole
episodes are in ``tests/test_agent_resources_episodes.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from clawgym_env.errors import CopyLimitError, SandboxError, TaskError
from clawgym_env.files.workspace import copy_tree
from clawgym_env.grading.reward import grade_workspace, grader_limits
from clawgym_env.grading.room import GRADER_RESERVE_INODES, GRADER_RESERVE_MB, copy_limits, grader_room
from clawgym_env.sandbox import PlaceFullError, SandboxLimits, SandboxSpec
from clawgym_env.sandbox.base import CPU_HIT_PERIODS, DEFAULT_CPUS, DEFAULT_INODES, limit_tags
from clawgym_env.task import TaskLimits
from clawgym_env.testing import EchoTaskSpec, echo_suite
from tasks import load_task_dir

try:
    from helpers_docker import require_engine
except ImportError:  # tests run as a package
    from tests.helpers_docker import require_engine


def _files(root: Path, n: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        os.close(os.open(root / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    return root


# ---- limits: defaults, per task, in the task-dir format ------------------------------------------

def test_inode_and_cpu_limits_have_real_defaults():
    limits = SandboxLimits()
    assert (limits.inodes, limits.cpus) == (DEFAULT_INODES, DEFAULT_CPUS) and limits.inodes and limits.cpus


def test_a_task_sets_inodes_and_cpus_like_disk_and_memory():
    both = SandboxLimits(**TaskLimits(inodes=5000, cpus=0.5).sandbox_overrides())
    assert (both.inodes, both.cpus) == (5000, 0.5)
    assert dataclasses.replace(both, inodes=DEFAULT_INODES, cpus=DEFAULT_CPUS) == SandboxLimits()
    assert TaskLimits().sandbox_overrides() == {}


@pytest.mark.parametrize("key,bad", [("inodes", 0), ("inodes", 2.5), ("cpus", 0), ("cpus", -1.0)])
def test_task_limits_reject_bad_inodes_and_cpus(key, bad):
    with pytest.raises(ValidationError, match=key):
        TaskLimits(**{key: bad})


def _task_dir(root: Path, limits: object) -> Path:
    d = root / "t1"
    (d / "reward").mkdir(parents=True)
    (d / "reward" / "reward.sh").write_text("#!/usr/bin/env bash\necho 1.0\n")
    (d / "data_entry.json").write_text(json.dumps({"task_id": "t1", "user_query": "do it", "metadata": {},
                                                   "input_mount_dir": "/root/workspace", "limits": limits}))
    return d


def test_task_dir_sets_inodes_and_cpus(tmp_path):
    t = load_task_dir(_task_dir(tmp_path, {"inodes": 10000, "cpus": 1.5}))
    assert (t.limits.inodes, t.limits.cpus) == (10000, 1.5)
    assert load_task_dir(_task_dir(tmp_path / "n", {"inodes": None, "cpus": None})).limits == TaskLimits()


@pytest.mark.parametrize("bad", [0, 1.5, "8", True])
def test_task_dir_bad_inodes_names_the_key(tmp_path, bad):
    with pytest.raises(TaskError, match=r"limits\.inodes"):
        load_task_dir(_task_dir(tmp_path, {"inodes": bad}))


def test_limit_tags_name_each_limit():
    assert limit_tags() == []
    assert limit_tags(full_disks=["workspace"], full_inodes=["tmp"], oom_kills=1,
                      throttled_periods=CPU_HIT_PERIODS) == ["disk:workspace", "inodes:tmp", "memory", "cpu"]
    assert limit_tags(throttled_periods=CPU_HIT_PERIODS - 1) == [], "a harness's brief bursts are not the cap"


# ---- the grader's room ---------------------------------------------------------------------------

@pytest.mark.parametrize("disk_mb,inodes", [(None, None), (8, 100), (5000, 1_000_000)])
def test_the_grader_has_room_for_a_workspace_at_the_agents_quotas(tmp_path, disk_mb, inodes):
    task = echo_suite(tmp_path / "s", [EchoTaskSpec("a", "x", expect="x")]).tasks[0].model_copy(deep=True)
    task.limits.disk_mb, task.limits.inodes, task.limits.memory_mb, task.limits.cpus = disk_mb, inodes, 300, 0.1
    agent = SandboxLimits(**task.limits.sandbox_overrides())
    room = grader_limits(task)
    assert room == grader_room(task)
    assert room.disk_mb >= agent.disk_mb + GRADER_RESERVE_MB and room.disk_mb >= SandboxLimits().disk_mb
    assert room.inodes >= agent.inodes + GRADER_RESERVE_INODES and room.inodes >= SandboxLimits().inodes
    assert (room.memory_mb, room.cpus) == (SandboxLimits().memory_mb, SandboxLimits().cpus), \
        "the agent's memory and CPU caps do not bind the grader"
    cap = copy_limits(task)
    assert cap["max_bytes"] == agent.disk_mb << 20 and cap["max_entries"] == agent.inodes


# ---- copy_tree: entries and deadline -------------------------------------------------------------

def test_copy_stops_past_its_entry_cap_with_a_typed_error(tmp_path):
    src = _files(tmp_path / "src", 50)
    assert copy_tree(src, tmp_path / "ok", max_entries=50).files == 50
    with pytest.raises(CopyLimitError, match="limit of 49 entries") as err:
        copy_tree(src, tmp_path / "over", max_entries=49)
    assert err.value.limit == "entries" and err.value.report.files == 49


def test_copy_stops_at_its_deadline_with_a_typed_error(tmp_path):
    src = _files(tmp_path / "src", 20)
    with pytest.raises(CopyLimitError, match="deadline") as err:
        copy_tree(src, tmp_path / "late", deadline=time.monotonic() - 1)
    assert err.value.limit == "time" and err.value.report.files == 0
    (src / "f0").write_bytes(b"x")
    with pytest.raises(CopyLimitError) as big:
        copy_tree(src, tmp_path / "bytes", max_bytes=0)
    assert big.value.limit == "bytes"


# ---- grading whatever the workspace holds --------------------------------------------------------

def _sandboxes() -> list:
    return [pytest.param("bwrap", id="bwrap"), pytest.param("docker", id="docker", marks=pytest.mark.docker)]


def _ready(backend: str) -> None:
    if backend == "docker":
        require_engine()
    else:
        from clawgym_env.sandbox.bwrap.sandbox import check_bwrap

        try:
            check_bwrap(True)
        except SandboxError as exc:
            pytest.skip(str(exc))


@pytest.mark.parametrize("backend", _sandboxes())
def test_more_files_than_the_agent_may_make_score_zero_with_the_reason(tmp_path, backend):
    """A workspace the agent's sandbox could not have left (past its inode quota): graded 0, not infra."""
    _ready(backend)
    task = echo_suite(tmp_path / "s", [EchoTaskSpec("a", "x", expect="x")]).tasks[0].model_copy(deep=True)
    task.limits.inodes = 300
    ws = _files(tmp_path / "ws", 1000)
    rr = grade_workspace(task, ws, final_message="x", sandbox=backend)
    assert (rr.reward, rr.ok, rr.invalid) == (0.0, False, False), rr
    assert "more files, folders and links than grading takes" in (rr.reason or ""), rr.reason
    task.limits.inodes = 2000  # the same workspace within the quota is graded as usual
    assert grade_workspace(task, ws, final_message="x", sandbox=backend).reward == 1.0


@pytest.mark.parametrize("backend", _sandboxes())
def test_a_workspace_at_the_agents_inode_quota_is_graded(tmp_path, backend):
    """As many entries as the agent's sandbox holds (its root included): the grader has room for them."""
    _ready(backend)
    if os.geteuid() != 0:
        pytest.skip("only root mounts the size-limited places a quota needs")
    task = echo_suite(tmp_path / "s", [EchoTaskSpec("a", "x", expect="x")]).tasks[0].model_copy(deep=True)
    task.limits.inodes = 3000
    agent = SandboxLimits(**task.limits.sandbox_overrides())
    ws = tmp_path / "ws"
    ws.mkdir()
    from clawgym_env.sandbox import get_backend

    with get_backend(backend)(SandboxSpec(workspace_host=ws, limits=agent)) as sb:
        r = sb.exec(["python3", "-c", "import os\ntry:\n  for i in range(10**6): open(f'f{i}', 'w').close()\n"
                     "except OSError as e: print(i, e.errno)"])
        assert r.ok and r.stdout.split()[1] == "28", r  # ENOSPC
        assert "inodes:workspace" in sb.limits_hit()
    assert len(os.listdir(ws)) >= 3000 - 2
    rr = grade_workspace(task, ws, final_message="x", sandbox=backend)
    assert (rr.reward, rr.ok) == (1.0, True), rr


@pytest.mark.parametrize("backend", _sandboxes())
def test_a_workspace_that_does_not_fit_a_sandbox_is_a_place_full_error(tmp_path, backend):
    """Handed more files than its workspace holds, a sandbox says so with a typed error (not OSError)."""
    _ready(backend)
    if os.geteuid() != 0:
        pytest.skip("only root mounts the size-limited places a quota needs")
    from clawgym_env.sandbox import get_backend

    ws = _files(tmp_path / "ws", 400)
    with pytest.raises(PlaceFullError, match="limits.inodes") as err:
        with get_backend(backend)(SandboxSpec(workspace_host=ws, limits=SandboxLimits(inodes=100))):
            pass
    assert (err.value.place, err.value.limit) == ("workspace", "inodes")
    (ws / "big").write_bytes(b"x" * (3 << 20))
    with pytest.raises(PlaceFullError, match="limits.disk_mb") as err:
        with get_backend(backend)(SandboxSpec(workspace_host=ws, limits=SandboxLimits(disk_mb=2))):
            pass
    assert err.value.limit == "disk"


@pytest.mark.parametrize("backend", _sandboxes())
def test_a_scratch_sandbox_does_not_hand_its_workspace_back(tmp_path, backend):
    """``hand_back=False`` (a grader's scratch copy): the final workspace is discarded, not copied back."""
    _ready(backend)
    if os.geteuid() != 0:
        pytest.skip("as another user a sandbox works on the host folder itself (no copy to discard)")
    from clawgym_env.sandbox import get_backend

    for hand_back in (True, False):
        ws = _files(tmp_path / f"ws-{hand_back}", 3)
        with get_backend(backend)(SandboxSpec(workspace_host=ws, hand_back=hand_back)) as sb:
            assert sb.exec(["sh", "-c", "echo new > new; rm f0"]).ok
        assert sorted(os.listdir(ws)) == (["f1", "f2", "new"] if hand_back else ["f0", "f1", "f2"])
