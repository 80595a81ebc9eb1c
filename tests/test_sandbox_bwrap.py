"""The bubblewrap sandbox, against the real ``bwrap`` (no mocks): isolation, persistence, relay, limits.

Every test skips (with the reason) where bwrap cannot run here.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import socketserver
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox.base import SandboxLimits, SandboxSpec
from clawgym_env.sandbox.bwrap import run as bwrap_run
from clawgym_env.sandbox.bwrap.sandbox import BwrapSandbox, check_bwrap

try:
    check_bwrap(True)
except SandboxError as _e:
    pytest.skip(str(_e), allow_module_level=True)

TARGET = "/root/.openclaw/workspace"
PY = ["python3", "-c"]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def roots():
    """Host folder under which sandboxes create their private HOME and /tmp (enterable by the
    sandbox uids: pytest's own temp folder is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="cg-roots-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ws(tmp_path):
    d = tmp_path / "ws"
    d.mkdir()
    return d


def make(ws, roots, **kw) -> BwrapSandbox:
    opts = {k: kw.pop(k) for k in ("max_output_bytes", "use_cgroups") if k in kw}
    return BwrapSandbox(SandboxSpec(workspace_host=ws, workspace_target=TARGET, **kw), tmp_root=roots, **opts)


def alive_with(marker: str) -> list[int]:
    """Pids (other than ours) whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_exec_sees_workspace_and_files_persist(ws, roots):
    (ws / "hello.txt").write_text("from host")
    with make(ws, roots) as sb:
        r = sb.exec(["sh", "-c", "pwd; cat hello.txt"])
        assert r.ok, r
        assert r.stdout == f"{TARGET}\nfrom host"
        assert sb.exec(["sh", "-c", "echo a > ~/h.txt; echo b > /tmp/t.txt; echo c > out.txt"]).ok
        r = sb.exec(["sh", "-c", "cat ~/h.txt /tmp/t.txt out.txt"])
        assert r.stdout == "a\nb\nc\n"
        assert sb.read_file("/root/h.txt") == b"a\n" and sb.read_file("/tmp/t.txt") == b"b\n"
    out = ws / "out.txt"
    assert out.read_text() == "c\n"
    out.unlink()  # the host can still delete what the sandbox user wrote


def test_runs_as_uid_1000_with_private_home(ws, roots):
    with make(ws, roots) as sb:
        r = sb.exec(["sh", "-c", "id -u; id -g; stat -c %u ~ /tmp .; echo $HOME $TMPDIR $LANG; touch ~/x"])
        assert r.ok, r
        assert r.stdout.split() == ["1000", "1000", "1000", "1000", "1000", "/root", "/tmp", "C.UTF-8"]
    with make(ws, roots, unprivileged=False) as sb:
        assert sb.exec(["id", "-u"]).stdout.strip() == "0"  # root inside (a user namespace if not root here)


def test_toolchain_is_visible_read_only_and_the_project_is_not(ws, roots):
    import clawgym_env

    project = Path(clawgym_env.__file__).resolve().parent.parent
    with make(ws, roots) as sb:
        r = sb.exec(PY + ["import openai, sys; print(sys.version_info[0])"])
        assert r.ok and r.stdout.strip() == "3", r
        r = sb.exec(PY + ["import clawgym_env"])  # the project tree (tasks' answers) is not mounted
        assert not r.ok and "ModuleNotFoundError" in r.stderr, r
        assert not sb.exec(["ls", str(project)]).ok
        for target in ("/usr/clawgym-probe", "/clawgym-probe", "/etc/clawgym-probe"):
            r = sb.exec(["sh", "-c", f"echo x > {target}"])
            assert not r.ok and "Read-only file system" in r.stderr, (target, r)
        with pytest.raises(SandboxError, match="read-only"):
            sb.write_file("/usr/clawgym-probe", "x")
    assert not Path("/usr/clawgym-probe").exists()


def test_host_files_outside_the_mounts_are_invisible(ws, roots):
    secret_dir = Path(tempfile.mkdtemp(prefix="clawgym-secret-"))
    try:
        marker = secret_dir / "marker.txt"
        marker.write_text("host secret")
        with make(ws, roots) as sb:
            assert not any(str(marker).startswith(str(p) + "/") for p in sb.spec.ro_paths)
            r = sb.exec(["cat", str(marker)])
            assert not r.ok and "host secret" not in r.stdout
            # a symlink inside the workspace pointing at the host path must not leak it either
            assert sb.exec(["ln", "-s", str(marker), "link"]).ok
            with pytest.raises(SandboxError):
                sb.read_file(f"{TARGET}/link")
            # symlinks resolve as the sandbox sees them: /root is the private HOME, not the host's
            assert sb.exec(["sh", "-c", "echo inner > ~/s.txt; ln -s /root/s.txt link2"]).ok
            assert sb.read_file(f"{TARGET}/link2") == b"inner\n"
            # root-only host files under the read-only binds stay unreadable (not root, or masked)
            if Path("/etc/shadow").exists():
                assert "root:" not in sb.exec(["cat", "/etc/shadow"]).stdout
                try:
                    assert b"root:" not in sb.read_file("/etc/shadow")
                except SandboxError as e:
                    assert "may not read" in str(e)
            for bad in ("/proc/1/environ", "/run/x", "relative/path"):
                with pytest.raises(SandboxError):
                    sb.read_file(bad)
    finally:
        marker.unlink()
        secret_dir.rmdir()


def test_write_file_and_stdin(ws, roots):
    with make(ws, roots) as sb:
        sb.write_file(f"{TARGET}/sub/dir/a.sh", "#!/bin/sh\necho ran $1\n", mode=0o755)
        sb.write_file("/tmp/b.bin", b"\x00\x01")
        assert sb.exec(["sub/dir/a.sh", "ok"]).stdout == "ran ok\n"
        assert sb.exec(["wc", "-c", "/tmp/b.bin"]).stdout.split()[0] == "2"
        assert sb.exec(["cat"], stdin=b"piped " * 50000).stdout == "piped " * 50000
    assert (ws / "sub/dir/a.sh").stat().st_mode & 0o777 == 0o755


def test_clean_environment(ws, roots, monkeypatch):
    monkeypatch.setenv("CLAWGYM_HOST_ONLY", "leak")
    with make(ws, roots, env={"FROM_SPEC": "1"}) as sb:
        r = sb.exec(["env"], env={"FROM_EXEC": "2"})
        env = dict(line.split("=", 1) for line in r.stdout.splitlines())
        assert "CLAWGYM_HOST_ONLY" not in env
        assert env["FROM_SPEC"] == "1" and env["FROM_EXEC"] == "2" and env["HOME"] == "/root"
        assert "/usr/local/bin" in env["PATH"].split(":")


def test_no_network_to_host_tcp(ws, roots):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    try:
        with make(ws, roots) as sb:
            code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
                    "    print('connected')\nexcept OSError as e:\n    print('blocked', type(e).__name__)")
            r = sb.exec(PY + [code])
            assert r.stdout.startswith("blocked"), r
            r = sb.exec(["cat", "/proc/net/dev"])
            ifaces = {line.split(":")[0].strip() for line in r.stdout.splitlines()[2:]}
            assert ifaces == {"lo"}
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"proxied {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self):
        return "unix"

    def log_message(self, *args):
        pass


class _UnixHTTP(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def proxy_socket():
    d = Path(tempfile.mkdtemp(prefix="cg-px-"))
    sock = d / "proxy.sock"
    server = _UnixHTTP(str(sock), _Hello)
    sock.chmod(0o666)  # as the proxy does: sandboxes run as other uids
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield sock
    server.shutdown()
    server.server_close()
    sock.unlink(missing_ok=True)
    d.rmdir()


def test_proxy_relay_reaches_the_host_unix_socket(ws, roots, proxy_socket):
    with make(ws, roots, proxy_socket=proxy_socket, proxy_port=18123) as sb:
        code = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:18123/v1/ping').read().decode())"
        r = sb.exec(PY + [code])
        assert r.ok, r
        assert r.stdout.strip() == "proxied /v1/ping"
        assert sb.exec(["sh", "-c", "exit 7"]).returncode == 7
        r = sb.exec(["no-such-command-xyz"])
        assert r.returncode == 127 and "not found" in r.stderr


def test_timeout_kills_the_whole_tree(ws, roots):
    marker = f"cg-marker-{uuid.uuid4().hex}"
    with make(ws, roots) as sb:
        t0 = time.monotonic()
        r = sb.exec(["sh", "-c", f"(sleep 100; echo {marker}-child) & sleep 100; echo {marker}"], timeout=1.0)
        assert r.timed_out and not r.ok
        assert time.monotonic() - t0 < 15
        deadline = time.monotonic() + 5
        while alive_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive_with(marker) == []
        # a command that closes its output still runs to the end (and is bounded by the timeout)
        r = sb.exec(["sh", "-c", "exec >/dev/null 2>&1; sleep 0.5; touch late"], timeout=20)
        assert r.ok and (sb.read_file(f"{TARGET}/late") == b"")
        r = sb.exec(["sh", "-c", f"exec >/dev/null 2>&1; sleep 100; echo {marker}"], timeout=0.5)
        assert r.timed_out


def test_timeout_with_relay_kills_the_tree(ws, roots, proxy_socket):
    marker = f"cg-marker-{uuid.uuid4().hex}"
    with make(ws, roots, proxy_socket=proxy_socket) as sb:
        r = sb.exec(["sh", "-c", f"sleep 100; echo {marker}"], timeout=1.0)
        assert r.timed_out
        deadline = time.monotonic() + 5
        while alive_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive_with(marker) == []


def test_output_is_bounded(ws, roots):
    with make(ws, roots, max_output_bytes=1000) as sb:
        r = sb.exec(PY + ["import sys; sys.stdout.write('x' * 100000 + 'END'); sys.stderr.write('e' * 5000)"])
        assert r.ok
        assert r.stdout.endswith("x" * 997 + "END") and "bytes dropped" in r.stdout
        assert len(r.stdout) < 1100 and len(r.stderr) < 1100


def test_limits_are_recorded_and_memory_is_enforced(ws, roots):
    limits = SandboxLimits(memory_mb=128, max_procs=32, cpu_s=30, open_files=256, cpus=1.5)
    alloc = PY + ["b = bytearray(512 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('survived')"]
    for use_cgroups in (True, False):
        with make(ws, roots, limits=limits, use_cgroups=use_cgroups) as sb:
            every = {"memory_mb", "max_procs", "cpu_s", "open_files", "disk_mb", "cpus", "inodes"}
            assert set(sb.enforced_limits) | set(sb.unenforced_limits) == every
            assert not set(sb.enforced_limits) & set(sb.unenforced_limits)
            assert sb.exec(["sh", "-c", "ulimit -n"]).stdout.strip() == "256"
            r = sb.exec(alloc)
            assert not r.ok and "survived" not in r.stdout, (sb.enforced_limits, r)
            if "max_procs" in sb.enforced_limits:
                r = sb.exec(["sh", "-c", "for i in $(seq 60); do sleep 5 & done; wait; echo done"], timeout=30)
                assert not r.ok and "fork" in r.stderr.lower(), r
            if not use_cgroups:
                assert sb.enforced_limits["memory_mb"].startswith("RLIMIT_DATA")
                assert "max_procs" in sb.unenforced_limits


def test_close_removes_everything_and_is_idempotent(ws, roots):
    sb = make(ws, roots)
    with sb:
        root = sb.root
        cgroups = list(sb._cgroup.dirs)
        assert root is not None and (root / "home").is_dir()
        sb.exec(["sh", "-c", "echo x > ~/f; echo y > /tmp/g"])
    assert not root.exists() and list(roots.iterdir()) == []
    assert all(not d.exists() for d in cgroups)
    sb.close()
    with pytest.raises(SandboxError):
        sb.exec(["true"])
    assert (ws).is_dir()


def test_failed_start_leaves_nothing(tmp_path, roots):
    with pytest.raises(SandboxError, match="does not exist"):
        with make(tmp_path / "missing", roots):
            pass
    with pytest.raises(SandboxError, match="proxy socket"):
        with make(tmp_path, roots, proxy_socket=tmp_path / "no.sock"):
            pass
    assert list(roots.iterdir()) == []


def test_missing_bwrap_says_how_to_fix(monkeypatch):
    monkeypatch.setattr(bwrap_run, "_probe_cache", {})
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        check_bwrap(True)


def test_hidden_package_folders_are_masked_under_a_visible_prefix(ws, roots):
    """As in a non-editable install: our packages sit in site-packages, under the visible prefix."""
    prefix = Path(tempfile.mkdtemp(prefix="cg-prefix-"))
    try:
        prefix.chmod(0o755)
        pkg = prefix / "site-packages" / "tasks" / "builtin" / "t1"
        pkg.mkdir(parents=True)
        (pkg / "expert.json").write_text('{"answer": 42}')
        agent = prefix / "site-packages" / "tasks" / "agent.py"
        agent.write_text("print('agent ok')")
        for d in [prefix / "site-packages", *pkg.parents][:4]:
            d.chmod(0o755)
        spec_kw = dict(ro_paths=[Path("/usr"), Path("/bin"), Path("/lib"), Path("/lib64"), prefix, agent],
                       hidden_paths=[prefix / "site-packages" / "tasks"])
        with make(ws, roots, **spec_kw) as sb:
            r = sb.exec(["sh", "-c", f"ls -A {prefix}/site-packages/tasks; find {prefix} -name expert.json"])
            assert r.ok and "expert.json" not in r.stdout and "builtin" not in r.stdout, r
            assert sb.exec(["sh", "-c", f"echo x > {prefix}/site-packages/tasks/x"]).returncode != 0
            assert sb.exec(["cat", str(agent)]).stdout == "print('agent ok')"  # a file bound on top still shows
            assert sb.exec(["ls", str(prefix / "site-packages")]).stdout.split() == ["tasks"]
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
