"""How a bwrap sandbox's command lines are built: its mounts, its environment and the ``bwrap`` options.

A mixin of :class:`~clawgym_env.sandbox.bwrap.sandbox.BwrapSandbox` (the invariants it keeps are listed there).
Invariants of the plan itself:
  * mounts are sorted parents first (by depth of the target, stably), so toolchain paths and the
    workspace may lie under the private HOME;
  * a read-only source the sandbox uid cannot look up on the host is first bound read-only into the
    sandbox's private folder (``ro/<index>``), and bwrap binds that instead;
  * hidden paths strictly under a visible folder (and ``spec.hidden_paths`` equal to one) become read-only
    empty tmpfs masks; a visible path strictly inside a mask is bound above it (deeper mounts come later):
    exactly that path is shown, nothing beside it;
  * the environment is built from scratch (never the host's): a PATH of visible folders only, HOME,
    TMPDIR, LANG, USER, the proxy URL when relayed, then ``spec.env``, then the exec's own.
"""

from __future__ import annotations

import os
import posixpath
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox import hostfs
from clawgym_env.sandbox.base import SandboxSpec
from clawgym_env.sandbox.bwrap.files import Mount
from clawgym_env.sandbox.bwrap.hostside import SCAN_FOR_SECRETS, unreadable_entries
from clawgym_env.sandbox.bwrap.relay import RelayHolder
from clawgym_env.sandbox.bwrap.run import user_args

RUN_DIR = "/run/clawgym"
PROXY_SOCK = f"{RUN_DIR}/proxy.sock"
RELAY_PY = f"{RUN_DIR}/relay.py"
READ_ONLY_PROC = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
_RELAY_HOST = Path(__file__).resolve().parent.parent / "relay.py"


