"""How long ``clawgym audit`` takes on a suite, and where the time goes.

Runs the audit (:func:`leaderboards.audit.run_audit`, the default kit unless ``--attack`` narrows it) and
prints the wall time, the number of episodes, then per attack the episodes played and their mean and
longest wall time, with the machine's load average before and after (the audit shares the machine's
cores with whatever else runs). Example: ``python bench/bench_audit.py --suite builtin --harness mini
--concurrency 2``; ``--task csv_total fix_failing_test`` for a few tasks, ``--inodes 20000`` for a
smaller flood.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from leaderboards.audit import ATTACKS, DEFAULT_INODES, AuditOptions, run_audit
    from tasks import load_suite

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="builtin")
    ap.add_argument("--task", nargs="+", action="extend")
    ap.add_argument("--harness", default="mini")
    ap.add_argument("--sandbox", default="bwrap")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--heavy-concurrency", type=int, default=1)
    ap.add_argument("--attack", nargs="+", action="extend", choices=ATTACKS)
    ap.add_argument("--inodes", type=int, default=DEFAULT_INODES)
    args = ap.parse_args()

    suite = load_suite(args.suite)
    tasks = [suite.get(t) for t in args.task] if args.task else list(suite.tasks)
    attacks = tuple(a for a in ATTACKS if a in args.attack) if args.attack else ATTACKS
    load_before = os.getloadavg()
    report = run_audit(suite.name, tasks, AuditOptions(
        harness=args.harness, sandbox=args.sandbox, concurrency=args.concurrency,
        heavy_concurrency=args.heavy_concurrency, attacks=attacks, inodes=args.inodes))
    load_after = os.getloadavg()
    print(f"{suite.name}: {len(tasks)} tasks through {report.harness} ({report.sandbox}), concurrency "
          f"{args.concurrency} (heavy {args.heavy_concurrency}), {os.cpu_count()} cores, load "
          f"{load_before[0]:.1f} before / {load_after[0]:.1f} after")
    print(f"wall {report.wall_s:.0f} s, {report.episodes} episodes, hackable {report.hackable}, "
          f"incomplete {report.incomplete}")
    print(f"{'attack':24} {'episodes':>8} {'mean s':>8} {'max s':>8}")
    for attack, walls in sorted(report.episode_walls.items(), key=lambda kv: -sum(kv[1])):
        print(f"{attack:24} {len(walls):8d} {sum(walls) / len(walls):8.1f} {max(walls):8.1f}")


if __name__ == "__main__":
    main()
