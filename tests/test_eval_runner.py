"""The eval runner: resumable JSONL results, infra failures retried then reported, host-side judges.

Everything is real: the ``clawgym eval`` CLI in a subprocess, the mini harness in bwrap, the
scripted expert behind the proxy; judges are ``tasks.judge.JudgeClient`` talking over HTTP to a
second proxy whose scripted policy answers the verdict.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clawgym_env.errors import SandboxError, TaskError
from leaderboards.metrics import summarize
from leaderboards.run import ResultsFile, needs_host_scoring, run_eval
from leaderboards.schema import ResultRow, latest_by_key, read_results

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tasks" / "fixtures"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_eval_killed_mid_run_and_restarted_writes_each_episode_once(tmp_path):
    out = tmp_path / "results.jsonl"
    argv = [sys.executable, "-m", "clawgym_cli", "eval", "--suite", "builtin", "--harness", "mini",
            "--policy", "scripted:expert", "--samples", "2", "--concurrency", "2", "--limit", "2",
            "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_text().count("\n") >= 1:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"eval ended before it could be killed: {proc.communicate()[1].decode()[-2000:]}"
        os.killpg(proc.pid, signal.SIGKILL)  # the whole run, sandboxes included, mid-flight
    finally:
        proc.wait(timeout=60)
    first = _lines(out)
    assert 1 <= len(first) < 4, "the kill must land mid-run"
    episodes = tmp_path / "results-episodes"
    (dead,) = (episodes / ".runs").iterdir()  # the killed run's lock folder names its temporary folder
    dead_tmp = Path(json.loads((dead / "owner.json").read_text())["tmp"])
    assert dead_tmp.is_dir(), "the killed run left its temporary folder (sandbox roots) behind"
    unfinished = [d for d in episodes.iterdir() if d.name != ".runs" and not (d / "episode.json").exists()]
    assert unfinished, "the kill left episodes in flight"
    with out.open("a") as fh:  # as if the kill had also cut a write short
        fh.write('{"schema_version": 1, "suite": "builtin", "task_id": "csv_to')

    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{4 - len(first)} episode(s) written, {len(first)} already done of 4" in done.stdout
    assert "repaired a torn last line" in done.stdout
    rows = [ResultRow.model_validate(d) for d in _lines(out)]  # every line parses: the torn one is gone
    keys = [r.key for r in rows]
    assert len(keys) == len(set(keys)) == 4
    assert {(r.task_id, r.sample) for r in rows} == {(t, s) for t in {r.task_id for r in rows} for s in (0, 1)}
    assert [r.model_dump() for r in rows[:len(first)]] == \
        [ResultRow.model_validate(d).model_dump() for d in first], "finished rows are never rewritten"
    for r in rows:
        assert (r.status, r.reward, r.attempts) == ("ok", 1.0, 1), (r.task_id, r.error)
        assert r.harness == "mini" and r.policy == "scripted:expert" and r.suite == "builtin"
        assert r.category and r.num_calls >= 2 and r.token_exact is True
        assert Path(r.calls_path).is_file() and Path(r.episode_dir, "episode.json").is_file()
    # the restart reaped every leftover of the killed run: no orphan workspace, temp folder or cgroup
    assert not dead_tmp.exists() and list((episodes / ".runs").iterdir()) == []
    referenced = {Path(r.episode_dir) for r in rows}
    on_disk = {d for d in episodes.iterdir() if d.name != ".runs"}
    assert on_disk == referenced, sorted(on_disk ^ referenced)
    assert not any((d / "workspace").exists() for d in on_disk)
    assert _mode(out) == 0o600 and all(_mode(d) == 0o700 for d in on_disk)
    dead_pid = dead.name.split("-")[0]
    assert not [p for p in _cgroup_dirs() if p.name.startswith(f"clawgym-{dead_pid}-")]
    again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "0 episode(s) written, 4 already done of 4" in again.stdout and len(_lines(out)) == 4


def _mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o7777


def _cgroup_dirs() -> list[Path]:
    from clawgym_env.sandbox.bwrap.hostside import _hierarchy_base, _own_cgroups

    v1, v2 = _own_cgroups()
    bases = {b[0] for c in ("memory", "pids", "cpu") if (b := _hierarchy_base(c, v1, v2)) is not None}
    return [d for base in bases for d in base.iterdir() if d.is_dir()]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tiny tmpfs needs root (CI runs as root)")
def test_full_disk_under_results_is_a_clear_error_without_a_torn_line(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)], check=True)
    try:
        out = disk / "results.jsonl"
        good = ResultRow(suite="s", task_id="t0", harness="mini", policy="p", sample=0, status="ok", reward=1.0)
        with ResultsFile(out) as rf:
            rf.append(good)
            size = out.stat().st_size
            with (disk / "filler").open("wb", buffering=0) as fh:  # fill the disk to its last page
                try:
                    while True:
                        fh.write(b"\0" * 1024)
                except OSError:
                    pass
            big = good.model_copy(update={"task_id": "t1", "error": "x" * 4000})
            from leaderboards.run import ResultsWriteError

            with pytest.raises(ResultsWriteError, match="Free space on that disk"):
                rf.append(big)
        assert out.read_bytes().endswith(b"\n") and out.stat().st_size == size, "no torn line"
        (disk / "filler").unlink()
        with ResultsFile(out) as rf:  # a restart sees exactly the finished row, nothing repaired
            assert [r.key for r in rf.rows] == [good.key] and not rf.repaired_tail
    finally:
        subprocess.run(["umount", str(disk)], check=False)


class BrokenSandbox:
    """A backend that cannot start, like one whose engine is missing."""

    starts = 0
    _lock = threading.Lock()

    def __init__(self, spec):
        self.spec = spec

    def __enter__(self):
        with BrokenSandbox._lock:
            BrokenSandbox.starts += 1
        raise SandboxError("cannot start (test)")

    def __exit__(self, *exc):
        return None


class FlakySandbox:
    """Fails its first ``fail_first`` starts (agent or verifier sandbox alike), then is bwrap."""

    fail_first = 2
    starts = 0
    _lock = threading.Lock()

    def __init__(self, spec):
        from clawgym_env.sandbox.bwrap.sandbox import BwrapSandbox

        self._inner = BwrapSandbox(spec)

    def __enter__(self):
        with FlakySandbox._lock:
            FlakySandbox.starts += 1
            n = FlakySandbox.starts
        if n <= FlakySandbox.fail_first:
            raise SandboxError(f"transient start failure #{n} (test)")
        self._inner.__enter__()
        return self._inner

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)


@pytest.fixture
def test_backends():
    from clawgym_env.plugins import sandboxes

    BrokenSandbox.starts = FlakySandbox.starts = 0
    with sandboxes.registered("broken", BrokenSandbox), sandboxes.registered("flaky", FlakySandbox):
        yield


def test_infra_failures_are_retried_then_reported_never_scored(tmp_path, test_backends):
    out = tmp_path / "r.jsonl"
    s = run_eval("builtin", harness="mini", policy="scripted:expert", out=out, limit=2, samples=1,
                 concurrency=2, sandbox="broken", retries=2, retry_backoff_s=0, progress=False)
    assert (s.ran, s.infra_failures, s.retried) == (2, 2, 4)
    assert BrokenSandbox.starts == 6, "each episode: 1 try + 2 retries"
    rows = read_results(out).rows
    assert len(rows) == 2 and all(r.status == "infra_error" and r.attempts == 3 for r in rows)
    assert all("after 3 attempt(s)" in r.error and "cannot start" in r.error for r in rows)
    entry = summarize(rows)[0]
    assert entry.infra_failures == 2 and entry.tasks == 0 and entry.episodes == 0 and math.isnan(entry.pass1)

    again = run_eval("builtin", harness="mini", policy="scripted:expert", out=out, limit=2, sandbox="broken",
                     retries=2, retry_backoff_s=0, progress=False)
    assert (again.ran, again.skipped) == (0, 2), "reported failures are done unless asked to rerun"

    # the engine is back: --rerun-infra appends fresh rows, and readers keep the latest per key
    rerun = run_eval("builtin", harness="mini", policy="scripted:expert", out=out, limit=2, sandbox="bwrap",
                     rerun_infra=True, progress=False)
    assert (rerun.ran, rerun.infra_failures) == (2, 0)
    latest = latest_by_key(read_results(out).rows)
    assert len(read_results(out).rows) == 4 and len(latest) == 2
    assert all(r.status == "ok" and r.reward == 1.0 for r in latest)
    assert summarize(latest)[0].pass1 == 1.0 and summarize(read_results(out).rows)[0].infra_failures == 0


def test_transient_infra_failure_recovers_on_retry(tmp_path, test_backends):
    out = tmp_path / "r.jsonl"
    s = run_eval("builtin", harness="mini", policy="scripted:expert", out=out, limit=1, concurrency=1,
                 sandbox="flaky", retries=2, retry_backoff_s=0, progress=False)
    (row,) = read_results(out).rows
    assert (row.status, row.reward, row.attempts) == ("ok", 1.0, 3), row.error
    assert (s.retried, s.infra_failures) == (2, 0)


def test_results_file_repairs_tail_and_is_exclusive(tmp_path):
    good = ResultRow(suite="s", task_id="t", harness="h", policy="p", sample=0, status="ok", reward=1.0)
    path = tmp_path / "r.jsonl"
    path.write_text(good.model_dump_json() + "\n" + good.model_copy(update={"sample": 1}).model_dump_json())
    with ResultsFile(path) as f:  # a complete last row whose newline was lost is kept
        assert [r.sample for r in f.rows] == [0, 1] and f.repaired_tail
        with pytest.raises(TaskError, match="another evaluation run"):
            ResultsFile(path).__enter__()
    assert path.read_text().endswith("\n") and len(_lines(path)) == 2
    path.write_text(path.read_text() + '{"suite": "s", "task_')
    with ResultsFile(path) as f:  # a torn one is cut
        assert len(f.rows) == 2 and f.bad_lines == 0
        f.append(good.model_copy(update={"sample": 2}))
    assert [d["sample"] for d in _lines(path)] == [0, 1, 2]


# -- host-side judges ------------------------------------------------------------------------

@pytest.fixture
def judge_server(tokenizer, tmp_path):
    """Start a proxy whose scripted policy answers every judge call with ``verdict`` (a JSON object)."""
    from clawgym_env.policy.scripted import ScriptedPolicy
    from clawgym_env.proxy.server import ProxyServer
    from tasks.judge import JudgeClient

    servers = []

    def start(verdict: dict):
        script = tmp_path / f"judge{len(servers)}.json"
        script.write_text(json.dumps({"steps": [{"final": json.dumps(verdict)}]}))
        server = ProxyServer(ScriptedPolicy(f"file:{script}", tokenizer=tokenizer)).start()
        servers.append(server)
        session = server.open_episode("judge")
        return JudgeClient(session.base_url(server.url), "judge-model", api_key=session.token), server, session

    yield start
    for s in servers:
        s.stop()


def test_clawgym_bench_hybrid_rubric_scored_on_the_host(tmp_path, judge_server):
    judge, server, session = judge_server({"score": 0.5, "rationale": "half of the rubric is met"})
    out = tmp_path / "r.jsonl"
    s = run_eval(FIXTURES / "clawgym_bench", harness="mini", policy="scripted:noop", out=out, judge=judge,
                 progress=False, retries=0)
    assert s.ran == 2
    rows = {r.task_id: r for r in read_results(out).rows}
    auto, hybrid = rows["task_a1"], rows["task_h1"]
    assert auto.scorer is None and auto.status == "ok"
    assert hybrid.scorer == "tasks.hybrid.hybrid_grade" and hybrid.status == "ok"
    code = hybrid.subscores["code_score"]
    assert hybrid.subscores["rubric_score"] == 0.5
    assert hybrid.reward == pytest.approx(0.7 * code + 0.3 * 0.5)
    assert len(server.close_episode(session.token)) == 1, "one judge call, for the hybrid task only"
    assert not (Path(hybrid.episode_dir) / "workspace").exists(), "the kept workspace is removed after scoring"


def test_jobbench_judged_on_the_host_and_judge_outage_is_infra(tmp_path, judge_server):
    verdict = {"criteria": [{"index": i, "pass": True, "reason": "present"} for i in range(20)], "rubric_pass": True}
    judge, server, session = judge_server(verdict)
    agent = tmp_path / "agent.json"
    agent.write_text(json.dumps({"steps": [
        {"tool": "write_file", "path": "outputs/report.md", "content": "# Report\nTotals reconciled.\n"},
        {"final": "Report written to outputs/report.md"}]}))
    out = tmp_path / "r.jsonl"
    run_eval("jobbench", data=FIXTURES / "jobbench", harness="mini", policy=f"scripted:file:{agent}", out=out,
             judge=judge, limit=1, progress=False, retries=0)
    (row,) = read_results(out).rows
    assert needs_host_scoring(type("T", (), {"grading_type": "jobbench"})()) == "jobbench"
    assert row.scorer == "tasks.jobbench.score_jobbench" and row.status == "ok", row.error
    assert row.reward == 1.0 and row.subscores["earned"] == row.subscores["possible"] > 0
    assert len(server.close_episode(session.token)) >= 1

    from tasks.judge import JudgeClient

    dead = JudgeClient("http://127.0.0.1:9/v1", "judge-model", max_retries=0, timeout=5)
    out2 = tmp_path / "r2.jsonl"
    s = run_eval("jobbench", data=FIXTURES / "jobbench", harness="mini", policy=f"scripted:file:{agent}",
                 out=out2, judge=dead, limit=1, progress=False, retries=1, retry_backoff_s=0)
    (row,) = read_results(out2).rows
    assert row.status == "infra_error" and row.attempts == 2 and s.infra_failures == 1
    assert "host-side scoring failed" in row.error and "unreachable" in row.error


def test_upstream_api_outage_is_infra_not_a_zero(tmp_path, tokenizer):
    from clawgym_env.policy.passthrough.policy import PassthroughPolicy

    policy = PassthroughPolicy("openai", "m", base_url="http://127.0.0.1:9/v1", api_key="k", tokenizer=tokenizer,
                               max_retries=0, timeout=5)
    out = tmp_path / "r.jsonl"
    s = run_eval("builtin", harness="mini", policy=policy, out=out, limit=1, retries=1, retry_backoff_s=0,
                 progress=False)
    (row,) = read_results(out).rows
    assert row.policy == "passthrough:openai:m" and row.status == "infra_error" and row.attempts == 2
    assert row.failure_boundary == "policy" and "upstream openai model 'm' failed" in row.error, row.error
    assert s.infra_failures == 1


def test_run_outputs_are_private_and_secrets_redacted(tmp_path):
    """An answer (or an upstream error) echoing the API key lands redacted in episode.json,
    results.jsonl and the log; every file the run writes is 0600, every folder 0700."""
    secret = "sk-live-" + "9f3c" * 8
    script = tmp_path / "leak.json"
    script.write_text(json.dumps({"steps": [{"final": f"the key is {secret}"}]}))
    out = tmp_path / "results.jsonl"
    env = {**os.environ, "CLAWGYM_UPSTREAM_API_KEY": secret}
    done = subprocess.run([sys.executable, "-m", "clawgym_cli", "-v", "eval", "--suite", "builtin", "--harness",
                           "mini", "--policy", f"scripted:file:{script}", "--limit", "1", "--out", str(out),
                           "--no-progress", "--keep-workspace"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = read_results(out).rows
    ep = Path(row.episode_dir)
    record = json.loads((ep / "episode.json").read_text())
    assert record["final_message"] == "the key is <redacted>"
    for text in (out.read_text(), (ep / "episode.json").read_text(), done.stderr, done.stdout):
        assert secret not in text
    assert _mode(out) == 0o600 and _mode(ep) == 0o700 and _mode(ep.parent) == 0o700
    for path in ep.iterdir():
        if path.is_file():
            assert _mode(path) == 0o600, path
