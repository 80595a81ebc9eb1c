"""The bwrap sandbox's proxy relay held once per sandbox (as root): every exec joins its network namespace.

Against the real ``bwrap``; skips (with the reason) where either cannot run, or when not
root (then each exec starts its own relay, covered by ``test_sandbox_bwrap.py``).
"""

from __future__ import annotations

import http.server
import shutil
import socketserver
import tempfile
import threading
from pathlib import Path

import pytest

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox.base import SandboxSpec
from clawgym_env.sandbox.bwrap.relay import holder_possible
from clawgym_env.sandbox.bwrap.sandbox import BwrapSandbox, check_bwrap

try:
    check_bwrap(True)
except SandboxError as _e:
    pytest.skip(str(_e), allow_module_level=True)
if not holder_possible():
    pytest.skip("the relay is held per sandbox only as root (setns)", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)
PORT = 18124
FETCH = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{PORT}/v1/ping').read().decode())"


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"proxied {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, *args: object) -> None:
        pass


class _UnixHTTP(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def sandbox(tmp_path):
    """A root sandbox with a proxy socket (an HTTP server on a unix socket) and its private roots."""
    roots = Path(tempfile.mkdtemp(prefix="cg-roots-"))
    roots.chmod(0o711)
    sock_dir = Path(tempfile.mkdtemp(prefix="cg-px-"))
    sock = sock_dir / "proxy.sock"
    server = _UnixHTTP(str(sock), _Hello)
    sock.chmod(0o666)  # as the proxy does: sandboxes run as other uids
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        with BwrapSandbox(SandboxSpec(workspace_host=ws, proxy_socket=sock, proxy_port=PORT), tmp_root=roots) as sb:
            yield sb
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(sock_dir, ignore_errors=True)
        shutil.rmtree(roots, ignore_errors=True)


def test_execs_share_the_held_relay_and_start_none_of_their_own(sandbox):
    sb = sandbox
    cmd = sb.command(["true"])  # by hand: nsenter into the holder's namespace, then bwrap keeping it
    assert "--share-net" in cmd and "--net=/proc/" in cmd[1] and "relay.py" not in " ".join(cmd[-3:])
    first = sb.exec(["readlink", "/proc/self/ns/net"])
    second = sb.exec(["readlink", "/proc/self/ns/net"])
    assert first.ok and first.stdout == second.stdout
    assert first.stdout.strip() == f"net:[{sb._holders[0].netns_inode}]"
    procs = sb.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
    assert procs.ok and "/run/clawgym/proxy.sock" in procs.stdout  # bwrap's own command line: the socket's bind
    assert "-S /run/clawgym/relay.py" not in procs.stdout  # no relay among the exec's own processes
    for _ in range(2):
        r = sb.exec(["python3", "-c", FETCH])
        assert r.ok and r.stdout.strip() == "proxied /v1/ping", r
    ifaces = sb.exec(["cat", "/proc/net/dev"]).stdout.splitlines()[2:]
    assert {line.split(":")[0].strip() for line in ifaces} == {"lo"}  # loopback only, as an exec's own


def test_a_holder_that_died_is_restarted(sandbox):
    sb = sandbox
    holder = sb._holders[0]
    assert sb.exec(["python3", "-c", FETCH]).stdout.strip() == "proxied /v1/ping"
    before = holder.netns_inode
    assert holder.proc is not None
    holder.proc.kill()  # bwrap's monitor: --die-with-parent takes the relay with it
    holder.proc.wait()
    r = sb.exec(["python3", "-c", FETCH])
    assert r.ok and r.stdout.strip() == "proxied /v1/ping", r
    assert holder.netns_inode != before


def test_a_command_that_cannot_be_found_exits_127(sandbox):
    r = sandbox.exec(["no-such-command-xyz"])
    assert r.returncode == 127 and "not found" in r.stderr
    assert sandbox.exec(["sh", "-c", "exit 7"]).returncode == 7
