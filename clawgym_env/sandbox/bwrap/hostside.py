"""Host-side policy of the bwrap backend: resource limits (a per-sandbox cgroup, v2 or v1, plus
rlimits) and the list of host files to mask because other users may not read them.

:func:`plan_limits` decides, for each field of :class:`SandboxLimits`, how it is enforced on this
host, and returns a ``/bin/sh`` prefix that moves the sandbox's first process into the cgroup and
sets the rlimits before ``exec``-ing the real command (so every descendant is covered from its first
instruction, with no race and no ``preexec_fn``).

Invariants:
  * ``memory_mb`` and ``max_procs`` use the cgroup where this process's cgroup is writable and has the
    controller (cgroup v2, or the v1 ``memory``/``pids`` hierarchies); else memory falls back to
    ``RLIMIT_DATA`` per process (not ``RLIMIT_AS``, which breaks V8's large reservations) and the
    process count is left unenforced (``RLIMIT_NPROC`` counts every process of the host uid and is
    ignored for root);
  * ``cpus`` is the cgroup's CFS quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) per 100 ms period,
    else unenforced;
  * :meth:`Cgroup.oom_kills` and :meth:`Cgroup.throttled_periods` read the kernel's own counters
    (``oom_kill`` of ``memory.events``/``memory.oom_control``, ``nr_throttled`` of ``cpu.stat``): what
    the sandbox ran into, reported in ``limits_hit``;
  * the prefix runs as this process's uid (root: before the drop to the sandbox uid that the caller
    appends), so the cgroup's files need no delegation to the sandbox uid;
  * ``cpu_s`` is ``RLIMIT_CPU`` per process, ``open_files`` is ``RLIMIT_NOFILE``;
  * every limit ends up in exactly one of the two returned dicts: enforced (how) or unenforced (why);
  * :meth:`Cgroup.destroy` kills whatever is left in the cgroups it created and removes them;
  * :func:`unreadable_entries` scans a tree once per process (capped) and caches the answer.
"""

from __future__ import annotations

import os
import resource
import shlex
import signal
import stat
import time
from pathlib import Path

from clawgym_env.sandbox.base import SandboxLimits

SCAN_FOR_SECRETS = ("/etc", "/opt")  # system config trees that hold root-only credentials
_secrets_cache: dict[str, list[tuple[str, bool]]] = {}
_parents_cache: dict[int, list[Path]] = {}


