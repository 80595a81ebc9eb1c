"""Attacks on ClawGym's bookkeeping: an agent that tries to crash the record keeping (and so hide its
failure or sink a whole batch), failures blamed on the wrong side, and run outputs others can read.

Everything runs for real: ``clawgym run`` in a subprocess with the mini harness in bwrap and a
scripted policy whose shell steps are the attack (``scripted:file:``), real special files on disk,
a real policy failure behind the real proxy, a real bwrap refusing to start, a real tmpfs that fills.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from clawgym_env.capture.records import CallRecord, EpisodeRecord, read_calls, write_jsonl, write_record
from clawgym_env.envs.runtime import RolloutPool, Runtime
from clawgym_env.errors import CopyLimitError, PolicyError
from clawgym_env.files.workspace import copy_tree, remove_tree, snapshot
from harness_adapters.mini import MiniAdapter

DEEP_DIRS = "import os\nfor i in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\nopen('leaf', 'w').write('x')\n"
DEEP_REQUEST = """
import json, os, urllib.request
p = {"type": "object"}
for _ in range(300):
    p = {"type": "object", "properties": {"x": p}}
body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": p}}]}
url = os.environ["CLAWGYM_PROXY_URL"] + "/ep/" + os.environ["OPENAI_API_KEY"] + "/v1/chat/completions"
req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
try:
    print(urllib.request.urlopen(req, timeout=60).status)
except Exception as exc:
    print("deep request:", exc)
"""
ATTACK = [
    {"tool": "bash", "command": "mkfifo pipe"},
    {"tool": "bash", "command": "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\""},
    {"tool": "bash", "command": "python3 -c \"open(bytes([98, 97, 100, 255, 254]), 'wb').write(b'x')\""},
    {"tool": "bash", "command": "python3 - <<'EOF'\n" + DEEP_DIRS + "EOF"},
    {"tool": "bash", "command": "python3 - <<'EOF'\n" + DEEP_REQUEST + "EOF"},
    {"final": "done"},
]


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_hostile_workspace_is_the_agents_outcome_and_every_episode_has_its_record(tmp_path):
    """A fifo, a unix socket, a non-UTF-8 name, 1,200 nested folders and a 300-deep JSON request:
    today each crashes ``clawgym run`` with no result printed. Now every episode prints its record,
    scored as the agent's outcome (not infra), with private files."""
    script = tmp_path / "attack.json"
    script.write_text(json.dumps({"steps": ATTACK}))
    out = tmp_path / "runs"
    argv = [sys.executable, "-m", "clawgym_cli", "run", "--task", "builtin/csv_total", "--policy",
            f"scripted:file:{script}", "--samples", "2", "--concurrency", "2", "--json", "--out", str(out)]
    try:
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        _check_hostile_run(done)
    finally:  # pytest's own cleanup of old tmp folders recurses: leave no 1,200-deep tree behind
        remove_tree(out)


