"""Attacks run by a scripted agent from inside one real episode (mini harness, bwrap sandbox, proxy):
the network beyond the proxy, writes outside the workspace, fork and memory bombs, a huge output,
processes left behind, and links / special files left in the final workspace.

Each attack runs as one tool call; what the agent saw comes back to the (scripted) model in the next
call's request, so the test reads the outcome of every probe from the captured calls, and then checks
the host: the canaries got no connection, nothing was written outside, no process survived, the kept
workspace holds no host file's content, and the episode ended with exactly one record.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from clawgym_env.envs.runtime import Runtime
from clawgym_env.plugins import make_harness

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

NET_PROBE = r"""
import socket
def tcp(family, addr):
    s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(2)
    try:
        s.connect(addr); return "connected"
    except OSError as e:
        return type(e).__name__
def abstract(name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(2)
    try:
        s.connect(name); return "connected"
    except OSError as e:
        return type(e).__name__
print("NET_TCP4=" + tcp(socket.AF_INET, ("127.0.0.1", PORT)))
print("NET_TCP6=" + tcp(socket.AF_INET6, ("::1", PORT6)))
print("NET_ABSTRACT=" + abstract(b"\0" + b"@@NAME@@"))
try:
    socket.getaddrinfo("example.com", 443); print("NET_DNS=resolved")
except OSError as e:
    print("NET_DNS=" + type(e).__name__)
"""

FORK_PROBE = r"""
import os, signal, time
kids = []
for i in range(1500):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30); os._exit(0)
    kids.append(pid)
print(f"FORKED={len(kids)}")
for k in kids:
    os.kill(k, signal.SIGKILL)
for k in kids:
    os.waitpid(k, 0)
"""


class _Canary:
    """A host listener that counts the connections it accepts (TCP v4 or v6, or an abstract socket)."""

    def __init__(self, family: int, addr) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(addr)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def _script(tmp_path: Path, steps: list[str]) -> str:
    path = tmp_path / "attacks.json"
    path.write_text(json.dumps({"steps": [*({"tool": "bash", "command": c} for c in steps), {"final": "done"}]}))
    return f"scripted:file:{path}"


def _tool_outputs(res) -> str:
    """What the tools printed, as the harness sent it back to the model (never the commands themselves)."""
    if not res.calls:
        return ""
    messages = res.calls[-1].request.get("messages") or []
    return "\n".join(str(m.get("content")) for m in messages if m.get("role") == "tool")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_attacks_from_inside_an_episode_fail_and_change_nothing_outside(builtin_suite, tmp_path):
    marker = uuid.uuid4().hex
    v4 = _Canary(socket.AF_INET, ("127.0.0.1", 0))
    v6 = _Canary(socket.AF_INET6, ("::1", 0))
    abstract = _Canary(socket.AF_UNIX, b"\0clawgym-canary-" + marker.encode())
    outside = [Path(p) / f"clawgym-escape-{marker}" for p in ("/etc", "/usr", "/", "/var/tmp", "/opt")]
    # (HOME and /tmp inside are the sandbox's own private places: writable there, invisible here)
    private = [Path(p) / f"clawgym-escape-{marker}" for p in (str(Path.home()), "/tmp")]
    probe = (NET_PROBE.replace("PORT6", str(v6.port)).replace("PORT", str(v4.port))
             .replace("@@NAME@@", f"clawgym-canary-{marker}"))
    steps = [
        f"python3 - <<'EOF'\n{probe}EOF",
        " ; ".join(f"touch {p} 2>/dev/null && echo WROTE_{i}=yes || echo WROTE_{i}=no"
                   for i, p in enumerate(outside + private)),
        f"python3 - <<'EOF'\n{FORK_PROBE}EOF",
        "python3 -c \"x = b'x' * (6 << 30); print('MEMORY' + '=allocated', len(x))\"; echo MEMORY_RC=$?",
        "head -c 300000000 /dev/zero | tr '\\0' 'a'; echo; echo HUGE_DONE",
        f"setsid nohup sleep 600 {marker} >/dev/null 2>&1 & "
        f"(setsid sh -c 'sleep 600; echo {marker}' >/dev/null 2>&1 &) ; echo LEFT_BEHIND=started",
        "ln -s /etc/shadow leak_shadow; ln -s / leak_root; mkfifo pipe; "
        "python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.bind('sock')\"; "
        "printf 'x' > $(printf 'bad\\377name'); echo LEFT_FILES=yes",
    ]
    try:
        with Runtime(_script(tmp_path, steps), out_dir=tmp_path / "eps") as rt:
            before_rss = _rss_mb()  # policy, tokenizer and proxy loaded
            res = rt.run(builtin_suite.get("write_greeting"), make_harness("mini"), keep_workspace=True)
    finally:
        for c in (v4, v6, abstract):
            c.close()
    rec = res.record
    seen = _tool_outputs(res)
    # exactly one record, the agent's own outcome (it did not solve the task), every attack ran
    assert (tmp_path / "eps" / rec.episode_id / "episode.json").exists()
    assert rec.is_task_outcome, (rec.status, rec.error)
    for mark in ("NET_TCP4=", "WROTE_0=", "FORKED=", "MEMORY_RC=", "HUGE_DONE", "LEFT_BEHIND=", "LEFT_FILES="):
        assert mark in seen, (mark, rec.status, rec.error, rec.logs.get("stderr", "")[-2000:])
    # network: nothing but the proxy; the host canaries were never reached
    for probe_name in ("NET_TCP4", "NET_TCP6", "NET_ABSTRACT"):
        assert f"{probe_name}=connected" not in seen
    assert "NET_DNS=resolved" not in seen
    assert (v4.accepted, v6.accepted, abstract.accepted) == (0, 0, 0)
    # writes outside the workspace: refused, and nothing appeared on the host
    assert all(f"WROTE_{i}=no" in seen for i in range(len(outside)))
    assert all(f"WROTE_{len(outside) + i}=yes" in seen for i in range(len(private)))
    assert not [p for p in outside + private if p.exists()]
    # fork bomb: capped by the sandbox's process limit; memory bomb: killed or refused inside
    forked = int(seen.split("FORKED=")[1].split()[0])
    assert forked < 1500
    assert "MEMORY=allocated" not in seen
    # a huge output neither crashed the harness nor grew this process by its size
    assert _rss_mb() - before_rss < 250
    # no process outlives the episode
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert marker not in ps
    # the final workspace: links kept as links (never followed), special files dropped, odd names fine
    ws = tmp_path / "eps" / rec.episode_id / "workspace"
    assert os.readlink(ws / "leak_shadow") == "/etc/shadow" and os.readlink(ws / "leak_root") == "/"
    assert not (ws / "pipe").exists() and not (ws / "sock").exists()
    assert (ws / os.fsdecode(b"bad\xffname")).read_bytes() == b"x"
    for p in ws.iterdir():
        if p.is_file() and not p.is_symlink():
            assert b"root:" not in p.read_bytes()
