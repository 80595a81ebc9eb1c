"""Rollout throughput, threads vs Ray: episodes/s of the same batch on 1 and 2 local Ray "nodes".

    python bench/bench_fleet.py [--tasks 8] [--samples 2] [--per-node 2] [--harness mini] [--policy scripted:expert]

Runs ``--tasks`` builtin tasks x ``--samples`` through the ``mini`` harness and the scripted expert
four ways, each after a warm-up episode (policy, tokenizer and workers already loaded, so only the
rollouts are timed): the threads backend at ``--per-node`` and at twice that, and a
:class:`~clawgym_env.fleet.RayFleet` on a local ``ray.cluster_utils.Cluster`` of one node and of two
nodes (``--per-node`` episodes each, ``--node-cpus`` CPUs each). On one machine the "nodes" share
its cores, so two nodes measure the fleet's overhead and scheduling, not more hardware.

Printed per case (one JSON object per line, then a table): episodes/s, wall time, mean episode
``wall_s``, the slot-time overhead per episode (``wall x slots / episodes - mean wall_s``: what the
backend adds around each episode while slots are busy), machine CPU utilisation (from /proc/stat,
all processes: another load on the machine shows up here), and the statuses.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _measure(name: str, slots: int, run: Callable[[], list[Any]]) -> dict[str, Any]:
    busy0, total0 = _cpu_ticks()
    t0 = time.perf_counter()
    results = run()
    wall = time.perf_counter() - t0
    busy1, total1 = _cpu_ticks()
    ep_wall = statistics.mean(r.record.wall_s or 0.0 for r in results)
    return {"case": name, "episodes": len(results), "slots": slots, "wall_s": round(wall, 2),
            "episodes_per_s": round(len(results) / wall, 3), "episodes_per_min": round(60 * len(results) / wall, 1),
            "mean_episode_s": round(ep_wall, 2),
            "overhead_ms_per_episode": round(1000 * (wall * slots / len(results) - ep_wall), 1),
            "cpu_util": round((busy1 - busy0) / max(total1 - total0, 1), 3),
            "statuses": dict(Counter(r.record.status for r in results))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=8, help="builtin tasks in the batch")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--per-node", type=int, default=2, help="episodes at once per node (threads: per 'node')")
    ap.add_argument("--node-cpus", type=int, default=2, help="CPUs each local Ray node declares")
    ap.add_argument("--harness", default="mini")
    ap.add_argument("--policy", default="scripted:expert")
    ap.add_argument("--skip-threads", action="store_true")
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from clawgym_env.fleet import FleetConfig, RayFleet
    from clawgym_env.plugins import load_suite, make_harness
    from clawgym_env.runtime import RolloutPool, Runtime

    tasks = load_suite("builtin").tasks[:args.tasks]
    adapter = make_harness(args.harness)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cg-bench-fleet-") as out:
        if not args.skip_threads:
            with Runtime(args.policy, out_dir=Path(out) / "threads") as rt:
                rt.run(tasks[0], adapter)  # warm-up
                for k in (1, 2):
                    slots = k * args.per_node
                    pool = RolloutPool(rt, concurrency=slots, progress=False)
                    rows.append(_measure(f"threads x{slots}", slots,
                                         functools.partial(pool.run, tasks, adapter, samples=args.samples)))
                    print(json.dumps(rows[-1]), flush=True)
        for nodes in (1, 2):
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.node_cpus})
            for _ in range(nodes - 1):
                cluster.add_node(num_cpus=args.node_cpus)
            ray.init(address=cluster.address, log_to_driver=False)
            try:
                cfg = FleetConfig(policy=args.policy, out_dir=str(Path(out) / f"ray{nodes}"),
                                  max_episodes_per_node=args.per_node, episode_cpus=args.node_cpus / args.per_node)
                with RayFleet(cfg) as fleet:
                    assert len(fleet.workers) == nodes, [w.info for w in fleet.workers]
                    fleet.run(tasks[:1], adapter, samples=nodes)  # warm-up: every worker's first episode
                    rows.append(_measure(f"ray {nodes} node(s) x{args.per_node}", nodes * args.per_node,
                                         functools.partial(fleet.run, tasks, adapter, samples=args.samples)))
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                ray.shutdown()
                cluster.shutdown()
    print(f"\n{'case':<24} {'ep/s':>6} {'ep/min':>7} {'wall s':>7} {'ep s':>6} {'ovh ms':>7} {'cpu':>5}  statuses")
    for r in rows:
        print(f"{r['case']:<24} {r['episodes_per_s']:>6} {r['episodes_per_min']:>7} {r['wall_s']:>7} "
              f"{r['mean_episode_s']:>6} {r['overhead_ms_per_episode']:>7} {r['cpu_util']:>5}  {r['statuses']}")


if __name__ == "__main__":
    main()
