"""The agent owns its resources, from inside real episodes: disk fill, inode flood, memory hog and CPU
burn under bubblewrap and under Docker are the agent's outcome, never an infrastructure failure.

Each attack is a bash step of the ``mini`` harness driven by a scripted policy (``scripted:file:``),
then a wrong final answer. For each: the record names the limit in ``limits_hit`` (``disk:workspace``,
``inodes:workspace``, ``memory``, ``cpu``), its status is a task outcome with a reward no higher than
the do-nothing agent's on the same task, grading ran (no ``infra_error``) and nothing is left on the
host: no workspace folder, no mount, no file under the test's private temporary folder, no process of
its sandbox uids, no cgroup of this process, no container. ``clawgym eval`` with a disk-filling agent
counts the task in Pass@1 with its 0, never retries it and leaves no workspace behind.

The disk attack deletes the task's protected input, then fills the default 2 GiB quota: grading puts the
input back, so the workspace it grades holds more than the agent's quota, which a grader with no room of
its own once met with ``ENOSPC`` escaping grading (an infrastructure failure, retried, then dropped).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from clawgym_env.envs.runtime import Runtime
from clawgym_env.errors import SandboxError
from clawgym_env.plugins import make_harness
from clawgym_env.sandbox.bwrap.hostside import _hierarchy_base, _own_cgroups
from clawgym_env.task import Task, TaskLimits
from clawgym_env.testing import EchoTaskSpec, echo_suite
from tasks import load_task_dir

try:
    from helpers_docker import require_engine
except ImportError:  # tests run as a package
    from tests.helpers_docker import require_engine

UID_SLOTS = 1 << 25
INPUT = "data.bin"
FILL = (f"rm -f {INPUT}; fallocate -l 3G big.bin; echo fallocate=$?; "
        "dd if=/dev/zero of=fill.bin bs=1M count=3000 status=none; echo dd=$?; df -k .")
FLOOD = ("python3 -c \"import os\ntry:\n  for i in range(10**6): open(f'f{i}', 'w').close()\n"
         "except OSError as e: print('stopped at', i, e.strerror)\"")
HOG = "python3 -c \"b = bytearray(1 << 30); b[::4096] = b'x' * len(b[::4096]); print('survived')\"; echo rc=$?"
BURN = "for i in 1 2 3 4 5 6 7 8; do timeout 4 sh -c 'while :; do :; done' & done; wait; echo burnt"
ATTACKS = {  # name: (the bash step, the task's limits beside the defaults, the tag it must leave)
    "disk": (FILL, {}, "disk:workspace"),
    "inodes": (FLOOD, {"inodes": 20_000}, "inodes:workspace"),
    "memory": (HOG, {"memory_mb": 256}, "memory"),
    "cpu": (BURN, {"cpus": 0.1}, "cpu"),  # a tenth of a core: the cap binds even on a loaded host
}


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A private temporary folder and range of sandbox uids, so what is checked afterwards is ours alone."""
    if os.geteuid() != 0:
        pytest.skip("the quotas these attacks run into are size-limited places, which need a root driver")
    tmp = Path(tempfile.mkdtemp(prefix="cg-own-", dir="/tmp"))
    tmp.chmod(0o711)  # the sandbox uids must enter it
    base = 1_800_000_000 + uuid.uuid4().int % 3 * UID_SLOTS  # outside the default range, under 2**31
    monkeypatch.setenv("CLAWGYM_SANDBOX_UID_BASE", str(base))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    yield tmp, range(base, base + UID_SLOTS)
    shutil.rmtree(tmp, ignore_errors=True)


