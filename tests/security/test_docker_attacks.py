"""Attacks on the Docker sandbox, run from inside real episodes (mini harness + scripted agent, two at
once) and real containers; each asserts the attack failed and nothing outside the episode changed.

* Host root: the sandbox's uid is neither 0 nor any user of this host; a sysctl write and
  ``kernel.core_pattern`` opened for writing fail; a signal to a host process fails; a root-only
  (0600) host file under a mounted tree stays unreadable; a setuid-root binary from the host gives
  nothing inside (``no-new-privileges``); the container has its own pid and ipc namespaces;
  ``unprivileged=False`` (root inside = host root without userns-remap) is refused.
* Setuid planting: ``id`` copied into the workspace and marked 4755/2755 is reachable by no host
  path while the sandbox runs and comes back without the bits, owned by the workspace's owner.
* Answer keys: ``find /`` from inside finds no ``expert.json``, nothing under a ``reward/`` folder and no
  file of a concurrent episode; the project tree is not there; packages hidden by
  ``spec.hidden_paths`` under a visible prefix (a non-editable install) and other episodes' folders
  under it are masked.
* Disk and CPU: the workspace, HOME, ``/tmp`` and ``/dev/shm`` stop at the quota with ENOSPC; 512
  MiB to ``/dev/shm`` fails; a 3 GiB sparse file comes back sparse without the driver's memory
  growing; the CFS quota of ``cpus`` is set and holds.
* Leftovers: nothing (container, process, mount, staging folder) is left after ``close`` nor after
  the driver is SIGKILLed.

Needs a Docker engine (started with ``scripts/dockerd.sh start`` when none answers; the module skips
with the reason only when none can run). The host-root and quota attacks need root (as CI runs).
"""

from __future__ import annotations

import json
import os
import pwd
import resource
import shutil
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
from clawgym_env.sandbox.base import SandboxLimits, SandboxSpec, host_toolchain_paths, own_package_paths
from clawgym_env.sandbox.docker.sandbox import DockerSandbox

ROOT = Path(__file__).resolve().parents[2]
SYSCTL = Path("/proc/sys/vm/dirty_writeback_centisecs")
as_root = pytest.mark.skipif(os.getuid() != 0, reason="the host-root attacks matter when ClawGym runs as root (CI)")
pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]
MiB = 1 << 20


try:
    from helpers_docker import engine_problem as _engine_problem
except ImportError:  # tests run as a package
    from tests.helpers_docker import engine_problem as _engine_problem


@pytest.fixture(scope="module", autouse=True)
def engine():
    why, started = _engine_problem(), False
    if why is not None and shutil.which("dockerd") is not None and os.geteuid() == 0:
        proc = subprocess.run([str(ROOT / "scripts" / "dockerd.sh"), "start"], capture_output=True, text=True,
                              timeout=180)
        started = _engine_problem() is None
        why = None if started else (proc.stderr.strip()[-600:] or "dockerd did not start")
    if why is not None:
        pytest.skip(f"no Docker engine can run here: {why} (scripts/dockerd.sh --install start)")
    import docker

    client = docker.from_env()
    yield client
    client.close()
    if started:
        subprocess.run([str(ROOT / "scripts" / "dockerd.sh"), "stop"], capture_output=True, timeout=120)


def _containers(client) -> set[str]:
    return {c.id for c in client.containers.list(all=True, filters={"label": "org.clawgym.sandbox"})}