class Cgroup:
    """One cgroup per sandbox in every hierarchy that carries a wanted controller (v2 or v1).

    ``dirs`` lists the cgroup folders this object created; :meth:`destroy` kills what is left in
    them and removes them. Moving a process in is done by writing its pid to ``procs_files``.
    """

    def __init__(self) -> None:
        self.dirs: list[Path] = []

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` file of each of the sandbox's cgroups (one per controller hierarchy)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def oom_kills(self) -> int:
        """How many processes the kernel killed for reaching the memory limit (v2 ``memory.events``,
        v1 ``memory.oom_control``: ``oom_kill``); 0 without a memory cgroup."""
        return self._counter(("memory.events", "memory.oom_control"), "oom_kill")

    def throttled_periods(self) -> int:
        """Scheduler periods in which the sandbox was held at its CPU quota (``cpu.stat``
        ``nr_throttled``); 0 without a cpu cgroup."""
        return self._counter(("cpu.stat",), "nr_throttled")

    def _counter(self, files: tuple[str, ...], key: str) -> int:
        for d in self.dirs:
            for name in files:
                try:
                    text = (d / name).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    k, _, v = line.partition(" ")
                    if k == key and v.strip().isdigit():
                        return int(v)
        return 0

    def peak_memory_bytes(self) -> int | None:
        """The highest memory use of everything in the cgroup so far (None without a memory cgroup)."""
        for d in self.dirs:
            for name in ("memory.peak", "memory.max_usage_in_bytes"):
                try:
                    return int((d / name).read_text().split()[0])
                except (OSError, ValueError, IndexError):
                    continue
        return None

    def setup(self, limits: SandboxLimits, name: str) -> dict[str, str]:
        """Create the cgroup(s) and write the limits; returns {limit: how} for what took effect."""
        want = {}
        if limits.memory_mb is not None:
            want["memory"] = ("memory_mb", limits.memory_mb * 1024 * 1024)
        if limits.max_procs is not None:
            want["pids"] = ("max_procs", limits.max_procs)
        if limits.cpus is not None:  # CFS bandwidth: quota per 100 ms period
            want["cpu"] = ("cpus", max(1000, int(limits.cpus * 100_000)))
        if not want:
            return {}
        own_v1, own_v2 = _own_cgroups()
        files = {"memory": {"cgroup2": ["memory.max", "memory.swap.max:0"],
                            "cgroup": ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]},
                 "pids": {"cgroup2": ["pids.max"], "cgroup": ["pids.max"]},
                 "cpu": {"cgroup2": ["cpu.max"], "cgroup": ["cpu.cfs_quota_us"]}}
        done: dict[str, str] = {}
        made: dict[Path, Path] = {}  # hierarchy base -> the folder created under it
        for ctrl, (limit_name, value) in want.items():
            found = _hierarchy_base(ctrl, own_v1, own_v2)
            if found is None:
                continue
            base, kind = found
            try:
                if base not in made:
                    if kind == "cgroup2":
                        _v2_enable(base, [c for c in want if c in _v2_available(base)])
                    made[base] = base / name
                    made[base].mkdir()
                    self.dirs.append(made[base])
                main, *extra = files[ctrl][kind]
                text = f"{value} 100000" if main == "cpu.max" else str(value)
                (made[base] / main).write_text(text)
                for f in extra:  # best effort: swap accounting may be absent
                    fname, _, fixed = f.partition(":")
                    try:
                        (made[base] / fname).write_text(fixed or str(value))
                    except OSError:
                        pass
                done[limit_name] = f"{'cgroup v2' if kind == 'cgroup2' else 'cgroup v1'} {main}={text}"
            except OSError:
                continue
        return done

    def destroy(self) -> None:
        """Remove the sandbox's cgroups, waiting (briefly) for their processes to be gone."""
        for d in reversed(self.dirs):
            deadline = time.monotonic() + 5
            while d.exists():
                _kill_cgroup(d)
                try:
                    d.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
        self.dirs = [d for d in self.dirs if d.exists()]


def cgroup_parents() -> list[Path]:
    """The writable cgroup folders (one per hierarchy) under which sandboxes' cgroups are made (looked up
    once per process)."""
    if os.getpid() not in _parents_cache:
        own_v1, own_v2 = _own_cgroups()
        found = (_hierarchy_base(c, own_v1, own_v2) for c in ("memory", "pids", "cpu"))
        _parents_cache[os.getpid()] = list(dict.fromkeys(hit[0] for hit in found if hit is not None))
    return list(_parents_cache[os.getpid()])


def sweep_stale_cgroups(parents: list[Path]) -> None:
    """Empty and remove the cgroups ``clawgym-<pid>-*`` under ``parents`` whose process ``pid`` is gone (a
    driver killed before its reaper could run)."""
    for parent in parents:
        for d in parent.glob("clawgym-*-*"):
            pid = d.name.split("-")[1]
            if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
                _kill_cgroup(d)
                try:
                    d.rmdir()
                except OSError:
                    pass


def _own_cgroups() -> tuple[dict[str, str], str | None]:
    v1: dict[str, str] = {}
    v2 = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, ctrls, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and not ctrls:
                v2 = path
            for c in ctrls.split(","):
                v1[c.removeprefix("name=")] = path
    return v1, v2


def _hierarchy_base(ctrl: str, own_v1: dict[str, str], own_v2: str | None) -> tuple[Path, str] | None:
    """The folder of this process's cgroup in the hierarchy that carries ``ctrl``, if writable."""
    with open("/proc/self/mountinfo") as f:
        mounts = [(ln.split()[3], ln.split()[4], ln.split(" - ")[1].split()) for ln in f if " - cgroup" in ln]
    for root, point, (fstype, _src, *opts) in mounts:
        own = own_v2 if fstype == "cgroup2" else own_v1.get(ctrl)
        if own is None or (fstype == "cgroup" and ctrl not in (opts[0].split(",") if opts else [])):
            continue
        rel = own[len(root):] if root != "/" and own.startswith(root) else own
        base = Path(point) / rel.lstrip("/")
        if fstype == "cgroup2" and ctrl not in _v2_available(base):
            continue
        if base.is_dir() and os.access(base, os.W_OK):
            return base, fstype
    return None


def _v2_available(base: Path) -> list[str]:
    try:
        return (base / "cgroup.controllers").read_text().split()
    except OSError:
        return []


def _v2_enable(base: Path, ctrls: list[str]) -> None:
    enabled = (base / "cgroup.subtree_control").read_text().split()
    missing = [c for c in ctrls if c not in enabled]
    if missing:  # fails (EBUSY) in a non-root cgroup that holds processes: then no cgroup limits
        (base / "cgroup.subtree_control").write_text(" ".join("+" + c for c in missing))


def _kill_cgroup(d: Path) -> None:
    try:
        if (d / "cgroup.kill").exists():
            (d / "cgroup.kill").write_text("1")
            return
        for pid in (d / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    except OSError:
        pass


def plan_limits(limits: SandboxLimits, cgroup: Cgroup | None,
                name: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Set up ``cgroup`` (``None``: rlimits only) and return (sh prefix, enforced, unenforced)."""
    enforced = cgroup.setup(limits, name) if cgroup is not None else {}
    unenforced: dict[str, str] = {}
    steps = [f"echo $$ > {shlex.quote(f)} || exit 125" for f in (cgroup.procs_files if cgroup else [])]
    if limits.memory_mb is not None and "memory_mb" not in enforced:
        steps.append(f"ulimit -d {limits.memory_mb * 1024} || exit 125")
        enforced["memory_mb"] = f"RLIMIT_DATA={limits.memory_mb}MiB per process (no writable memory cgroup)"
    if limits.max_procs is not None and "max_procs" not in enforced:
        unenforced["max_procs"] = ("no writable pids cgroup; RLIMIT_NPROC is not used: it counts every "
                                   "process of the host uid and does not apply to root")
    if limits.cpus is not None and "cpus" not in enforced:
        unenforced["cpus"] = "no writable cpu cgroup (cgroup v2 cpu.max or v1 cpu.cfs_quota_us)"
    if limits.cpu_s is not None:
        steps.append(f"ulimit -t {int(limits.cpu_s)} || exit 125")
        enforced["cpu_s"] = f"RLIMIT_CPU={int(limits.cpu_s)}s per process"
    if limits.open_files is not None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        n = limits.open_files if hard == resource.RLIM_INFINITY else min(limits.open_files, hard)
        steps.append(f"ulimit -n {n} || exit 125")
        enforced["open_files"] = f"RLIMIT_NOFILE={n}"
    if not steps:
        return [], enforced, unenforced
    return ["/bin/sh", "-c", "; ".join(steps) + '; exec "$@"', "clawgym-sandbox"], enforced, unenforced


def unreadable_entries(top: str, cap: int = 20000) -> list[tuple[str, bool]]:
    """(path, is_dir) under ``top`` that other users may not read. Cached per process.

    The sandbox user maps to the host user running this process (often root), so without masks it
    could read e.g. ``/etc/shadow`` or ``/etc/ssl/private`` through the read-only toolchain binds.
    """
    if top not in _secrets_cache:
        found: list[tuple[str, bool]] = []
        seen = 0
        for dirpath, dirnames, filenames in os.walk(top):
            descend = []
            for name in dirnames + filenames:
                seen += 1
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o005 != 0o005:
                    found.append((os.path.join(dirpath, name), True))
                elif stat.S_ISDIR(st.st_mode):
                    descend.append(name)
                elif stat.S_ISREG(st.st_mode) and not st.st_mode & 0o004:
                    found.append((os.path.join(dirpath, name), False))
            dirnames[:] = [d for d in dirnames if d in descend]
            if seen > cap:
                break
        _secrets_cache[top] = found
    return _secrets_cache[top]
