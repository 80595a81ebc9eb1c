"""Sandboxes at load: many concurrent episodes, some killed, then the host is checked for leftovers.

Each test runs its episodes with a private temp folder (every sandbox's private folder, the proxy's
sockets) and a private range of sandbox host uids, so what it checks afterwards is its own and no one
else's: no process of those uids or carrying the episode marker, no mount under the temp folder, no
file left in it, no cgroup of this process; for Docker also no container whose binds came from the
temp folder and no new volume.

Episodes are the echo harness (one model call, plain ``urllib``) with the echo policy; the ``kill``
tasks run a process tree that a killer thread SIGKILLs mid-run, the ``hang`` tasks one that outlives
the task's timeout, the ``fill`` task writes past its workspace quota.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from clawgym_env.envs.runtime import RolloutPool, Runtime
from clawgym_env.errors import SandboxError
from clawgym_env.harness import Endpoint, HarnessAdapter, HarnessOutput, LaunchSpec
from clawgym_env.sandbox import SandboxSpec, get_backend
from clawgym_env.sandbox.bwrap.hostside import _hierarchy_base, _own_cgroups
from clawgym_env.sandbox.bwrap.sandbox import check_bwrap
from clawgym_env.task import Task, TaskLimits
from clawgym_env.testing import EchoHarness, EchoScriptPolicy, EchoTaskSpec, echo_suite

try:
    from helpers_docker import require_engine
except ImportError:  # tests run as a package
    from tests.helpers_docker import require_engine

ROOT = Path(__file__).resolve().parent.parent
MARK_VAR = "CLAWGYM_LOAD_MARK"
KILL_VAR = "CLAWGYM_LOAD_KILL"
UID_SLOTS = 1 << 25

pytestmark = [pytest.mark.timeout(900)]


def _bwrap_problem() -> str | None:
    try:
        check_bwrap(True)
        return None
    except SandboxError as exc:
        return str(exc)


class Chaos(HarnessAdapter):
    """The echo harness, with every process marked; ``kill-*``, ``hang-*`` and ``fill-*`` tasks misbehave."""

    name = "echo"
    dialect = "openai_chat"

    def __init__(self, mark: str) -> None:
        self.inner = EchoHarness(client="http")
        self.mark = mark

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        spec = self.inner.launch(task, endpoint, home=home)
        spec.env = {**spec.env, MARK_VAR: self.mark}
        tree = "sleep 300 & sleep 300 & (sleep 300 &) ; wait"  # a tree with a daemonised grandchild
        if task.id.startswith("kill"):
            spec.env[KILL_VAR] = self.mark
            spec.argv = ["sh", "-c", tree]
        elif task.id.startswith("hang"):
            spec.argv = ["sh", "-c", tree]
        elif task.id.startswith("fill"):  # fill the workspace, then answer as usual
            spec.argv = ["sh", "-c", 'head -c 200000000 /dev/zero > fill.bin; exec "$@"', "sh", *spec.argv]
        return spec

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        return self.inner.read_output(stdout, stderr)


def _environ_has(pid: str, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


class Killer:
    """Thread that SIGKILLs every process marked ``KILL_VAR=mark`` once seen (the harness's whole tree)."""

    def __init__(self, mark: str) -> None:
        self.needle = f"{KILL_VAR}={mark}".encode()
        self.killed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seen: dict[str, float] = {}
        while not self._stop.wait(0.2):
            now = time.monotonic()
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                if _environ_has(pid, self.needle):
                    if now - seen.setdefault(pid, now) >= 0.5:  # mid-run: after it started for sure
                        try:
                            os.kill(int(pid), signal.SIGKILL)
                            self.killed += 1
                        except OSError:
                            pass

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A private temp folder and a private range of sandbox uids for this test's sandboxes."""
    tmp = Path(tempfile.mkdtemp(prefix="cg-load-", dir="/tmp"))
    tmp.chmod(0o711)  # the sandbox uids must enter it
    base = 1_900_000_000 + uuid.uuid4().int % 5 * UID_SLOTS  # below the default range (2.1e9 on), under 2**31
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


def host_leftovers(tmp: Path, uids: range, mark: str, driver: int | None = None) -> list[str]:
    """What the episodes left on the host: processes, mounts, files, cgroups of the sandboxes made by the
    process ``driver`` (default: this one); empty: nothing."""
    found = []
    needle, me = f"{MARK_VAR}={mark}".encode(), str(os.getpid())
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and p != me):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        uid = _uid(pid)
        if (uid is not None and uid in uids) or _environ_has(pid, needle) or str(tmp) in cmd:
            found.append(f"process {pid} (uid {uid}): {cmd[:160]}")
    with open("/proc/self/mountinfo") as f:
        found += [f"mount: {line.split()[4]}" for line in f if str(tmp) in line]
    found += [f"file: {p}" for p in tmp.iterdir()]
    own_v1, own_v2 = _own_cgroups()
    for ctrl in ("memory", "pids", "cpu"):
        hit = _hierarchy_base(ctrl, own_v1, own_v2)
        if hit is not None:
            found += [f"cgroup: {d}" for d in hit[0].glob(f"clawgym-{driver or os.getpid()}-*")]
    return found


