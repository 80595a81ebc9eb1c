"""The guest broker: runs the agent's code for a task's check, in a sandbox of its own, on the check's request.

A check inside the grading sandbox asks, through :mod:`clawgym_guest <clawgym_env.grading.guest_client>`, for a
command to run over the agent's workspace. :class:`GuestBroker` (host side, one per grading) serves those
requests on a unix socket that only the grading sandbox sees, one at a time:

* each request gets a **fresh sandbox** of the grading backend, with its own host user (never the
  verifier's when this process is root), over a fresh copy of ``base`` (the grader's copy of the agent's
  final workspace, protected inputs restored), minus the task's ``reward/`` folder, plus the request's
  ``files``; no proxy, no network; the sandbox and its copy are gone when the answer is sent;
* its timeout is the smaller of the request's and what is left before the broker's ``deadline`` (the
  verifier's own), and at most ``max_runs`` requests are served per grading;
* requests and answers are length-prefixed JSON, each at most
  :data:`~clawgym_env.grading.guest_client.MAX_MESSAGE` bytes; collected files over :data:`MAX_COLLECT` bytes come
  back as ``None`` with a note in ``stderr``; a malformed request gets an ``error`` answer, never a crash of
  the grader.

What it guarantees the check: nothing the guest runs can write the verifier's files, its workspace, or the
stdout its result is read from, nor inspect or signal the verifier's processes (another pid namespace and,
as root, another uid). What it does not: the guest's own output is the agent's — a check must judge what
comes back (see ``clawgym_guest.python_result``), never trust an exit status alone.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import posixpath
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from clawgym_env.errors import ClawGymError, SandboxError
from clawgym_env.grading.guest_client import recv_message, send_message
from clawgym_env.jsontypes import JSONObject
from clawgym_env.sandbox import SandboxLimits, SandboxSpec, get_backend, hidden_paths_with

log = logging.getLogger(__name__)

MAX_COLLECT = 16 << 20
SOCKET_NAME = "guest.sock"


class _BadRequest(ValueError):
    pass


def _rel(path: str, what: str) -> str:
    """A normalised workspace-relative path; ``_BadRequest`` for one that leaves the workspace."""
    norm = posixpath.normpath(path)
    if not path or path.startswith("/") or norm == ".." or norm.startswith("../") or "\0" in path:
        raise _BadRequest(f"{what} {path!r} must be a path relative to the workspace, inside it")
    return norm


class GuestBroker:
    """Serves ``clawgym_guest`` requests for one grading (use as a context manager; see the module doc).

    ``socket_dir``: a host folder (bound into the grading sandbox) where the socket is made;
    ``base``: the host folder copied for each guest; ``mount``: the workspace path inside."""

    def __init__(self, *, socket_dir: Path, base: Path, mount: str, sandbox: str, limits: SandboxLimits,
                 deadline: float, max_runs: int = 32, work_dir: Path,
                 copy_caps: Mapping[str, int | None] | None = None, hidden: Sequence[Path] = ()) -> None:
        self.socket_path = Path(socket_dir) / SOCKET_NAME
        self.base, self.mount, self.sandbox, self.limits = Path(base), mount, sandbox, limits
        self.deadline, self.max_runs, self.work_dir = deadline, max_runs, Path(work_dir)
        self.copy_caps = dict(copy_caps or {})
        """``max_bytes``/``max_entries`` for each guest's copy of ``base`` (the agent's own quotas)."""
        self.hidden = hidden_paths_with(hidden)
        """What every guest sandbox hides: the defaults and ``hidden`` (the task's own folders)."""
        self.runs = 0
        self.failure: str | None = None
        """Set when a guest sandbox could not be started (infrastructure, not the agent's doing)."""
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def __enter__(self) -> GuestBroker:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.socket_path))
        self.socket_path.chmod(0o666)  # the sandbox user connects; the folder above is private to the host
        sock.listen(4)
        sock.settimeout(0.2)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="clawgym-guest-broker", daemon=True)
        self._thread.start()
        return self

    def renew(self, deadline: float) -> None:
        """Give the verifier's next run a new deadline and a new count of guest commands."""
        self.deadline, self.runs = deadline, 0

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._sock is not None:
            self._sock.close()
        self.socket_path.unlink(missing_ok=True)

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(max(1.0, self.deadline - time.monotonic()))
                    send_message(conn, self._answer(conn))
                except (OSError, ValueError) as exc:  # the verifier went away or sent garbage: its loss
                    log.info("guest broker: a connection failed: %s", exc)

    @staticmethod
    def _read(conn: socket.socket) -> JSONObject:
        try:
            req = recv_message(conn)
        except ConnectionError as exc:
            raise _BadRequest(str(exc)) from None
        if not isinstance(req, dict):
            raise _BadRequest("a request is a JSON object")
        return req

    def _answer(self, conn: socket.socket) -> JSONObject:
        try:
            req = self._read(conn)
            if self.runs >= self.max_runs:
                raise _BadRequest(f"this grading already ran {self.max_runs} guest commands, the most it may")
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise _BadRequest("the verifier's time is up")
            self.runs += 1
            return self._run(req, min(float(req.get("timeout") or 60.0), left))
        except (_BadRequest, json.JSONDecodeError, binascii.Error, TypeError, KeyError, ValueError) as exc:
            return {"returncode": -1, "error": f"guest request refused: {exc}"}
        except SandboxError as exc:
            self.failure = str(exc)
            return {"returncode": -1, "error": f"the guest sandbox failed: {exc}"}
        except (ClawGymError, OSError) as exc:  # e.g. a workspace too large to copy again: the agent's
            return {"returncode": -1, "error": f"the guest could not be prepared: {exc}"}
        except Exception as exc:  # noqa: BLE001 - never leave the verifier waiting without an answer
            self.failure = f"{type(exc).__name__}: {exc}"
            return {"returncode": -1, "error": f"the guest sandbox failed: {exc}"}

    def _run(self, req: JSONObject, timeout: float) -> JSONObject:
        from clawgym_env.files.workspace import copy_tree, private_tempdir, remove_tree

        argv = req.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise _BadRequest("argv must be a non-empty list of strings")
        cwd = posixpath.join(self.mount, _rel(req["cwd"], "cwd")) if req.get("cwd") else self.mount
        files = {_rel(k, "file"): base64.b64decode(v) for k, v in dict(req.get("files") or {}).items()}
        collect = [_rel(c, "collect path") for c in list(req.get("collect") or [])]
        env = {str(k): str(v) for k, v in dict(req.get("env") or {}).items()}
        with private_tempdir("clawgym-guest-", dir=self.work_dir) as tmp:
            ws = tmp / "workspace"
            copy_tree(self.base, ws, deadline=self.deadline, max_bytes=self.copy_caps.get("max_bytes"),
                      max_entries=self.copy_caps.get("max_entries"))
            planted = ws / "reward"
            if planted.is_symlink() or planted.is_file():
                planted.unlink()
            elif planted.exists():
                remove_tree(planted)
            spec = SandboxSpec(workspace_host=ws, workspace_target=self.mount, hidden_paths=list(self.hidden),
                               limits=self.limits, hand_back=False)
            with get_backend(self.sandbox)(spec) as sb:
                for rel, content in files.items():
                    sb.write_file(posixpath.join(self.mount, rel), content)
                res = sb.exec(argv, env=env, cwd=cwd, timeout=timeout, stdin=base64.b64decode(req.get("stdin") or ""))
                got: dict[str, str | None] = {}
                notes = ""
                for rel in collect:
                    try:
                        data = sb.read_file(posixpath.join(self.mount, rel))
                    except Exception:  # noqa: BLE001 - a missing or unreadable file is the agent's
                        got[rel] = None
                        continue
                    if len(data) > MAX_COLLECT:
                        got[rel] = None
                        notes += f"\n[clawgym_guest: {rel} is {len(data)} bytes, over {MAX_COLLECT}; not collected]"
                    else:
                        got[rel] = base64.b64encode(data).decode()
        return {"returncode": res.returncode, "stdout": res.stdout, "stderr": res.stderr + notes,
                "timed_out": res.timed_out, "files": got}
