"""The Docker sandbox backend against a real engine.

The module fixture starts a local dockerd with ``scripts/dockerd.sh start`` when no engine answers
(and stops it again afterwards); the tests skip only when an engine truly cannot run here.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import socketserver
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import clawgym_env
from clawgym_env.errors import SandboxError
from clawgym_env.sandbox import SandboxLimits, SandboxSpec, get_backend

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
PROJECT = Path(clawgym_env.__file__).resolve().parent.parent
TARGET = "/root/.openclaw/workspace"


try:
    from helpers_docker import engine_problem as _engine_problem
except ImportError:  # tests run as a package
    from tests.helpers_docker import engine_problem as _engine_problem


@pytest.fixture(scope="module")
def engine():
    why = _engine_problem()
    started = False
    if why is not None:
        if shutil.which("dockerd") is None:
            why = "dockerd is not installed (scripts/dockerd.sh --install start, or apt-get install -y docker.io)"
        elif os.geteuid() != 0:
            why = f"no engine answers ({why}) and starting dockerd needs root"
        else:
            proc = subprocess.run([str(ROOT / "scripts" / "dockerd.sh"), "start"], capture_output=True,
                                  text=True, timeout=180)
            problem = _engine_problem()
            started = problem is None
            why = None if started else (proc.stderr.strip()[-600:] or problem)
    if why is not None:
        pytest.skip(f"no Docker engine can run here: {why}")
    yield
    if started:
        subprocess.run([str(ROOT / "scripts" / "dockerd.sh"), "stop"], capture_output=True, timeout=120)


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "input.txt").write_text("hello from the host\n")
    return ws


def _sandbox(ws: Path, **kw):
    opts = {k: kw.pop(k) for k in ("max_output_bytes", "tmp_root", "runtime") if k in kw}
    return get_backend("docker")(SandboxSpec(workspace_host=ws, **kw), **opts)


def test_exec_sees_workspace_at_target(engine, workspace, monkeypatch):
    monkeypatch.setenv("CLAWGYM_HOST_ONLY", "leak")
    with _sandbox(workspace, env={"FROM_SPEC": "1"}) as sb:
        res = sb.exec(["sh", "-c", "pwd; cat input.txt; echo to-stderr >&2; exit 3"])
        assert res.returncode == 3 and not res.timed_out
        assert res.stdout.splitlines() == [TARGET, "hello from the host"]
        assert res.stderr.strip() == "to-stderr"
        assert sb.exec(["cat", f"{TARGET}/input.txt"]).stdout == "hello from the host\n"
        res = sb.exec(["sh", "-c", "cat; echo \"$FOO $HOME $TMPDIR $LANG\"; env | grep -c HOSTNAME"],
                      stdin=b"piped\n", env={"FOO": "bar"}, cwd="/tmp")
        assert res.stdout.splitlines() == ["piped", "bar /root /tmp C.UTF-8", "0"]
        env = dict(line.split("=", 1) for line in sb.exec(["env"]).stdout.splitlines())
        assert "CLAWGYM_HOST_ONLY" not in env and env["FROM_SPEC"] == "1" and env["USER"] == "sandbox"


def test_files_persist_between_execs(engine, workspace):
    with _sandbox(workspace) as sb:
        assert sb.exec(["sh", "-c", "echo one > made.txt && echo two > /tmp/t.txt && echo three > ~/h.txt"]).ok
        res = sb.exec(["sh", "-c", "cat made.txt /tmp/t.txt ~/h.txt"])
        assert res.stdout.split() == ["one", "two", "three"]
        assert sb.read_file("/tmp/t.txt") == b"two\n"
        sb.write_file("/root/.config/tool/conf.json", '{"a": 1}')
        assert sb.exec(["cat", "/root/.config/tool/conf.json"]).stdout == '{"a": 1}'
        assert sb.exec(["sh", "-c", "echo more >> /root/.config/tool/conf.json"]).ok  # the user owns it
        with pytest.raises(SandboxError):
            sb.write_file("/usr/clawgym-nope", "x")
    assert (workspace / "made.txt").read_text() == "one\n"  # copied back by close()


def test_host_files_outside_workspace_are_invisible(engine, workspace):
    secret_dir = Path(tempfile.mkdtemp(prefix="clawgym-secret-"))
    try:
        marker = secret_dir / "marker.txt"
        marker.write_text("host secret")
        with _sandbox(workspace) as sb:
            res = sb.exec(["cat", str(marker)])
            assert res.returncode != 0 and "host secret" not in res.stdout
            assert "marker.txt" not in sb.exec(["sh", "-c", f"ls {secret_dir} 2>&1; ls /tmp"]).stdout
            assert sb.exec(["ln", "-s", str(marker), "link"]).ok  # a symlink must not leak it either
            with pytest.raises(SandboxError):
                sb.read_file(f"{TARGET}/link")
    finally:
        shutil.rmtree(secret_dir)


def test_writes_outside_workspace_fail(engine, workspace):
    targets = ["/usr/clawgym-x", "/etc/clawgym-x", "/clawgym-x", "/opt/clawgym-x"]
    with _sandbox(workspace) as sb:
        for path in targets:
            res = sb.exec(["sh", "-c", 'echo x > "$0"', path])
            assert res.returncode != 0 and "Read-only file system" in res.stderr, (path, res)
            assert not Path(path).exists(), path
        res = sb.exec(["sh", "-c", 'echo x > "$0"', f"{PROJECT}/clawgym-x"])  # the project is not even there
        assert res.returncode != 0 and not (PROJECT / "clawgym-x").exists()


def test_no_network_to_host_tcp(engine, workspace):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    port = server.getsockname()[1]
    try:
        with _sandbox(workspace) as sb:
            code = (f"import socket,sys\ntry:\n socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
                    " print('connected')\nexcept OSError as e:\n print('refused', e)\n")
            res = sb.exec(["python3", "-c", code])
            assert res.stdout.startswith("refused"), res
            lines = sb.exec(["cat", "/proc/net/dev"]).stdout.splitlines()[2:]
            assert {line.split(":")[0].strip() for line in lines} == {"lo"}
    finally:
        server.close()


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _Pong(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = f"pong {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_proxy_relay_reaches_host_unix_socket(engine, workspace, tmp_path):
    sock_path = tmp_path / "proxy" / "proxy.sock"
    sock_path.parent.mkdir()
    server = _UnixHTTPServer(str(sock_path), _Pong)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with _sandbox(workspace, proxy_socket=sock_path, proxy_port=18123) as sb:
            code = ("import urllib.request as u; "
                    "print(u.urlopen('http://127.0.0.1:18123/ep/x/v1').read().decode())")
            for _ in range(2):  # the relay serves every exec of the sandbox
                res = sb.exec(["python3", "-c", code], timeout=30)
                assert res.ok, res
                assert res.stdout.strip() == "pong /ep/x/v1"
            assert sb.exec(["sh", "-c", f"ls {sock_path.parent}"]).returncode != 0  # its folder is not shared
            res = sb.exec(["sh", "-c", "echo $CLAWGYM_PROXY_URL; sleep 100"], timeout=1)
            assert res.timed_out and res.stdout.strip() == "http://127.0.0.1:18123"
            assert sb.exec(["python3", "-c", code]).ok  # the relay outlives timed-out execs
            res = sb.exec(["no-such-command-xyz"])
            assert res.returncode == 127 and "not found" in res.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_timeout_kills_the_whole_tree(engine, workspace):
    with _sandbox(workspace) as sb:
        t0 = time.monotonic()
        res = sb.exec(["sh", "-c", "echo started; sleep 100 & (setsid sleep 101 &); env -i sleep 102 & sleep 103"],
                      timeout=2)
        assert res.timed_out and not res.ok
        assert time.monotonic() - t0 < 15
        assert "started" in res.stdout
        left = sb.exec(["sh", "-c", "cat /proc/[0-9]*/comm 2>/dev/null"]).stdout.split()
        assert "sleep" not in left, left
        # a command that closes its output still runs to the end (and is bounded by the timeout)
        res = sb.exec(["sh", "-c", "exec >/dev/null 2>&1; sleep 0.5; touch late"], timeout=20)
        assert res.ok and sb.read_file(f"{TARGET}/late") == b""
        res = sb.exec(["sh", "-c", "exec >/dev/null 2>&1; sleep 100"], timeout=1)
        assert res.timed_out
        assert sb.exec(["true"]).ok  # the sandbox still works afterwards


def test_runs_unprivileged(engine, workspace):
    with _sandbox(workspace) as sb:
        expected = str(sb.uid)
        assert sb.uid != 0 and (sb.uid >= 2_000_000_000 or os.geteuid() != 0)
        assert sb.exec(["id", "-u"]).stdout.strip() == expected
        assert sb.exec(["sh", "-c", "touch new.txt && stat -c %u new.txt"]).stdout.strip() == expected
    assert (workspace / "new.txt").stat().st_uid == os.geteuid()  # handed back on close
    with _sandbox(workspace, host_ids=(2_100_000_777, 2_100_000_778)) as sb:
        assert sb.exec(["sh", "-c", "id -u; id -g"]).stdout.split() == ["2100000777", "2100000778"]
    with pytest.raises(SandboxError, match="bwrap backend"):  # root inside a container is host root
        with _sandbox(workspace, unprivileged=False):
            pass
    if os.geteuid() == 0:
        import pwd

        account = next(u.pw_uid for u in pwd.getpwall() if u.pw_uid != 0)
        for ids in ((0, 0), (account, account)):  # host root, a real account of this host
            with pytest.raises(SandboxError, match="host root or a user of this host"):
                with _sandbox(workspace, host_ids=ids):
                    pass


def test_limits_are_enforced_and_reported(engine, workspace):
    limits = SandboxLimits(memory_mb=128, max_procs=32, cpu_s=5, open_files=256)
    with _sandbox(workspace, limits=limits) as sb:
        assert set(sb.enforced_limits) | set(sb.unenforced_limits) == {"memory_mb", "max_procs", "cpu_s", "open_files",
                                                                      "disk_mb", "cpus", "inodes"}
        assert not set(sb.enforced_limits) & set(sb.unenforced_limits)
        assert sb.exec(["sh", "-c", "ulimit -n; ulimit -t"]).stdout.split() == ["256", "5"]
        if "memory_mb" in sb.enforced_limits:
            code = "b = bytearray(512 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('survived')"
            res = sb.exec(["python3", "-c", code], timeout=60)
            assert not res.ok and "survived" not in res.stdout, res
        if "max_procs" in sb.enforced_limits:
            res = sb.exec(["sh", "-c", "for i in $(seq 60); do sleep 5 & done; wait; echo done"], timeout=30)
            assert not res.ok and "fork" in res.stderr.lower(), res
        res = sb.exec(["python3", "-c", "while True: pass"], timeout=60)  # RLIMIT_CPU ends it
        assert not res.timed_out and res.returncode != 0
        assert sb.exec(["true"]).ok  # the container survived all of it


def test_output_is_bounded(engine, workspace):
    with _sandbox(workspace, max_output_bytes=1000) as sb:
        code = "import sys; sys.stdout.write('x' * 100000 + 'END'); sys.stderr.write('e' * 5000)"
        res = sb.exec(["python3", "-c", code])
        assert res.ok
        assert res.stdout.endswith("x" * 997 + "END") and "bytes dropped" in res.stdout
        assert len(res.stdout) < 1100 and len(res.stderr) < 1100
        big = sb.exec(["sh", "-c", "head -c 3000000 /dev/zero > /tmp/big"])
        assert big.ok and len(sb.read_file("/tmp/big")) == 3000000  # file reads are never cut


def test_read_and_write_files_as_the_sandbox_sees_them(engine, workspace):
    with _sandbox(workspace) as sb:
        sb.write_file(f"{TARGET}/sub/dir/a.sh", "#!/bin/sh\necho ran $1\n", mode=0o755)
        assert sb.exec(["sub/dir/a.sh", "ok"]).stdout == "ran ok\n"
        # symlinks resolve as inside: /root is the private HOME, not the host's
        assert sb.exec(["sh", "-c", "echo inner > ~/s.txt; ln -s /root/s.txt link2; ln -s /etc/shadow link3"]).ok
        assert sb.read_file(f"{TARGET}/link2") == b"inner\n"
        for bad in ("/proc/1/environ", "/run/x", "relative/path", "/etc/shadow", f"{TARGET}/link3"):
            with pytest.raises(SandboxError):
                sb.read_file(bad)
        assert sb.read_file("/etc/hostname").strip() == b"sandbox"
        with pytest.raises(SandboxError, match="read-only|Read-only"):
            sb.write_file("/etc/clawgym-probe", "x")
        if not PROJECT.is_relative_to("/tmp"):  # a checkout under /tmp lands in the sandbox's own private /tmp
            with pytest.raises(SandboxError):
                sb.write_file(f"{PROJECT}/clawgym-probe", "x")
        else:
            sb.write_file(f"{PROJECT}/clawgym-probe", "x")  # inside only: the host check below must still hold
        if Path("/etc/shadow").exists():
            assert "root:" not in sb.exec(["cat", "/etc/shadow"]).stdout
    assert not (PROJECT / "clawgym-probe").exists() and not Path("/etc/clawgym-probe").exists()
    assert (workspace / "sub/dir/a.sh").stat().st_mode & 0o777 == 0o755


def test_cleanup_removes_container_and_dirs(engine, workspace):
    import docker

    sb = _sandbox(workspace)
    with sb:
        sb.exec(["sh", "-c", "echo x > /tmp/x; echo y > ~/y; sleep 1000 &"])
        cid, state = sb.container_id, sb.root
        assert cid and state is not None
        if os.geteuid() == 0:  # HOME and the workspace are reachable only through the container
            assert not state.exists()
    assert not state.exists() and sb.root is None
    client = docker.from_env()
    try:
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(cid)
    finally:
        client.close()
    sb.close()  # idempotent
    with pytest.raises(SandboxError):
        sb.exec(["true"])


def test_failed_start_leaves_nothing(engine, workspace, tmp_path):
    import docker

    roots = tmp_path / "roots"
    roots.mkdir()
    client = docker.from_env()
    label = {"label": "org.clawgym.sandbox"}
    before = {c.id for c in client.containers.list(all=True, filters=label)}
    with pytest.raises(SandboxError, match="proxy socket"):
        with _sandbox(workspace, proxy_socket=tmp_path / "missing.sock", tmp_root=roots):
            pass
    with pytest.raises(SandboxError, match="does not exist"):
        with _sandbox(tmp_path / "no-such-workspace", tmp_root=roots):
            pass
    # a failure after the container exists (its pid 1 cannot start) must remove it as well
    broken = _sandbox(workspace, tmp_root=roots)
    broken._py = "/nonexistent/python3"
    with pytest.raises(SandboxError):
        with broken:
            pass
    assert broken.container_id is not None
    after = {c.id for c in client.containers.list(all=True, filters=label)}
    client.close()
    assert after == before
    assert list(roots.iterdir()) == []
    assert (workspace / "input.txt").stat().st_uid == os.geteuid()


def test_project_python_works_inside(engine, workspace):
    with _sandbox(workspace) as sb:
        res = sb.exec(["python3", "-c", "import openai; print('imports ok')"], timeout=120)
        assert res.ok, res.stderr[-2000:]
        assert res.stdout.strip() == "imports ok"
        for ours in ("clawgym_env.episodes.run", "tasks.suites"):  # our own packages (answer keys) are never visible
            res = sb.exec(["python3", "-c", f"import {ours}"], timeout=120)
            assert res.returncode != 0 and "ModuleNotFoundError" in res.stderr, res


def test_no_engine_gives_a_clear_error(monkeypatch, workspace):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxError, match="scripts/dockerd.sh start"):
        with _sandbox(workspace):
            pass


def test_whole_episode_runs_through_docker(engine, tmp_path):
    from clawgym_env.envs.runtime import Runtime
    from clawgym_env.plugins import make_harness
    from tasks import load_suite

    task = load_suite("builtin").tasks[0]
    with Runtime("scripted:expert", sandbox="docker", out_dir=tmp_path) as rt:
        rec = rt.run(task, make_harness("mini")).record
    assert rec.status == "ok" and rec.reward == 1.0, (rec.task_id, rec.error, rec.logs)
    assert rec.num_calls >= 1


def test_runtime_is_chosen_per_sandbox_and_an_unknown_one_is_a_clear_error(engine, workspace, monkeypatch):
    """The OCI runtime is the plug for a stronger boundary (gVisor's ``runsc``): it reaches the engine."""
    import docker

    with _sandbox(workspace, runtime="runc") as sb:
        assert sb.exec(["true"]).ok
        info = docker.from_env().api.inspect_container(sb.container_id)
        assert info["HostConfig"]["Runtime"] == "runc"
    monkeypatch.setenv("CLAWGYM_DOCKER_RUNTIME", "clawgym-no-such-runtime")
    with pytest.raises(SandboxError, match="clawgym-no-such-runtime"):
        with _sandbox(workspace):
            pass


# ---- the pool of warm containers ------------------------------------------------------------------

def _wait_warm(pool, spec, n: int, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while pool.warm_count(spec) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.warm_count(spec) >= n, pool.stats


@pytest.mark.slow
def test_pool_hands_each_warm_container_out_once_and_destroys_it_after(engine, tmp_path):
    import docker

    from clawgym_env.sandbox.docker.pool import DockerPool

    sock_path = tmp_path / "proxy" / "proxy.sock"
    sock_path.parent.mkdir()
    server = _UnixHTTPServer(str(sock_path), _Pong)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = docker.from_env()
    seen: list[str] = []
    code = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:18124/ep/y/v1').read().decode())"
    try:
        with DockerPool(2) as pool:
            for i in range(3):
                ws = tmp_path / f"ws{i}"
                ws.mkdir()
                (ws / "input.txt").write_text(f"episode {i}\n")
                spec = SandboxSpec(workspace_host=ws, proxy_socket=sock_path, proxy_port=18124)
                if i == 0:
                    pool.prewarm(spec)
                _wait_warm(pool, spec, 1)
                with get_backend(pool.name)(spec) as sb:
                    cid = getattr(sb, "container_id", None)
                    assert cid is not None and cid not in seen  # a started container, never reused
                    seen.append(cid)
                    res = sb.exec(["sh", "-c", "cat input.txt; ls; echo done > out.txt"])
                    assert res.ok and res.stdout.split() == ["episode", str(i), "input.txt"], res
                    res = sb.exec(["python3", "-c", code], timeout=30)
                    assert res.ok and res.stdout.strip() == "pong /ep/y/v1", res
                assert (ws / "out.txt").read_text() == "done\n"
                with pytest.raises(docker.errors.NotFound):
                    client.containers.get(seen[-1])
            assert pool.stats.hits == 3 and pool.stats.misses == 0, pool.stats
            other = SandboxSpec(workspace_host=tmp_path / "ws0", limits=SandboxLimits(memory_mb=1024))
            with get_backend(pool.name)(other) as sb:  # another shape: a cold sandbox, then warmed
                assert type(sb).__name__ == "DockerSandbox" and sb.exec(["true"]).ok
            assert pool.stats.misses == 1
            _wait_warm(pool, other, 2)
            warm = [sb.container_id for sbs in pool._warm.values() for sb in sbs]
            assert len(warm) == 4
        for cid in warm:  # closing the pool destroys its warm containers
            with pytest.raises(docker.errors.NotFound):
                client.containers.get(cid)
        with pytest.raises(SandboxError, match="no open Docker sandbox pool"):
            get_backend(pool.name)
    finally:
        client.close()
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_runtime_with_a_sandbox_pool_runs_whole_episodes(engine, tmp_path):
    from clawgym_env.envs.runtime import RolloutPool, Runtime
    from clawgym_env.testing import EchoHarness, EchoScriptPolicy, echo_suite

    suite = echo_suite(tmp_path / "suite")
    with Runtime(EchoScriptPolicy(), sandbox="docker", sandbox_pool=2, out_dir=tmp_path / "eps") as rt:
        results = RolloutPool(rt, concurrency=2, progress=False).run(suite.tasks, EchoHarness(client="http"),
                                                                    samples=2)
        stats = rt._pool.stats if rt._pool is not None else None
    assert [r.record.reward for r in results] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0], [r.record for r in results]
    assert [r.record.status for r in results[:4]] == ["ok"] * 4
    assert stats is not None and stats.hits > 0, stats