@pytest.fixture(scope="module")
def attacked(builtin_suite, engine):
    """Two concurrent Docker episodes of one attacking agent; returns (results, host canaries)."""
    task = builtin_suite.tasks[0]
    secret_dir = Path(tempfile.mkdtemp(prefix="cg-dattack-ro-"))
    secret_dir.chmod(0o755)
    secret = secret_dir / "root-only.txt"
    secret.write_text(f"host-root-only-{uuid.uuid4().hex}")
    secret.chmod(0o600)
    shutil.copy("/usr/bin/id", secret_dir / "rootid")  # a setuid-root program from the host, mounted
    (secret_dir / "rootid").chmod(0o4755)
    victim = subprocess.Popen(["sleep", "300"])
    runs = ROOT / "runs" / f"docker-attack-{uuid.uuid4().hex[:8]}"  # under the project tree, as by default
    runs.mkdir(parents=True)
    m = task.mount_dir
    steps = [
        f"cd {m} && echo victim-$$-$RANDOM > marker-$$.secret && cp /usr/bin/id idsuid && chmod 4755 idsuid"
        " && cp /usr/bin/id idsgid && chmod 2755 idsgid && mkdir sgdir && chmod 2775 sgdir && echo planted",
        f"cd {m}; v=$(cat {SYSCTL}); (echo $v > {SYSCTL}) 2>/dev/null; echo $? > sysctl.rc;"
        " python3 -c \"open('/proc/sys/kernel/core_pattern', 'w')\" 2>/dev/null; echo $? > core.rc;"
        f" kill -9 {victim.pid} 2>/dev/null; echo $? > kill.rc; id -u > uid.txt; {secret_dir}/rootid -u > euid.txt;"
        f" cat {secret} > secret.out 2>/dev/null; echo $? > secret.rc;"
        " readlink /proc/self/ns/pid /proc/self/ns/ipc > ns.txt",
        f"cd {m}; sleep 2; find / \\( -name expert.json -o -path '*/reward/*' -o -name '*.secret' \\)"
        f" -not -path '/proc/*' 2>/dev/null > found.txt; ls {ROOT}/tasks > /dev/null 2>&1; echo $? > project.rc;"
        f" ls -A {ROOT} > project.txt 2>&1",
    ]
    script = secret_dir / "attack.json"
    script.write_text(json.dumps({"steps": [*({"tool": "bash", "command": c} for c in steps), {"final": "done"}]}))
    before = SYSCTL.read_text()
    old = os.environ.get("CLAWGYM_SANDBOX_RO_PATHS")
    os.environ["CLAWGYM_SANDBOX_RO_PATHS"] = str(secret_dir)  # a mounted tree holding a 0600 root file
    try:
        with Runtime(f"scripted:file:{script}", sandbox="docker", out_dir=runs) as rt:
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
        if runs.parent.exists() and not any(runs.parent.iterdir()):
            runs.parent.rmdir()


def _ws(res) -> Path:
    return Path(res.record.calls_path).parent / "workspace"


def _read(res, name: str) -> str:
    p = _ws(res) / name
    assert p.exists(), (name, res.record.status, res.record.error, res.record.logs)
    return p.read_text().strip()


@as_root
def test_sandbox_user_is_no_host_user_and_cannot_touch_the_kernel(attacked):
    results, host = attacked
    users = {u.pw_uid for u in pwd.getpwall()}
    for r in results:
        uid = int(_read(r, "uid.txt"))
        assert uid != 0 and uid not in users, f"sandboxed code runs as host uid {uid}, a real user of this host"
        assert _read(r, "euid.txt") == str(uid), "a setuid-root host binary raised privileges inside"
        assert _read(r, "sysctl.rc") != "0", "a sysctl write succeeded from inside the sandbox"
        assert _read(r, "core.rc") != "0", "kernel.core_pattern opened for writing"
        assert _read(r, "kill.rc") != "0"
        assert _read(r, "secret.rc") != "0" and host["secret"] not in _read(r, "secret.out")
        ns = _read(r, "ns.txt").split()
        assert len(ns) == 2 and not set(ns) & {os.readlink("/proc/self/ns/pid"), os.readlink("/proc/self/ns/ipc")}, ns
    assert SYSCTL.read_text() == host["sysctl"]
    assert host["victim"].poll() is None, "the host process was killed from inside"


def test_no_answer_keys_and_no_other_episode_is_visible(attacked):
    results, host = attacked
    for r in results:
        found = [ln for ln in _read(r, "found.txt").splitlines() if ln]
        assert not [f for f in found if not f.endswith(".secret")], found  # expert.json, check.py, reward.sh
        mine = [f for f in found if f.startswith(host["mount"] + "/")]
        assert len(mine) == 1 and mine == found, found  # its own marker only, once
        assert _read(r, "project.rc") != "0", "the project tree is visible inside"
        listing = _read(r, "project.txt").split()  # at most the folder leading to the harness's own file
        assert listing in ([], ["harness_adapters"]) or "No such file" in " ".join(listing), listing


@as_root
def test_planted_setuid_files_are_harmless_on_the_host(attacked):
    results, _ = attacked
    for r in results:
        ws = _ws(r)
        assert r.record.status == "ok", (r.record.error, r.record.logs)
        for name in ("idsuid", "idsgid", "sgdir"):
            st = (ws / name).lstat()
            assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), (name, oct(st.st_mode), st.st_uid)
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(ws / "idsuid"), "-u"],
                             capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == "65534", out
        owner = ws.stat().st_uid
        assert not [p for p in ws.rglob("*") if p.lstat().st_uid != owner]
        assert not ws.stat().st_mode & 0o077, "the workspace is reachable by other host users"


def test_unprivileged_false_is_refused(tmp_path):
    with pytest.raises(SandboxError, match="host root"):
        with DockerSandbox(SandboxSpec(workspace_host=tmp_path, unprivileged=False)):
            pass