def settle(check, grace_s: float = 20.0) -> list[str]:
    """``check()`` until it finds nothing (kills and lazy unmounts are asynchronous), or its last answer."""
    deadline = time.monotonic() + grace_s
    left = check()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = check()
    return left


def chaos_tasks(root: Path, n_ok: int, n_kill: int, n_hang: int) -> list[Task]:
    """``n_ok`` echo tasks (timeout 120 s), ``n_kill`` to be killed, ``n_hang`` that pass their 3 s timeout."""
    ok = echo_suite(root / "ok", [EchoTaskSpec(f"ok-{i}", f"hello {i}", expect=f"hello {i}") for i in range(n_ok)])
    kill = echo_suite(root / "kill", [EchoTaskSpec(f"kill-{i}", "x", expect="x") for i in range(n_kill)])
    hang = echo_suite(root / "hang", [EchoTaskSpec(f"hang-{i}", "x", expect="x") for i in range(n_hang)],
                      limits=TaskLimits(timeout_s=3.0, max_turns=2, reward_timeout_s=30.0))
    tasks = [*ok.tasks, *kill.tasks, *hang.tasks]
    return [tasks[(i * 37) % len(tasks)] for i in range(len(tasks))]  # interleaved (37 is prime to 100 and 20)


def close_from_another_thread(backend: str, ws_root: Path, n: int, **opts) -> list[tuple[bool, bool]]:
    """``n`` sandboxes whose running exec (a process tree) is cut by ``close()`` from another thread,
    as a driver does with an episode abandoned at its deadline. Returns (exec returned, timed out) each."""
    out: list[tuple[bool, bool]] = []
    for i in range(n):
        ws = ws_root / f"closed-{i}"
        ws.mkdir(parents=True)
        sb = get_backend(backend)(SandboxSpec(workspace_host=ws), **opts)
        sb.__enter__()
        done: list[bool] = []

        def run(sb=sb, done=done) -> None:
            try:
                done.append(sb.exec(["sh", "-c", "sleep 300 & (sleep 300 &); sleep 300"], timeout=240).timed_out)
            except SandboxError:
                done.append(False)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        time.sleep(1.0)
        sb.close()
        t.join(30)
        out.append((not t.is_alive(), bool(done and done[0])))
    return out


def run_chaos(backend: str, tmp_path: Path, n_ok: int, n_kill: int, n_hang: int, concurrency: int, pool: int = 0):
    mark = uuid.uuid4().hex
    tasks = chaos_tasks(tmp_path / "suite", n_ok, n_kill, n_hang)
    with Killer(mark) as killer, Runtime(EchoScriptPolicy(), sandbox=backend, out_dir=tmp_path / "eps",
                                         sandbox_pool=pool) as rt:
        results = RolloutPool(rt, concurrency=concurrency, progress=False).run(tasks, Chaos(mark))
        stats = rt._pool.stats if rt._pool is not None else None
    return mark, tasks, results, killer, stats