class BwrapCommands:
    """Mixin: needs ``spec``, ``root`` (None when closed), ``_private``, ``_places``, ``_mounts``,
    ``_holders``, ``_wrapper`` and ``_bwrap`` (see :class:`~clawgym_env.sandbox.bwrap.sandbox.BwrapSandbox`)."""

    spec: SandboxSpec
    root: Path | None
    _private: bool
    _places: dict[str, Path]
    _mounts: list[Mount]
    _holders: list[RelayHolder]
    _wrapper: list[str]
    _bwrap: str

    def _source(self, src: Path | str, index: int) -> str:
        """``src`` itself, or (root, when the sandbox uid cannot look it up) a read-only staging bind."""
        if not self._private or hostfs.others_can_reach(Path(src)):
            return str(src)
        assert self.root is not None
        real = Path(os.path.realpath(src))
        stage = self.root / "ro" / str(index)
        if real.is_dir():
            stage.mkdir()
        else:
            stage.touch()
        hostfs.bind_ro(real, stage)
        return str(stage)

    def _hidden(self) -> list[str]:
        """Host paths never shown: ``spec.hidden_paths``, the workspace's episode folder and its run folder."""
        ws = Path(self.spec.workspace_host)
        return [str(p) for p in [*self.spec.hidden_paths, ws, ws.parent, ws.parent.parent]]

    def _plan_mounts(self) -> list[tuple[str, str, str]]:
        spec, root = self.spec, self.root
        assert root is not None
        private = {posixpath.normpath(spec.home), "/tmp", posixpath.normpath(spec.workspace_target)}
        places = self._places
        mounts = [("--bind", str(places["home"]), spec.home), ("--bind", str(places["tmp"]), "/tmp")]
        visible = [str(p) for p in spec.ro_paths if str(p) not in private]
        mounts += [("--ro-bind", self._source(p, i), p) for i, p in enumerate(visible)]
        n = len(visible)
        for i, (h, t, rw) in enumerate(spec.extra_binds):
            mounts.append(("--bind" if rw else "--ro-bind", str(h) if rw else self._source(h, n + i), t))
        mounts.append(("--bind", str(places["workspace"]), spec.workspace_target))
        target = posixpath.normpath(spec.workspace_target)
        declared = {str(p) for p in spec.hidden_paths}
        for hidden in self._hidden():  # under a visible folder (masking a whole system folder breaks it) or, for
            # spec.hidden_paths, equal to a ro_paths entry too: it is masked on top of that bind (same depth, later)
            if hidden != target and any(hidden.startswith(v.rstrip("/") + "/") or (hidden == v and hidden in declared)
                                        for v in visible):
                mounts.append(("--tmpfs", "", hidden))
        if not self._private:  # the sandbox is this host user: hide what other users may not read
            for top in SCAN_FOR_SECRETS:
                if top in visible:
                    mounts += [("--ro-bind", str(root / ("empty" if is_dir else "empty.txt")), p)
                               for p, is_dir in unreadable_entries(top)]
        if spec.proxy_socket is not None:
            k = n + len(spec.extra_binds)
            mounts += [("--ro-bind", self._source(spec.proxy_socket, k), PROXY_SOCK),
                       ("--ro-bind", self._source(_RELAY_HOST, k + 1), RELAY_PY)]
        return sorted(mounts, key=lambda m: len(PurePosixPath(m[2]).parts))  # stable: parents first

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment inside: a clean PATH, HOME, TMPDIR, LANG, then ``spec.env``, then ``extra``."""
        spec = self.spec
        visible = [str(p) for p in spec.ro_paths]
        path = [os.path.dirname(sys.executable), str(Path(sys.base_prefix) / "bin")]
        path += [d for d in os.environ.get("PATH", "").split(os.pathsep)
                 if d and any(d == v or d.startswith(v.rstrip("/") + "/") for v in visible)]
        path += ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        env = {"PATH": ":".join(dict.fromkeys(path)), "HOME": spec.home, "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "USER": "sandbox" if spec.unprivileged else "root"}
        if spec.proxy_socket is not None:
            env["CLAWGYM_PROXY_URL"] = f"http://127.0.0.1:{spec.proxy_port}"
        env.update(spec.env)
        env.update(extra or {})
        return env

    def command(self, argv: Sequence[str], *, cwd: str | None = None) -> list[str]:
        """The full host command line for ``argv``: limits wrapper + uid drop + bwrap (+ a relay of its own,
        or, when a relay holder serves the sandbox, ``nsenter`` into its network namespace first)."""
        if self.root is None:
            raise SandboxError("the sandbox is not open; use it as `with BwrapSandbox(spec) as sb:`")
        spec = self.spec
        if self._holders:
            return [*self._holders[0].prefix(), *self._bwrap_command(["--share-net"], list(argv), cwd)]
        if spec.proxy_socket is not None:
            argv = [inside_python(spec), "-I", "-S", RELAY_PY, str(spec.proxy_port), PROXY_SOCK, "--", *argv]
        return self._bwrap_command([], list(argv), cwd)

    def _bwrap_command(self, options: list[str], argv: list[str], cwd: str | None = None) -> list[str]:
        """Limits wrapper + uid drop + bwrap (with extra ``options``) for ``argv``."""
        spec = self.spec
        cmd = [*self._wrapper, self._bwrap, "--unshare-all", *options, *user_args(spec.unprivileged),
               "--die-with-parent",
               "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev"]
        for p in READ_ONLY_PROC:
            cmd += ["--ro-bind-try", p, p]
        if spec.limits.disk_mb is not None:
            cmd += ["--size", str(spec.limits.disk_mb << 20), "--perms", "1777", "--tmpfs", "/dev/shm"]
        masks = []
        for kind, src, target in self._mounts:
            if kind == "--tmpfs":
                cmd += ["--perms", "0555", "--tmpfs", target]
                masks.append(target)
            else:
                cmd += [kind, src, target]
        for target in masks:
            cmd += ["--remount-ro", target]
        cmd += ["--remount-ro", "/", "--chdir", cwd or spec.workspace_target, "--"]
        return cmd + argv


def inside_python(spec: SandboxSpec) -> str:
    """This Python when the sandbox sees it (it is under a read-only path), else ``python3`` from PATH."""
    exe = os.path.abspath(sys.executable)
    visible = any(exe.startswith(str(p).rstrip("/") + "/") for p in spec.ro_paths)
    return exe if visible else "python3"
