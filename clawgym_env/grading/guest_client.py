"""``clawgym_guest``: how a task's check runs the agent's code with fewer rights than itself.

This file is installed, as ``clawgym_guest.py``, next to the grader's ``sitecustomize`` in every grading
sandbox (it is on the verifier's ``PYTHONPATH``); it needs only the standard library. A check that executes
code the agent wrote (its tests, its scripts, its functions) must do it through this module, never with
``subprocess`` directly:

* :func:`run` runs a command in a **guest sandbox**: a fresh sandbox of its own, as another host user, over a
  copy of the agent's final workspace (the files the task protects already restored, plus the ``files`` the
  check passes, e.g. hidden tests), without the task's ``reward/`` folder, without the verifier's processes
  in sight. What comes back is data: exit status, output tails, and the files the check asks to ``collect``.
  Nothing the guest does changes the verifier's workspace, its files, or the channel its result goes out on.
* :func:`python_result` runs a Python program in the guest and returns the value it passed to ``report()``,
  or ``None`` when it never reported: an exit status is never trusted alone (``os._exit(0)`` in the agent's
  module produces no report). The program runs in a child process; the value comes back through a pipe to a
  parent that never imports the agent's code, holds the result's one-time tag only after the child started,
  and cannot be inspected by it (not dumpable).
* :func:`unittest_result` and :func:`evaluate` are the two common programs: run named ``unittest`` tests,
  or evaluate expressions after a setup, and return counts / JSON values for the check to judge.

Outside a grading sandbox (no ``CLAWGYM_GUEST_SOCKET``) every call raises ``RuntimeError`` naming the fix,
unless ``CLAWGYM_GUEST_LOCAL`` names a workspace folder: then, for writing and testing a check on one's own
machine, each command runs as a plain subprocess over a temporary copy of that folder, **with no isolation at
all** (never set it in a grader; the grading sandbox's environment is built from scratch without it).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: A JSON object on the guest's wire (``clawgym_env.jsontypes.JSONObject``, spelled out: this module runs in the
#: grader's sandbox with the standard library only, see the module doc).
JSONObject = dict[str, Any]
SOCKET_ENV = "CLAWGYM_GUEST_SOCKET"
LOCAL_ENV = "CLAWGYM_GUEST_LOCAL"
MAX_MESSAGE = 64 << 20
TAG = "CLAWGYM-RESULT"


@dataclass
class GuestResult:
    """One guest command: its exit status (128+N for signal N), output tails, whether its timeout killed
    it, the collected files (``None`` for one that was missing), and the broker's refusal, if any."""

    returncode: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    files: dict[str, bytes | None] = field(default_factory=dict)
    error: str | None = None