def check_results(tasks: list[Task], results) -> None:
    assert len(results) == len(tasks)
    for task, res in zip(tasks, results):
        rec = res.record
        assert rec.task_id == task.id
        if task.id.startswith("ok"):
            assert rec.status == "ok" and rec.reward == 1.0, (rec.task_id, rec.status, rec.error, rec.logs)
        elif task.id.startswith("hang"):
            assert rec.status != "ok" and rec.exit_code is not None, (rec.task_id, rec.status, rec.error)
        else:  # killed: SIGKILL of its main process (exit 137), never a success
            assert rec.status != "ok" and rec.reward == 0.0, (rec.task_id, rec.status, rec.error)


# ---- bubblewrap ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_bwrap_100_episodes_with_kills_leave_nothing_behind(isolated, tmp_path):
    if (why := _bwrap_problem()) is not None:
        pytest.skip(why)
    tmp, uids = isolated
    mark, tasks, results, killer, _ = run_chaos("bwrap", tmp_path, n_ok=80, n_kill=10, n_hang=10, concurrency=10)
    check_results(tasks, results)
    assert killer.killed >= 10  # the kills did happen mid-run
    cut = close_from_another_thread("bwrap", tmp_path / "direct", 5, tmp_root=tmp)
    assert all(returned for returned, _ in cut), cut
    assert settle(lambda: host_leftovers(tmp, uids, mark)) == []


def test_bwrap_close_from_another_thread_without_cgroups_kills_the_exec(isolated, tmp_path):
    """Without a cgroup to empty, close() must still end a running exec and all its processes."""
    if (why := _bwrap_problem()) is not None:
        pytest.skip(why)
    tmp, uids = isolated
    cut = close_from_another_thread("bwrap", tmp_path / "direct", 2, tmp_root=tmp, use_cgroups=False)
    assert all(returned for returned, _ in cut), cut
    assert settle(lambda: host_leftovers(tmp, uids, "no-mark")) == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_one_episode_filling_its_workspace_does_not_touch_its_neighbours(backend, isolated, tmp_path,
                                                                         request):
    if backend == "docker":
        request.getfixturevalue("engine")
    elif (why := _bwrap_problem()) is not None:
        pytest.skip(why)
    tmp, uids = isolated
    # a small quota set by the tasks (the default 2 GiB would cost 2 GiB of RAM)
    small = TaskLimits(timeout_s=120.0, max_turns=4, reward_timeout_s=60.0, disk_mb=32)
    mark = uuid.uuid4().hex
    ok = echo_suite(tmp_path / "ok", [EchoTaskSpec(f"ok-{i}", f"hello {i}", expect=f"hello {i}") for i in range(5)],
                    limits=small)
    fill = echo_suite(tmp_path / "fill", [EchoTaskSpec("fill-0", "full", expect="full")], limits=small)
    tasks = [*ok.tasks[:2], fill.tasks[0], *ok.tasks[2:]]
    with Runtime(EchoScriptPolicy(), sandbox=backend, out_dir=tmp_path / "eps") as rt:
        results = RolloutPool(rt, concurrency=6, progress=False).run(tasks, Chaos(mark))
    by_id = {r.record.task_id: r.record for r in results}
    assert by_id["fill-0"].limits_hit == ["disk:workspace"], by_id["fill-0"]
    for i in range(5):
        rec = by_id[f"ok-{i}"]
        assert rec.status == "ok" and rec.reward == 1.0 and rec.limits_hit == [], (rec.status, rec.error, rec.logs)
    assert settle(lambda: host_leftovers(tmp, uids, mark)) == []