def _check_hostile_run(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 2, done.stdout[-2000:]
    for line in lines:
        assert line["status"] not in ("infra_error", "reward_invalid"), (line["status"], line["error"])
        assert line["reward"] < 1.0 and line["num_calls"] >= 5
        ep = Path(line["episode_dir"])
        assert _mode(ep) == 0o700 and _mode(ep / "episode.json") == 0o600 and _mode(ep / "calls.jsonl") == 0o600
        rec = EpisodeRecord.model_validate_json((ep / "episode.json").read_text())
        paths = {c.path for c in rec.workspace_changes}
        assert "bad\\xff\\xfe" in paths, sorted(paths)[:10]
        assert "/".join(["d"] * 1200) + "/leaf" in paths
        assert not (ep / "workspace").exists(), "the deep workspace was deleted"
        read_calls(ep / "calls.jsonl")  # every captured call reads back


def test_record_writers_survive_deep_values_lone_surrogates_and_echoed_secrets(tmp_path, monkeypatch):
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("CLAWGYM_UPSTREAM_API_KEY", secret)
    deep: dict = {}
    cur = deep
    for _ in range(5000):
        cur["x"] = {}
        cur = cur["x"]
    call = CallRecord(episode_id="e", call_index=0, dialect="openai_chat", path="/v1/chat/completions",
                      stream=False, request={"tools": deep, "note": "bad \udcff name", "key": secret},
                      prompt_token_ids=[1, 2], output_token_ids=[3], output_logprobs=[-0.5], finish_reason="stop")
    path = write_jsonl(tmp_path / "calls.jsonl", [call])
    (back,) = read_calls(path)
    assert back.output_token_ids == [3] and back.prompt_token_ids == [1, 2]
    assert secret not in path.read_text() and "<redacted>" in path.read_text()
    assert "clawgym_cut" in back.request and back.request["note"] == "bad \\xff name"
    assert _mode(path) == 0o600
    rec = EpisodeRecord(episode_id="e", task_id="t", harness="mini", policy="p", status="harness_error",
                        error=f"upstream said: invalid key {secret}", final_message="x\udcff",
                        logs={"stderr": f"Authorization: Bearer {secret}"})
    ep = write_record(tmp_path / "episode.json", rec)
    text = ep.read_text()
    assert secret not in text and text.count("<redacted>") == 2 and _mode(ep) == 0o600
    assert EpisodeRecord.model_validate_json(text).final_message == "x\\xff"


def _deep_dirs(root: Path, depth: int) -> bytes:
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    w = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(w, b"leaf")
    os.close(w)
    os.close(fd)
    return b"/".join([b"d"] * depth) + b"/leaf"


def test_copy_tree_and_snapshot_hold_on_a_hostile_tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    os.chmod(src / "a.txt", 0o4755)
    os.mkfifo(src / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "sock"))
    (src / os.fsdecode(b"bad\xff")).write_bytes(b"x")
    os.symlink("/etc/shadow", src / "shadow")
    os.symlink("a.txt", src / "inside")
    with open(src / "sparse", "wb") as fh:
        fh.truncate(3 << 30)
        fh.seek(1 << 30)
        fh.write(b"data")
    deep = _deep_dirs(src, 1200)  # deeper than PATH_MAX allows as one path

    report = copy_tree(src, tmp_path / "dst")
    dst = tmp_path / "dst"
    assert sorted(k for _, k in report.skipped) == ["fifo", "socket"]
    assert os.readlink(dst / "shadow") == "/etc/shadow", "links are copied as links, never followed"
    assert _mode(dst / "a.txt") == 0o755 and report.stripped_modes == ["a.txt"]
    assert (dst / os.fsdecode(b"bad\xff")).read_bytes() == b"x"
    assert os.stat(dst / "sparse").st_size == 3 << 30 and os.stat(dst / "sparse").st_blocks * 512 < 1 << 20
    assert report.bytes_copied < 1 << 20
    snap = snapshot(dst)
    assert snap[deep.decode()].kind == "file" and snap["bad\\xff"].kind == "file"
    assert snap["shadow"].kind == "symlink" and "pipe" not in snap
    assert snapshot(src)["pipe"].kind == "fifo" and snapshot(src)["sock"].kind == "socket"
    json.dumps(list(snap))  # every name is valid text

    inside = copy_tree(src, tmp_path / "dst2", links_inside=src)
    assert inside.refused_links == [("shadow", "link target leaves the allowed root")]
    assert inside.materialised == ["inside"] and (tmp_path / "dst2" / "inside").read_text() == "hello"
    assert not (tmp_path / "dst2" / "shadow").exists()
    with pytest.raises(CopyLimitError, match="limit of 100 bytes"):
        copy_tree(src, tmp_path / "dst3", max_bytes=100)
    for d in ("dst", "dst2", "dst3", "src"):
        remove_tree(tmp_path / d)
        assert not (tmp_path / d).exists()
    sock.close()


class FailingPolicy:
    """The scripted expert behind a backend that fails from its ``fail_from``-th generate on."""

    def __init__(self, fail_from: int) -> None:
        from clawgym_env.policy import make_policy

        self.inner = make_policy("scripted:expert")
        self.fail_from, self.calls = fail_from, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompt_ids, params, ctx):
        self.calls += 1
        if self.calls >= self.fail_from:
            raise PolicyError("backend answered 503 Service Unavailable (test)")
        return self.inner.generate(prompt_ids, params, ctx)


def test_policy_failure_mid_episode_is_infra_at_the_policy_boundary(builtin_suite, tmp_path):
    task = next(t for t in builtin_suite.tasks if t.id == "csv_total")
    with Runtime(FailingPolicy(fail_from=2), out_dir=tmp_path) as rt:
        res = rt.run(task, MiniAdapter())
    rec = res.record
    assert rec.num_calls == 1
    assert (rec.status, rec.failure_boundary) == ("infra_error", "policy"), (rec.status, rec.error, rec.logs)
    assert "503" in rec.error and rec.is_infra_failure and not rec.is_task_outcome