@as_root
def test_setuid_file_is_reachable_by_no_host_path_while_running(tmp_path, engine):
    ws, roots = tmp_path / "ws", tmp_path / "roots"
    ws.mkdir()
    roots.mkdir()
    with DockerSandbox(SandboxSpec(workspace_host=ws), tmp_root=roots) as sb:
        assert sb.exec(["sh", "-c", "cp /usr/bin/id idsuid && chmod 4755 idsuid && cp idsuid ~/h && chmod 4755 ~/h"
                        " && cp idsuid /tmp/t && chmod 4755 /tmp/t"]).ok
        setid = stat.S_ISUID | stat.S_ISGID
        planted = [p for top in (ws, roots) for p in top.rglob("*") if p.lstat().st_mode & setid]
        assert not planted, planted
        assert not [p for p in (ws, roots) for q in p.rglob("*") if q.lstat().st_uid == sb.uid]
    assert not (ws / "idsuid").stat().st_mode & stat.S_ISUID and (ws / "idsuid").stat().st_uid == 0


@as_root
@pytest.mark.parametrize("place", ["{ws}", "/root", "/tmp", "/dev/shm"])
def test_disk_quota_stops_each_place(tmp_path, engine, place):
    ws = tmp_path / "ws"
    ws.mkdir()
    with DockerSandbox(SandboxSpec(workspace_host=ws, limits=SandboxLimits(disk_mb=32))) as sb:
        assert "disk_mb" in sb.enforced_limits
        where = place.format(ws=sb.spec.workspace_target)
        res = sb.exec(["sh", "-c", f"head -c {48 * MiB} /dev/zero > {where}/fill; echo rc=$?; stat -c %s {where}/fill"])
        assert "No space left" in res.stderr and "rc=0" not in res.stdout, res
        assert int(res.stdout.split()[-1]) <= 32 * MiB
        name = {"/root": "home", "/tmp": "tmp", "/dev/shm": "shm"}.get(place, "workspace")
        assert sb.full_disks() == [name]  # a clear status for the episode to report
        if place == "/dev/shm":
            res = sb.exec(["sh", "-c", f"rm -f {where}/fill; head -c {512 * MiB} /dev/zero > {where}/big"])
            assert not res.ok and "No space left" in res.stderr, res
        assert sb.exec(["sh", "-c", f"rm -f {where}/fill {where}/big && echo ok > {where}/after"]).ok
    if place == "{ws}":
        assert [p.name for p in ws.iterdir()] == ["after"]


@as_root
def test_sparse_file_stays_sparse_and_cheap(tmp_path, engine):
    ws = tmp_path / "ws"
    ws.mkdir()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with DockerSandbox(SandboxSpec(workspace_host=ws, limits=SandboxLimits(disk_mb=64))) as sb:
        assert sb.exec(["sh", "-c", "truncate -s 3G big.sparse && printf tail >> big.sparse"]).ok
    st = (ws / "big.sparse").stat()
    assert st.st_size == 3 * 1024 * MiB + 4 and st.st_blocks * 512 < MiB, (st.st_size, st.st_blocks)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 200 * 1024  # KiB: no 3 GiB in memory


def test_cpu_share_is_capped(tmp_path, engine):
    ws = tmp_path / "ws"
    ws.mkdir()
    with DockerSandbox(SandboxSpec(workspace_host=ws, limits=SandboxLimits(cpus=0.25))) as sb:
        if "cpus" not in sb.enforced_limits:
            pytest.skip(sb.unenforced_limits["cpus"])
        code = textwrap.dedent("""
            import os, time
            pids = []
            for _ in range(2):
                pid = os.fork()
                if pid == 0:
                    end = time.monotonic() + 3
                    while time.monotonic() < end:
                        pass
                    os._exit(0)
                pids.append(pid)
            for p in pids:
                os.waitpid(p, 0)
            t = os.times()
            print(t.children_user + t.children_system)
        """)
        res = sb.exec(["python3", "-c", code], timeout=60)
        assert res.ok, res
        # two busy processes for 3 s wall may use at most 0.25 CPU x 3 s (plus one CFS period of slack)
        assert float(res.stdout) <= 0.25 * 3 * 1.3 + 0.2, res.stdout


@as_root
def test_close_leaves_no_container_process_or_mount(tmp_path, engine):
    ws, roots = tmp_path / "ws", tmp_path / "roots"
    ws.mkdir()
    roots.mkdir()
    before = _containers(engine)
    with DockerSandbox(SandboxSpec(workspace_host=ws), tmp_root=roots) as sb:
        assert sb.exec(["sh", "-c", "(setsid sleep 300 &); nohup sleep 301 >/dev/null 2>&1 &"]).ok
        uid, root = sb.uid, str(sb.root)
    assert _containers(engine) == before
    left = subprocess.run(["ps", "-eo", "uid="], capture_output=True, text=True).stdout.split()
    assert str(uid) not in left
    assert root not in Path("/proc/self/mountinfo").read_text() and list(roots.iterdir()) == []