def send_message(sock: socket.socket, obj: Any) -> None:
    """Send ``obj`` as one length-prefixed JSON message (the broker's wire format, both ways)."""
    data = json.dumps(obj).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"guest request of {len(data)} bytes is over {MAX_MESSAGE}; pass fewer or smaller files")
    sock.sendall(struct.pack(">Q", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError("the guest broker closed the connection")
        buf += chunk
    return bytes(buf)


def recv_message(sock: socket.socket) -> Any:
    """Read one length-prefixed JSON message; ``ConnectionError`` when it ends early or is over the bound."""
    (n,) = struct.unpack(">Q", _recv_exact(sock, 8))
    if n > MAX_MESSAGE:
        raise ConnectionError(f"guest answer of {n} bytes is over {MAX_MESSAGE}")
    return json.loads(_recv_exact(sock, n))


def run(argv: Sequence[str], *, cwd: str | None = None, timeout: float = 60.0, stdin: bytes | str | None = None,
        files: Mapping[str, bytes | str] | None = None, collect: Sequence[str] = (),
        env: Mapping[str, str] | None = None) -> GuestResult:
    """Run ``argv`` in a guest sandbox over a copy of the agent's workspace (see the module doc).

    ``cwd``: a folder inside the workspace (default: the workspace). ``files``: workspace-relative path →
    content, written into the guest's copy first (hidden tests, pristine fixtures). ``collect``:
    workspace-relative paths read back after the command. The guest's timeout is also bounded by what is
    left of the verifier's own."""
    path = os.environ.get(SOCKET_ENV)
    if not path and os.environ.get(LOCAL_ENV):
        return _run_local(os.environ[LOCAL_ENV], argv, cwd, timeout, stdin, files, collect, env)
    if not path:
        raise RuntimeError(f"{SOCKET_ENV} is not set: clawgym_guest works inside a ClawGym grading sandbox; to try a "
                           f"check on your machine without isolation, set {LOCAL_ENV} to the workspace folder")
    raw_stdin = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
    req = {"argv": [str(a) for a in argv], "cwd": cwd, "timeout": float(timeout),
           "stdin": base64.b64encode(raw_stdin).decode(),
           "files": {str(k): base64.b64encode(v.encode() if isinstance(v, str) else v).decode()
                     for k, v in (files or {}).items()},
           "collect": [str(c) for c in collect], "env": {str(k): str(v) for k, v in (env or {}).items()}}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        send_message(sock, req)
        ans = recv_message(sock)
    return GuestResult(returncode=int(ans.get("returncode", -1)), stdout=ans.get("stdout", ""),
                       stderr=ans.get("stderr", ""), timed_out=bool(ans.get("timed_out")),
                       files={k: (None if v is None else base64.b64decode(v)) for k, v in ans.get("files", {}).items()},
                       error=ans.get("error"))


def _run_local(workspace: str, argv: Sequence[str], cwd: str | None, timeout: float, stdin: bytes | str | None,
               files: Mapping[str, bytes | str] | None, collect: Sequence[str],
               env: Mapping[str, str] | None) -> GuestResult:
    """:func:`run` without a sandbox (``CLAWGYM_GUEST_LOCAL``): a subprocess over a temporary copy."""
    import shutil
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="clawgym-guest-local-") as tmp:
        ws = os.path.join(tmp, "workspace")
        shutil.copytree(workspace, ws, symlinks=True, ignore=shutil.ignore_patterns("reward"))
        for rel, content in (files or {}).items():
            dest = os.path.join(ws, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(content.encode() if isinstance(content, str) else content)
        raw = stdin.encode() if isinstance(stdin, str) else stdin
        try:
            proc = subprocess.run(list(argv), cwd=os.path.join(ws, cwd or ""), input=raw or b"", capture_output=True,
                                  timeout=timeout, env={**os.environ, **(env or {})})
        except subprocess.TimeoutExpired as exc:
            return GuestResult(-9, (exc.stdout or b"").decode(errors="replace"),
                               (exc.stderr or b"").decode(errors="replace"), timed_out=True)
        got: dict[str, bytes | None] = {}
        for rel in collect:
            try:
                with open(os.path.join(ws, rel), "rb") as f:
                    got[rel] = f.read()
            except OSError:
                got[rel] = None
        return GuestResult(proc.returncode, proc.stdout.decode(errors="replace"),
                           proc.stderr.decode(errors="replace"), files=got)


RUNNER = r'''
import ctypes, json, os, sys
request = json.loads(sys.stdin.readline())
r, w = os.pipe()
try:
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the child cannot read this process
except Exception:
    pass
pid = os.fork()
if pid == 0:
    os.close(r)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    out = os.fdopen(w, "w")
    def report(value):
        out.write(json.dumps(value) + "\n")
        out.flush()
    sys.path.append(os.getcwd())
    scope = {"__name__": "__clawgym_guest__", "report": report, "data": request["data"]}
    try:
        exec(compile(request["program"], "<check program>", "exec"), scope)
    finally:
        out.flush()
    os._exit(0)
os.close(w)
tag = sys.stdin.readline().strip()
with os.fdopen(r, "rb") as pipe:
    lines = pipe.read(16 << 20).splitlines()
os.waitpid(pid, 0)
if lines:
    try:
        value = json.loads(lines[-1])
    except ValueError:
        value = None
    else:
        sys.stdout.write("%s %s %s\n" % ("CLAWGYM-RESULT", tag, json.dumps(value)))
'''


def python_result(program: str, data: Any = None, *, cwd: str | None = None, timeout: float = 60.0,
                  files: Mapping[str, bytes | str] | None = None) -> Any | None:
    """Run the Python ``program`` in a guest sandbox (``python3 -I``: the workspace is on ``sys.path``,
    last) with ``data`` and ``report`` in its globals; the last value it passed to ``report(value)`` (any
    JSON value), or ``None`` when it reported nothing (crashed, exited early, timed out)."""
    tag = secrets.token_hex(16)
    stdin = json.dumps({"program": program, "data": data}) + "\n" + tag + "\n"
    res = run(["python3", "-I", "-c", RUNNER], cwd=cwd, timeout=timeout, stdin=stdin, files=files)
    prefix = f"{TAG} {tag} "
    found = [ln[len(prefix):] for ln in res.stdout.splitlines() if ln.startswith(prefix)]
    if len(found) != 1 or res.timed_out:
        return None
    try:
        return json.loads(found[0])
    except ValueError:
        return None


UNITTEST_PROGRAM = r'''
import io, unittest
suite = unittest.defaultTestLoader.loadTestsFromNames(data["names"])
result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
report({"ran": result.testsRun, "failures": len(result.failures), "errors": len(result.errors),
        "skipped": len(result.skipped), "expected_failures": len(result.expectedFailures),
        "unexpected_successes": len(result.unexpectedSuccesses)})
'''


def unittest_result(names: Sequence[str], *, cwd: str | None = None, timeout: float = 60.0,
                    files: Mapping[str, bytes | str] | None = None) -> dict[str, int] | None:
    """Run the ``unittest`` tests named (modules, classes or methods) in a guest sandbox; their counts
    (``ran``, ``failures``, ``errors``, ``skipped``, ...) or ``None`` when the run never reported.
    Judge the counts in the check (e.g. ``ran`` equal to the number of tests the task ships, nothing failed)."""
    value = python_result(UNITTEST_PROGRAM, {"names": list(names)}, cwd=cwd, timeout=timeout, files=files)
    if not isinstance(value, dict) or not all(isinstance(v, int) for v in value.values()):
        return None
    return value


EVALUATE_PROGRAM = r'''
import json
scope = {}
exec(compile(data["setup"], "<setup>", "exec"), scope)
values = []
for expr in data["exprs"]:
    try:
        values.append({"value": json.loads(json.dumps(eval(expr, scope)))})
    except Exception as exc:
        values.append({"error": type(exc).__name__})
report(values)
'''


def evaluate(setup: str, exprs: Sequence[str], *, cwd: str | None = None, timeout: float = 60.0,
             files: Mapping[str, bytes | str] | None = None) -> list[JSONObject] | None:
    """Run ``setup`` (e.g. ``from mathutils import mean``), then evaluate each expression in a guest
    sandbox; one ``{"value": v}`` (a JSON value) or ``{"error": "TypeName"}`` per expression, or ``None``
    when the program never reported (the setup failed, the agent's code exited early). Compare the values
    in the check, never in the guest."""
    value = python_result(EVALUATE_PROGRAM, {"setup": setup, "exprs": list(exprs)}, cwd=cwd, timeout=timeout,
                          files=files)
    if not isinstance(value, list) or len(value) != len(exprs) or not all(isinstance(v, dict) for v in value):
        return None
    return value