class NoSuchCwdMini(MiniAdapter):
    """mini launched in a folder that does not exist: bwrap itself refuses to start it."""

    def launch(self, task, endpoint, *, home):
        spec = super().launch(task, endpoint, home=home)
        spec.cwd = "/no/such/folder"
        return spec


def test_bwrap_failing_before_the_harness_runs_is_a_sandbox_failure(builtin_suite, tmp_path):
    with Runtime("scripted:expert", out_dir=tmp_path) as rt:
        rec = rt.run(builtin_suite.tasks[0], NoSuchCwdMini()).record
    assert (rec.status, rec.failure_boundary) == ("infra_error", "sandbox"), (rec.status, rec.error, rec.logs)
    assert "bwrap" in rec.error and rec.num_calls == 0


class ExplodingMini(MiniAdapter):
    """mini whose output reader raises once, on the second episode to finish (a bug in an adapter)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock, self.seen = threading.Lock(), 0

    def read_output(self, stdout, stderr):
        with self.lock:
            self.seen += 1
            boom = self.seen == 2
        if boom:
            raise RuntimeError("adapter bug (test)")
        return super().read_output(stdout, stderr)


def test_rollout_pool_gives_every_job_exactly_one_record(builtin_suite, tmp_path):
    tasks = builtin_suite.tasks[:3]
    with Runtime("scripted:expert", out_dir=tmp_path) as rt:
        results = RolloutPool(rt, concurrency=3, progress=False).run(tasks, ExplodingMini())
    assert [r.record.task_id for r in results] == [t.id for t in tasks]
    statuses = sorted((r.record.status, r.record.failure_boundary) for r in results)
    assert statuses == [("infra_error", "internal"), ("ok", None), ("ok", None)], statuses
    assert any("adapter bug" in (r.record.error or "") for r in results)


def test_failure_classification_rules():
    """The cases the real episodes above cannot stage cheaply: the proxy gone, a failure the harness
    recovered from, a client error the agent caused."""
    from clawgym_env.failures import classify_run
    from clawgym_env.proxy.sessions import CallFailure

    fail = CallFailure(status=502, code="policy_error", message="backend down", boundary="policy", at=10.0)
    gone = classify_run(returncode=1, timed_out=False, final_message=None, num_calls=3, proxy_running=False)
    assert (gone.status, gone.boundary) == ("infra_error", "proxy")
    recovered = classify_run(returncode=0, timed_out=False, final_message="done", num_calls=4, last_call_end=11.0,
                             call_failures=[fail])
    assert (recovered.status, recovered.boundary) == ("ok", None)
    not_recovered = classify_run(returncode=0, timed_out=False, final_message="done", num_calls=4,
                                 last_call_end=9.0, call_failures=[fail])
    assert (not_recovered.status, not_recovered.boundary) == ("infra_error", "policy")
    client = CallFailure(status=400, code="invalid_request_error", message="bad", boundary="client", at=10.0)
    agents = classify_run(returncode=1, timed_out=False, final_message=None, num_calls=2, call_failures=[client])
    assert (agents.status, agents.boundary) == ("harness_error", "harness")


def test_a_hard_link_bomb_is_copied_and_fingerprinted_once(tmp_path):
    """One 32 MiB file hard-linked 500 times (16 GB if expanded): every copy of the workspace (grading,
    copy-back, kept workspaces) keeps the links, so it costs 32 MiB; the snapshot reads the data once."""
    src = tmp_path / "ws"
    (src / "d").mkdir(parents=True)
    first = src / "big.bin"
    with open(first, "wb") as f:
        for _ in range(32):
            f.write(os.urandom(1 << 20))
    for i in range(500):
        os.link(first, src / "d" / f"link{i}")
    report = copy_tree(src, tmp_path / "copy", max_bytes=64 << 20)  # expanded, this raises CopyLimitError
    assert report.bytes_copied == 32 << 20 and report.hard_links == 500
    st = (tmp_path / "copy" / "big.bin").stat()
    assert st.st_nlink == 501 and (tmp_path / "copy" / "d" / "link7").stat().st_ino == st.st_ino
    snap = snapshot(src)
    assert len(snap) == 501 and len({e.digest for e in snap.values()}) == 1
