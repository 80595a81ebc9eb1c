"""`clawgym eval --ray-address` on a 2-node local Ray cluster: a rollout worker killed mid-run loses nothing.

Slow (a Ray cluster and two rollout workers start); skips with the reason without Ray.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray", reason="the Ray backend needs Ray: pip install 'clawgym[ray]'")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    c.add_node(num_cpus=2)
    try:
        yield c
    finally:
        c.shutdown()


def _rows(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _worker_pids():
    out = subprocess.run(["pgrep", "-f", "ray::RolloutWorker"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _eval(cluster, out, *extra):
    argv = [sys.executable, "-m", "clawgym_cli", "eval", "--suite", "builtin", "--harness", "mini", "--policy",
            "scripted:expert", "--limit", "4", "--samples", "3", "--out", str(out), "--no-progress",
            "--ray-address", cluster.address, "--max-episodes-per-node", "2", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_eval_on_ray_survives_a_killed_worker_and_resumes(cluster, tmp_path):
    out = tmp_path / "r.jsonl"
    proc = _eval(cluster, out)
    killed = None
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        pids = _worker_pids()
        if killed is None and len(_rows(out)) >= 2 and len(pids) >= 2:
            killed = pids[0]
            os.kill(killed, signal.SIGKILL)  # a rollout worker dies with episodes in flight
        time.sleep(0.2)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    assert killed is not None, "the run ended before a worker could be killed"
    rows = _rows(out)
    keys = collections.Counter((r["task_id"], r["sample"]) for r in rows)
    assert len(keys) == 12 and set(keys.values()) == {1}, keys  # every episode exactly once
    assert all(r["status"] == "ok" and r["reward"] == 1.0 for r in rows), [(r["status"], r["error"]) for r in rows]
    assert "12 episode(s) written" in stdout
    again = _eval(cluster, out)  # resumable: nothing left to run
    stdout, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr[-3000:]
    assert "0 episode(s) written, 12 already done of 12" in stdout and len(_rows(out)) == 12
