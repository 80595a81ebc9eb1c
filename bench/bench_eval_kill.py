"""Kill ``clawgym eval`` repeatedly (SIGKILL to its whole process group, mid-episode), restart it
until the suite is done, and check that every episode was written exactly once and that nothing of
the dead runs is left: no orphan workspaces or unfinished episode folders, no temporary folders,
no mounts, no cgroups of dead pids.

    python bench/bench_eval_kill.py [--kills 6] [--limit 14] [--samples 2] [--concurrency 2]

Each kill lands once that start has an episode in flight, plus a random (seeded) 0–6 s, so it
cuts episodes mid-run. Prints one JSON object with the figures; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rows(out: Path) -> list[dict]:
    if not out.exists():
        return []
    rows = []
    for line in out.read_text(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def _cgroups(prefixes: set[str]) -> list[str]:
    from clawgym_env.sandbox.bwrap.hostside import _hierarchy_base, _own_cgroups

    v1, v2 = _own_cgroups()
    bases = {b[0] for c in ("memory", "pids", "cpu") if (b := _hierarchy_base(c, v1, v2)) is not None}
    return [str(d) for base in bases for d in base.iterdir()
            if d.is_dir() and any(d.name.startswith(p) for p in prefixes)]


def _unfinished(episodes: Path) -> list[Path]:
    if not episodes.is_dir():
        return []
    return [d for d in episodes.iterdir() if d.name != ".runs" and not (d / "episode.json").exists()]


def _wait_for_episode_in_flight(proc: subprocess.Popen, episodes: Path, timeout: float = 300) -> None:
    """Until this start has an episode running (a folder without its episode.json) or has ended."""
    before = set(_unfinished(episodes))
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if set(_unfinished(episodes)) - before:
            return
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--limit", type=int, default=14)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", help="default: a fresh temporary folder")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="clawgym-bench-kill-"))
    work.mkdir(parents=True, exist_ok=True)
    out = work / "results.jsonl"
    episodes = work / "results-episodes"
    argv = [sys.executable, "-m", "clawgym_cli", "eval", "--suite", "builtin", "--harness", "mini",
            "--policy", "scripted:expert", "--samples", str(args.samples), "--concurrency", str(args.concurrency),
            "--limit", str(args.limit), "--out", str(out), "--no-progress"]
    total = args.limit * args.samples
    kills, dead_pids, dead_tmps, leftovers_seen, starts = 0, set(), set(), [], 0
    t0 = time.monotonic()
    while True:
        starts += 1
        proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        if kills < args.kills:
            _wait_for_episode_in_flight(proc, episodes)
            time.sleep(rng.uniform(0.0, 6.0))
            if proc.poll() is None and len(_rows(out)) < total:
                runs = list((episodes / ".runs").glob("*/owner.json")) if (episodes / ".runs").exists() else []
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
                dead_pids.add(str(proc.pid))
                for owner in runs:
                    try:
                        dead_tmps.add(json.loads(owner.read_text())["tmp"])
                    except (OSError, ValueError, KeyError):
                        pass
                unfinished = _unfinished(episodes)
                leftovers_seen.append({"rows": len(_rows(out)), "unfinished_episode_dirs": len(unfinished),
                                       "tmp_dirs": sum(Path(t).exists() for t in dead_tmps),
                                       "cgroups": len(_cgroups({f"clawgym-{p}-" for p in dead_pids}))})
                continue
        _, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"eval failed (rc {proc.returncode}): {err.decode()[-3000:]}")
        break
    rows = _rows(out)
    keys = [(r["suite"], r["task_id"], r["harness"], r["policy"], r["sample"]) for r in rows]
    on_disk = {d for d in episodes.iterdir() if d.name != ".runs"}
    referenced = {Path(r["episode_dir"]) for r in rows if r.get("episode_dir")}
    mounts = [ln.split()[4] for ln in open("/proc/self/mountinfo") if any(t in ln for t in dead_tmps)]
    figures = {
        "episodes": total, "rows": len(rows), "distinct_keys": len(set(keys)),
        "duplicates": len(keys) - len(set(keys)), "missing": total - len(set(keys)),
        "statuses": {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})},
        "kills": kills, "starts": starts, "wall_s": round(time.monotonic() - t0, 1),
        "leftovers_right_after_each_kill": leftovers_seen,
        "orphans_after": {
            "unreferenced_episode_dirs": len(on_disk - referenced),
            "workspaces": sum((d / "workspace").exists() for d in on_disk),
            "dead_run_folders": len(list((episodes / ".runs").iterdir())) if (episodes / ".runs").exists() else 0,
            "dead_run_tmp_dirs": sum(Path(t).exists() for t in dead_tmps),
            "mounts_under_dead_tmp": len(mounts),
            "cgroups_of_dead_pids": len(_cgroups({f"clawgym-{p}-" for p in dead_pids})),
        },
        "results_mode": oct(out.stat().st_mode & 0o777),
    }
    print(json.dumps(figures, indent=2))
    ok = figures["duplicates"] == 0 and figures["missing"] == 0 and not any(figures["orphans_after"].values())
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