DRIVER = r"""
import pathlib, sys, threading, time
from clawgym_env.sandbox import SandboxSpec, get_backend
backend, ws, sock = sys.argv[1:4]
spec = SandboxSpec(workspace_host=pathlib.Path(ws), proxy_socket=pathlib.Path(sock))
if backend == "docker-pool":
    from clawgym_env.sandbox.docker.pool import DockerPool
    pool = DockerPool(2)
    pool.prewarm(spec)
    while pool.warm_count(spec) < 2:
        time.sleep(0.1)
    backend = pool.name
sb = get_backend(backend)(spec).__enter__()
threading.Thread(target=sb.exec, args=(["sh", "-c", "sleep 300 & (sleep 300 &); sleep 300"],), daemon=True).start()
time.sleep(1.5)
print("running", flush=True)
time.sleep(300)
"""


def kill_a_driver(backend: str, tmp: Path, tmp_path: Path) -> int:
    """A driver process with an open sandbox (and, for ``docker-pool``, warm containers) running a process
    tree, killed with SIGKILL."""
    import socket

    ws, sock_dir = tmp_path / "ws", tmp_path / "px"
    ws.mkdir()
    sock_dir.mkdir(mode=0o711)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_dir / "proxy.sock"))
    (sock_dir / "proxy.sock").chmod(0o666)
    listener.listen(8)
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, backend, str(ws), str(sock_dir / "proxy.sock")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(tmp_path))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the driver ends (EOF) rather than hang when it fails
        assert line.strip() == b"running", proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait(30)
        listener.close()
    return proc.pid


@pytest.mark.slow
def test_a_killed_bwrap_driver_leaves_nothing_behind(isolated, tmp_path):
    if (why := _bwrap_problem()) is not None:
        pytest.skip(why)
    tmp, uids = isolated
    driver = kill_a_driver("bwrap", tmp, tmp_path)
    assert settle(lambda: host_leftovers(tmp, uids, "no-mark", driver), 30) == []


def test_a_sandbox_pool_is_for_docker_only():
    with pytest.raises(ValueError, match="docker"):
        Runtime(EchoScriptPolicy(), sandbox="bwrap", sandbox_pool=2)


# ---- Docker --------------------------------------------------------------------------------------

@pytest.fixture
def engine():
    require_engine()
    import docker

    client = docker.from_env(timeout=60)
    yield client
    client.close()


def docker_leftovers(client, tmp: Path, volumes_before: set[str]) -> list[str]:
    found = []
    for c in client.api.containers(all=True, filters={"label": "org.clawgym.sandbox"}):  # one call, no inspect
        if any(str(m.get("Source", "")).startswith(str(tmp)) for m in c.get("Mounts") or []):
            found.append(f"container {c['Id'][:12]} ({c.get('State')})")
    found += [f"volume {v.name}" for v in client.volumes.list() if v.name not in volumes_before]
    return found


@pytest.mark.docker
@pytest.mark.slow
def test_docker_20_episodes_with_kills_leave_nothing_behind(engine, isolated, tmp_path):
    """Through a pool of warm containers (and cold ones while it fills), then cold ones closed mid-exec."""
    tmp, uids = isolated
    volumes = {v.name for v in engine.volumes.list()}
    mark, tasks, results, killer, stats = run_chaos("docker", tmp_path, n_ok=14, n_kill=3, n_hang=3, concurrency=5,
                                                    pool=3)
    check_results(tasks, results)
    assert killer.killed >= 3
    assert stats is not None and stats.hits > 0, stats
    cut = close_from_another_thread("docker", tmp_path / "direct", 2, tmp_root=tmp)
    assert all(returned for returned, _ in cut), cut
    assert settle(lambda: host_leftovers(tmp, uids, mark) + docker_leftovers(engine, tmp, volumes), 30) == []


@pytest.mark.docker
@pytest.mark.slow
def test_a_killed_driver_with_a_docker_pool_leaves_nothing_behind(engine, isolated, tmp_path):
    tmp, uids = isolated
    volumes = {v.name for v in engine.volumes.list()}
    driver = kill_a_driver("docker-pool", tmp, tmp_path)
    left = settle(lambda: host_leftovers(tmp, uids, "no-mark", driver) + docker_leftovers(engine, tmp, volumes), 60)
    assert left == []
