"""Attacks on the bubblewrap sandbox, run from inside real episodes (mini harness + scripted agent) and
real sandboxes; each asserts the attack failed and nothing outside the episode changed.

* Host root: a sysctl write, ``kernel.core_pattern`` opened for writing, a signal to a host
  process, reading a root-only (0600) host file under a mounted tree; also with ``unprivileged=False``.
* Setuid planting: ``id`` copied into the workspace and marked 4755/2755 must not be setuid on the
  host afterwards (run as ``nobody`` it must not give euid 0), nor after the driver is killed.
* Answer keys: ``find /`` from inside finds no ``expert.json``/``check.py``/``reward.sh`` and no
  file of a concurrent episode; the project tree is not there.
* Disk and CPU: the workspace, HOME, ``/tmp`` and ``/dev/shm`` stop at the quota with ENOSPC, a
  3 GiB sparse file comes back as a sparse file, the CPU share is throttled; the proxy socket cannot
  be tampered with (``chmod``) and still works.

The host-root and setuid attacks need this process to be root (as CI runs); they skip otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from clawgym_env.envs.runtime import RolloutPool, Runtime
from clawgym_env.errors import SandboxError
from clawgym_env.plugins import make_harness
from clawgym_env.sandbox.base import SandboxLimits, SandboxSpec
from clawgym_env.sandbox.bwrap.sandbox import BwrapSandbox, check_bwrap

try:
    check_bwrap(True)
except SandboxError as _e:
    pytest.skip(str(_e), allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
SYSCTL = Path("/proc/sys/vm/dirty_writeback_centisecs")
as_root = pytest.mark.skipif(os.getuid() != 0, reason="the host-root attacks matter when ClawGym runs as root (CI)")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def attacked(builtin_suite):
    """Two concurrent episodes of one attacking agent; returns (results, host canaries)."""
    task = builtin_suite.tasks[0]
    secret_dir = Path(tempfile.mkdtemp(prefix="cg-attack-ro-"))
    secret_dir.chmod(0o755)
    secret = secret_dir / "root-only.txt"
    secret.write_text(f"host-root-only-{uuid.uuid4().hex}")
    secret.chmod(0o600)
    victim = subprocess.Popen(["sleep", "300"])
    runs = ROOT / "runs" / f"bwrap-attack-{uuid.uuid4().hex[:8]}"  # under the project tree, as by default
    runs.mkdir(parents=True)
    for d in (runs, runs.parent):
        d.chmod(0o755)
    m = task.mount_dir
    steps = [
        f"cd {m} && echo victim-$$-$RANDOM > marker-$$.secret && cp /usr/bin/id idsuid && chmod 4755 idsuid"
        " && cp /usr/bin/id idsgid && chmod 2755 idsgid && echo planted",
        f"cd {m}; v=$(cat {SYSCTL}); (echo $v > {SYSCTL}) 2>/dev/null; echo $? > sysctl.rc;"
        " python3 -c \"open('/proc/sys/kernel/core_pattern', 'w')\" 2>/dev/null; echo $? > core.rc;"
        f" kill -9 {victim.pid} 2>/dev/null; echo $? > kill.rc;"
        f" cat {secret} > secret.out 2>/dev/null; echo $? > secret.rc",
        f"cd {m}; sleep 2; find / \\( -name expert.json -o -path '*/reward/check.py' -o -name reward.sh"
        " -o -name '*.secret' \\)"
        f" -not -path '/proc/*' 2>/dev/null > found.txt; ls {ROOT}/tasks > /dev/null 2>&1; echo $? > project.rc",
    ]
    script = secret_dir / "attack.json"
    script.write_text(json.dumps({"steps": [*({"tool": "bash", "command": c} for c in steps), {"final": "done"}]}))
    before = SYSCTL.read_text()
    old = os.environ.get("CLAWGYM_SANDBOX_RO_PATHS")
    os.environ["CLAWGYM_SANDBOX_RO_PATHS"] = str(secret_dir)  # a mounted tree holding a 0600 root file
    try:
        with Runtime(f"scripted:file:{script}", out_dir=runs) as rt:
            results = RolloutPool(rt, concurrency=2, progress=False).run([task, task], make_harness("mini"),
                                                                        keep_workspace=True)
        yield results, {"victim": victim, "secret": secret.read_text(), "sysctl": before, "mount": m}
    finally:
        if old is None:
            os.environ.pop("CLAWGYM_SANDBOX_RO_PATHS", None)
        else:
            os.environ["CLAWGYM_SANDBOX_RO_PATHS"] = old
        victim.kill()
        victim.wait()
        shutil.rmtree(secret_dir, ignore_errors=True)
        shutil.rmtree(runs, ignore_errors=True)
        if not any(runs.parent.iterdir()):
            runs.parent.rmdir()


def _ws(res) -> Path:
    return Path(res.record.calls_path).parent / "workspace"


def _read(res, name: str) -> str:
    p = _ws(res) / name
    assert p.exists(), (name, res.record.status, res.record.error, res.record.logs)
    return p.read_text().strip()


@as_root
def test_sysctl_and_core_pattern_are_not_writable(attacked):
    results, host = attacked
    for r in results:
        assert _read(r, "sysctl.rc") != "0", "a sysctl write succeeded from inside the sandbox"
        assert _read(r, "core.rc") != "0", "kernel.core_pattern opened for writing"
    assert SYSCTL.read_text() == host["sysctl"]


def test_host_processes_cannot_be_signalled(attacked):
    results, host = attacked
    for r in results:
        assert _read(r, "kill.rc") != "0"
    assert host["victim"].poll() is None, "the host process was killed from inside"


@as_root
def test_root_only_host_file_under_a_mount_is_unreadable(attacked):
    results, host = attacked
    for r in results:
        assert _read(r, "secret.rc") != "0"
        assert host["secret"] not in _read(r, "secret.out")


def test_no_answer_keys_and_no_other_episode_is_visible(attacked):
    results, host = attacked
    for r in results:
        found = [ln for ln in _read(r, "found.txt").splitlines() if ln]
        assert not [f for f in found if not f.endswith(".secret")], found  # expert.json, check.py, reward.sh
        mine = [f for f in found if f.startswith(host["mount"] + "/")]
        assert len(mine) == 1 and mine == found, found  # its own marker only, once
        assert _read(r, "project.rc") != "0", "the project tree is visible inside"


@as_root
def test_planted_setuid_files_are_harmless_on_the_host(attacked):
    results, _ = attacked
    for r in results:
        ws = _ws(r)
        for name in ("idsuid", "idsgid"):
            st = (ws / name).lstat()
            assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), (name, oct(st.st_mode), st.st_uid)
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(ws / "idsuid"), "-u"],
                             capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == "65534", out
        assert not [p for p in ws.rglob("*") if p.lstat().st_uid >= 2_000_000_000]


@as_root
def test_killed_driver_leaves_no_setuid_file_and_no_mount(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    prog = textwrap.dedent(f"""
        from pathlib import Path
        from clawgym_env.sandbox.base import SandboxSpec
        from clawgym_env.sandbox.bwrap.sandbox import BwrapSandbox
        sb = BwrapSandbox(SandboxSpec(workspace_host=Path({str(ws)!r}))).__enter__()
        print(sb.root, flush=True)
        sb.exec(["sh", "-c", "cp /usr/bin/id idsuid && chmod 4755 idsuid && sleep 60"])
    """)
    driver = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    root = driver.stdout.readline().strip()
    time.sleep(2)
    driver.kill()
    driver.wait()
    assert not [p for p in ws.rglob("*") if p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID)]
    assert not (ws / "idsuid").exists()
    deadline = time.monotonic() + 10  # the driver's reaper removes its mounts (tmpfs memory) and folders
    while root in Path("/proc/self/mountinfo").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert root not in Path("/proc/self/mountinfo").read_text() and not Path(root).exists()


@as_root
def test_root_inside_is_not_host_root(tmp_path):
    secret = tmp_path / "ro" / "key"
    secret.parent.mkdir()
    secret.parent.chmod(0o755)
    secret.write_text("root-only")
    secret.chmod(0o600)
    spec = SandboxSpec(workspace_host=tmp_path, unprivileged=False, ro_paths=[Path("/usr"), Path("/bin"),
                       Path("/lib"), Path("/lib64"), secret.parent])
    with BwrapSandbox(spec) as sb:
        assert sb.exec(["id", "-u"]).stdout.strip() == "0"
        r = sb.exec(["sh", "-c", f"v=$(cat {SYSCTL}); echo $v > {SYSCTL}"])
        assert not r.ok, r
        r = sb.exec(["cat", str(secret)])
        assert not r.ok and "root-only" not in r.stdout, r
        assert sb.exec(["cat", "/proc/self/uid_map"]).stdout.split()[1] == str(sb.host_ids[0]) != "0"


def test_disk_quota_holds_in_every_writable_place(tmp_path):
    roots = Path(tempfile.mkdtemp(prefix="cg-roots-"))
    roots.chmod(0o711)
    ws = tmp_path / "ws"
    ws.mkdir()
    rss = _rss_mb()
    try:
        with BwrapSandbox(SandboxSpec(workspace_host=ws, limits=SandboxLimits(disk_mb=16)), tmp_root=roots) as sb:
            places = (sb.spec.workspace_target, "/root", "/tmp") if os.getuid() == 0 else ()  # needs root
            for place in (*places, "/dev/shm"):
                # one exec: /dev/shm lives as long as the exec
                r = sb.exec(["sh", "-c", f"dd if=/dev/zero of={place}/fill bs=1M count=40; stat -c %s {place}/fill"])
                assert "No space left on device" in r.stderr, (place, r)
                assert int(r.stdout.split()[-1]) <= 16 << 20, (place, r)
            if os.getuid() == 0:
                assert set(sb.full_disks()) == {"workspace", "home", "tmp"}
                assert "disk_mb" in sb.enforced_limits and "disk_mb" not in sb.unenforced_limits
            else:
                assert "disk_mb" in sb.unenforced_limits
            assert sb.exec(["sh", "-c", "rm fill && truncate -s 3G sparse"]).ok
        sparse = ws / "sparse"
        assert sparse.stat().st_size == 3 << 30 and sparse.stat().st_blocks * 512 < 1 << 20
        assert _rss_mb() - rss < 200, "handing back the workspace read the sparse file into memory"
    finally:
        shutil.rmtree(roots, ignore_errors=True)


def test_cpu_share_is_throttled(tmp_path):
    spec = SandboxSpec(workspace_host=tmp_path, limits=SandboxLimits(cpus=0.2))
    with BwrapSandbox(spec) as sb:
        if "cpus" not in sb.enforced_limits:
            pytest.skip(f"no CPU cgroup here: {sb.unenforced_limits['cpus']}")
        r = sb.exec(["python3", "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
        assert r.ok, r
        stats = [d / "cpu.stat" for d in sb._cgroup.dirs if (d / "cpu.stat").exists()]
        text = " ".join(p.read_text() for p in stats)
        fields = dict(zip(text.split()[::2], map(int, text.split()[1::2])))
        assert fields.get("nr_throttled", 0) > 0, text


@pytest.fixture
def proxy_socket():
    d = Path(tempfile.mkdtemp(prefix="cg-px-"))
    path = d / "proxy.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    path.chmod(0o666)  # as the proxy does
    srv.listen(4)
    yield path, srv
    srv.close()
    shutil.rmtree(d, ignore_errors=True)


def test_proxy_socket_cannot_be_tampered_with(tmp_path, proxy_socket):
    path, srv = proxy_socket
    with BwrapSandbox(SandboxSpec(workspace_host=tmp_path, proxy_socket=path)) as sb:
        r = sb.exec(["sh", "-c", "chmod 000 /run/clawgym/proxy.sock; echo $?; rm -f /run/clawgym/proxy.sock; echo $?"])
        assert r.stdout.split() == ["1", "1"], r  # both refused (read-only bind)
        assert stat.S_IMODE(path.stat().st_mode) == 0o666
        code = "import socket; s = socket.create_connection(('127.0.0.1', 18080)); s.sendall(b'hi'); s.close()"
        assert sb.exec(["python3", "-c", code]).ok
        srv.settimeout(10)
        conn, _ = srv.accept()
        assert conn.recv(2) == b"hi"
        conn.close()


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0
