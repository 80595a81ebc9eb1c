"""Capture long multi-call episodes (>= 10 calls) through a real harness, for the tree benchmarks.

    python bench/capture_long_episodes.py --harness claude-code --episodes 2 --steps 12 --out runs/long-cc

The scripted expert follows a generated script of ``--steps`` tool steps (write a file, run it, read it
back, ...) on the builtin ``csv_total`` workspace, then answers; each episode's ``calls.jsonl`` and
``episode.json`` land under ``--out``. Feed them to ``bench/bench_tree_packing.py --episodes-dir``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from clawgym_env.envs.runtime import RolloutPool, Runtime
from clawgym_env.plugins import make_harness
from tasks import resolve_task


def long_script(steps: int) -> dict:
    out = []
    for i in range(steps):
        kind = i % 3
        if kind == 0:
            script = f"import csv\nrows = list(csv.DictReader(open('orders.csv')))\nprint({i}, len(rows))\n"
            out.append({"tool": "write_file", "path": f"notes/step_{i}.py", "content": script})
        elif kind == 1:
            out.append({"tool": "bash", "command": f"python3 notes/step_{i - 1}.py > notes/out_{i}.txt; ls notes"})
        else:
            out.append({"tool": "read_file", "path": f"notes/out_{i - 1}.txt"})
    out.append({"final": f"Ran {steps} steps."})
    return {"steps": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--harness", default="claude-code")
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--task", default="builtin/csv_total")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    script = Path(tempfile.mkdtemp(prefix="clawgym-long-")) / "script.json"
    script.write_text(json.dumps(long_script(args.steps)))
    adapter = make_harness(args.harness)
    adapter.install()
    task = resolve_task(args.task)
    with Runtime(f"scripted:file:{script}", out_dir=args.out) as rt:
        results = RolloutPool(rt, concurrency=2, progress=False).run([task], adapter, samples=args.episodes)
    for r in results:
        print(f"{r.record.episode_id}: {r.record.status}, {r.record.num_calls} calls -> {r.record.calls_path}")


if __name__ == "__main__":
    main()