def test_killed_driver_leaves_no_container(tmp_path, engine):
    ws = tmp_path / "ws"
    ws.mkdir()
    before = _containers(engine)
    prog = textwrap.dedent(f"""
        from pathlib import Path
        from clawgym_env.sandbox.base import SandboxSpec
        from clawgym_env.sandbox.docker.sandbox import DockerSandbox
        sb = DockerSandbox(SandboxSpec(workspace_host=Path({str(ws)!r}))).__enter__()
        sb.exec(["sh", "-c", "(setsid sleep 300 &)"])
        print(sb.container_id, sb.uid, sb.root, flush=True)
        sb.exec(["sh", "-c", "cp /usr/bin/id idsuid && chmod 4755 idsuid && sleep 120"])
    """)
    driver = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    cid, uid, root = driver.stdout.readline().split()
    time.sleep(2)
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and cid in _containers(engine):
        time.sleep(0.5)
    assert cid not in _containers(engine) and _containers(engine) <= before, "a container outlived its driver"
    assert uid not in subprocess.run(["ps", "-eo", "uid="], capture_output=True, text=True).stdout.split()
    assert root not in Path("/proc/self/mountinfo").read_text()
    assert not [p for p in ws.rglob("*") if p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID)]


def test_hidden_packages_and_other_runs_under_a_visible_prefix_are_masked(tmp_path, engine):
    prefix = tmp_path / "prefix"  # like a non-editable install: our packages inside a visible prefix
    (prefix / "site" / "tasks" / "t1" / "reward").mkdir(parents=True)
    (prefix / "site" / "tasks" / "t1" / "expert.json").write_text('{"answer": 42}')
    (prefix / "site" / "tasks" / "t1" / "reward" / "check.py").write_text("EXPECTED = 2\n")
    (prefix / "site" / "harness" / "agent.py").parent.mkdir()
    (prefix / "site" / "harness" / "agent.py").write_text("print('agent')\n")
    victim = prefix / "runs" / "ep-victim" / "workspace"
    victim.mkdir(parents=True)
    (victim / "victim.secret").write_text("victim data")
    (victim.parent / "calls.jsonl").write_text("{}\n")
    ws = prefix / "runs" / "ep-me" / "workspace"
    ws.mkdir(parents=True)
    spec = SandboxSpec(workspace_host=ws, ro_paths=[*host_toolchain_paths(), prefix, prefix / "site/harness/agent.py"],
                       hidden_paths=[*own_package_paths(), prefix / "site" / "tasks", prefix / "site" / "harness"])
    with DockerSandbox(spec) as sb:
        res = sb.exec(["sh", "-c", "find / \\( -name expert.json -o -path '*/reward/*' -o -name '*.secret' "
                       "-o -name calls.jsonl \\) -not -path '/proc/*' 2>/dev/null"], timeout=300)
        assert res.stdout.split() == [], res.stdout
        assert sb.exec(["ls", str(prefix)]).ok  # the prefix itself is there ...
        agent = sb.exec(["cat", str(prefix / "site/harness/agent.py")])
        assert agent.stdout == "print('agent')\n"  # ... and a file asked for inside a hidden package
        assert not sb.exec(["ls", str(ROOT / "tasks")]).ok


def test_file_helpers_never_follow_planted_links_on_the_host(tmp_path, engine):
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "victim.txt").write_text("host data")
    with DockerSandbox(SandboxSpec(workspace_host=ws, ro_paths=[*host_toolchain_paths(), outside])) as sb:
        assert sb.exec(["sh", "-c", f"ln -s {outside} ~/dir && ln -s {outside}/victim.txt ~/file && "
                        f"ln -s {outside}/victim.txt link && mkfifo ~/fifo"]).ok
        for path in ("/root/dir/new.txt", "/root/file", f"{sb.spec.workspace_target}/link"):
            with pytest.raises(SandboxError):  # resolved inside the sandbox: a read-only file
                sb.write_file(path, "owned")
        assert sb.read_file("/root/file") == b"host data"  # what the sandbox itself may read, nothing more
        sb.file_timeout_s = 3
        for bad in ("/root/fifo", "/root/missing"):
            t0 = time.monotonic()
            with pytest.raises(SandboxError):
                sb.read_file(bad)
            assert time.monotonic() - t0 < 30
    assert (outside / "victim.txt").read_text() == "host data" and sorted(os.listdir(outside)) == ["victim.txt"]
    assert os.readlink(ws / "link") == f"{outside}/victim.txt"  # links come back as links