def _uid(pid: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cmd(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


def leftovers(tmp: Path, uids: range, episodes: Path) -> list[str]:
    """Processes of the sandbox uids, mounts and files under ``tmp``, workspaces under ``episodes``, this
    process's cgroups and containers whose binds came from ``tmp``; empty: nothing is left."""
    found = [f"process {pid} (uid {_uid(pid)}): {_cmd(pid)}" for pid in os.listdir("/proc")
             if pid.isdigit() and (_uid(pid) or 0) in uids]
    with open("/proc/self/mountinfo") as f:
        found += [f"mount {line.split()[4]}" for line in f if str(tmp) in line]
    found += [f"file {p}" for p in tmp.iterdir()]
    found += [f"workspace {p}" for p in episodes.glob("*/workspace")] if episodes.is_dir() else []
    own_v1, own_v2 = _own_cgroups()
    for ctrl in ("memory", "pids", "cpu"):
        hit = _hierarchy_base(ctrl, own_v1, own_v2)
        found += [f"cgroup {d}" for d in hit[0].glob(f"clawgym-{os.getpid()}-*")] if hit else []
    try:
        import docker

        client = docker.from_env(timeout=20)
        for c in client.api.containers(all=True, filters={"label": "org.clawgym.sandbox"}):
            if any(str(m.get("Source", "")).startswith(str(tmp)) for m in c.get("Mounts") or []):
                found.append(f"container {c['Id'][:12]}")
        client.close()
    except Exception:  # noqa: BLE001 - no engine: no container either
        pass
    return found


def settle(check, grace_s: float = 20.0) -> list[str]:
    """``check()`` until it finds nothing (kills and lazy unmounts finish asynchronously), or its last answer."""
    deadline = time.monotonic() + grace_s
    left = check()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = check()
    return left


def _ready(backend: str) -> None:
    if backend == "docker":
        require_engine()
        return
    from clawgym_env.sandbox.bwrap.sandbox import check_bwrap

    try:
        check_bwrap(True)
    except SandboxError as exc:
        pytest.skip(str(exc))


def _spec(task_id: str) -> EchoTaskSpec:
    """An echo task shipping an 8 MiB input the grader puts back (protected)."""
    return EchoTaskSpec(task_id, "say right", expect="right", files={INPUT: "x" * (8 << 20)})


def _protect(task_dir: Path) -> None:
    entry = json.loads((task_dir / "data_entry.json").read_text())
    (task_dir / "data_entry.json").write_text(json.dumps({**entry, "protected_inputs": [INPUT]}))


def _task(root: Path, limits: dict) -> Task:
    base = TaskLimits(timeout_s=300.0, max_turns=4, reward_timeout_s=60.0)
    suite = echo_suite(root, [_spec("own")], limits=base.model_copy(update=limits))
    _protect(Path(suite.root) / "own")
    task = load_task_dir(Path(suite.root) / "own", suite="echo")
    assert task.protected_inputs == [INPUT] and task.limits == suite.tasks[0].limits
    return task


def _episode(where: Path, backend: str, task: Task, steps: list[dict], name: str):
    script = where / f"{name}-{uuid.uuid4().hex[:6]}.json"
    script.write_text(json.dumps({"steps": steps}))
    with Runtime(f"scripted:file:{script}", sandbox=backend, out_dir=where / "episodes") as rt:
        return rt.run(task, make_harness("mini")).record


BACKENDS = [pytest.param("bwrap", id="bwrap"), pytest.param("docker", id="docker", marks=pytest.mark.docker)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_attack_on_the_sandboxs_resources_is_the_agents_outcome(isolated, tmp_path, backend, attack):
    _ready(backend)
    tmp, uids = isolated
    command, limits, tag = ATTACKS[attack]
    task = _task(tmp_path / "suite", limits)
    baseline = _episode(tmp_path, backend, task, [{"final": "wrong"}], "nothing")
    assert baseline.status == "ok" and baseline.reward == 0.0, (baseline.status, baseline.error)
    if attack != "cpu":  # at a tenth of a core the harness's own start is held at the cap too
        assert baseline.limits_hit == [], baseline.limits_hit
    rec = _episode(tmp_path, backend, task, [{"tool": "bash", "command": command}, {"final": "wrong"}], attack)
    assert rec.num_calls == 2, (rec.status, rec.error, rec.logs)
    assert tag in rec.limits_hit, (rec.limits_hit, rec.logs)
    assert rec.is_task_outcome and rec.status != "infra_error", (rec.status, rec.failure_boundary, rec.error)
    assert rec.reward is not None and rec.reward <= baseline.reward, (rec.reward, baseline.reward, rec.reward_reason)
    assert "reward_s" in rec.timings, "the episode was graded"
    assert settle(lambda: leftovers(tmp, uids, tmp_path / "episodes")) == []


@pytest.mark.slow
def test_eval_counts_a_disk_filling_agent_with_its_zero(isolated, tmp_path):
    """Two tasks, one solved and one whose agent fills its disk: Pass@1 is 0.5, once each, no workspace left."""
    from leaderboards.metrics import summarize
    from leaderboards.run import run_eval
    from leaderboards.schema import read_results

    _ready("bwrap")
    tmp, uids = isolated
    suite = echo_suite(tmp_path / "suite", [_spec("solve"), _spec("fill")],
                       limits=TaskLimits(timeout_s=300.0, max_turns=4, reward_timeout_s=60.0))
    _protect(Path(suite.root) / "fill")
    fill = Path(suite.root) / "fill" / "expert.json"
    fill.write_text(json.dumps({"steps": [{"tool": "bash", "command": FILL}, {"final": "wrong"}]}))
    out = tmp_path / "results.jsonl"
    summary = run_eval(str(suite.root), harness="mini", policy="scripted:expert", out=out, concurrency=1,
                       retries=2, retry_backoff_s=0, progress=False)
    rows = {r.task_id: r for r in read_results(out).rows}
    assert (summary.ran, summary.infra_failures, summary.retried) == (2, 0, 0), \
        {k: (r.status, r.error) for k, r in rows.items()}
    assert rows["fill"].attempts == 1 and rows["fill"].is_task_outcome and rows["fill"].reward == 0.0
    assert rows["solve"].reward == 1.0
    assert summarize(list(rows.values()))[0].pass1 == 0.5
    record = json.loads((Path(rows["fill"].episode_dir) / "episode.json").read_text())
    assert "disk:workspace" in record["limits_hit"], record["limits_hit"]
    assert settle(lambda: leftovers(tmp, uids, out.with_name("results-episodes"))) == []
