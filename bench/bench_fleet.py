"""Rollout scaling, threads vs Ray: 1, 2, 4, 8, 16 concurrent episodes of the same batch, side by side.

    python bench/bench_fleet.py [--levels 1,2,4,8,16] [--rounds 2] [--harness mini] [--policy scripted:expert]

For each concurrency level ``k`` a batch of ``k x --rounds`` builtin-task episodes (``--harness``, the
scripted expert) runs twice, back to back: on the threads backend (``RolloutPool``, ``k`` threads, one
serving proxy) and on a :class:`~clawgym_env.fleet.RayFleet` whose one local node (``--node-cpus``
logical CPUs) runs ``k`` episodes at once. Policy, tokenizer and workers are loaded and a warm-up episode
run before each timed batch, so only the rollouts are timed.

Printed per case (one JSON object per line, then a table):

* ``ep/min`` and ``eff``: episodes per minute, and that over ``k`` times the same backend's ``k = 1``
  rate (1.0 = linear scaling; it falls once the machine's cores are saturated);
* ``cpu``: machine CPU utilisation over the batch, from /proc/stat (all processes: other load on the
  machine shows up here);
* ``ep s``: mean episode ``wall_s`` (the episode's own time: sandbox, harness, grading);
* ``slot ms``: what the backend adds per episode while its slots are busy
  (``wall x k / episodes - mean wall_s``; includes the batch's tail, when fewer than ``k`` run);
* ``ray ms``: the Ray backend's overhead per episode, ``fleet_s - wall_s`` (from dispatch by the
  scheduler to its result back on the driver, minus the episode's own time), split into
  ``call ms`` = ``fleet_s - fleet_worker_s`` (Ray's part: the actor call, moving the task, adapter and
  records through Ray, the scheduler's loop) and ``tail ms`` = ``fleet_worker_s - wall_s`` (time on the
  worker outside ``wall_s``: the episode's record validation and writing and its workspace removal,
  which the threads backend pays too, and the worker's task-folder and install checks);
* ``load``: the machine's 1-minute load average when the case ended (other jobs included).

``--calls N`` measures instead what an idle actor call costs with the fleet's ways of passing an episode's
arguments (``N`` calls each, median and mean ms): the adapter by value or by object reference, with or
without a shipped bundle's reference nested in the call (the fleet sends it with a worker's first episode
of that bundle only).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
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


def _measure(backend: str, slots: int, run: Callable[[], list[Any]]) -> dict[str, Any]:
    busy0, total0 = _cpu_ticks()
    t0 = time.perf_counter()
    results = run()
    wall = time.perf_counter() - t0
    busy1, total1 = _cpu_ticks()
    ep_wall = statistics.mean(r.record.wall_s or 0.0 for r in results)
    fleet = [r.record.timings["fleet_s"] - r.record.wall_s for r in results if "fleet_s" in r.record.timings]
    call = [r.record.timings["fleet_s"] - r.record.timings["fleet_worker_s"] for r in results
            if "fleet_worker_s" in r.record.timings]
    tail = [r.record.timings["fleet_worker_s"] - r.record.wall_s for r in results
            if "fleet_worker_s" in r.record.timings]
    return {"backend": backend, "k": slots, "episodes": len(results), "wall_s": round(wall, 2),
            "episodes_per_min": round(60 * len(results) / wall, 2), "mean_episode_s": round(ep_wall, 2),
            "slot_overhead_ms": round(1000 * (wall * slots / len(results) - ep_wall), 1),
            "ray_overhead_ms": round(1000 * statistics.mean(fleet), 1) if fleet else None,
            "ray_call_ms": round(1000 * statistics.mean(call), 1) if call else None,
            "worker_tail_ms": round(1000 * statistics.mean(tail), 1) if tail else None,
            "load_1min": round(os.getloadavg()[0], 1),
            "cpu_util": round((busy1 - busy0) / max(total1 - total0, 1), 3),
            "statuses": dict(Counter(r.record.status for r in results))}


def _calls(n: int) -> None:
    """Idle actor-call latency by the way the arguments travel (see the module doc)."""
    import ray

    from clawgym_env.fleet.ship import ShippedTask
    from clawgym_env.plugins import load_suite, make_harness

    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
    try:
        @ray.remote(max_concurrency=4)
        class Echo:
            def run(self, task: Any, adapter: Any, kwargs: Any, shipped: Any) -> int:
                return 0

        actor = Echo.remote()  # type: ignore[attr-defined]
        task, adapter = load_suite("builtin").tasks[0], make_harness("mini")
        adapter_ref = ray.put(adapter)
        shipped = ShippedTask("0" * 32, ("/x",), ref=ray.put(b"x" * 20000))
        bare = ShippedTask("0" * 32, ("/x",))
        ray.get(actor.run.remote(task, adapter, {}, None))
        cases = {"adapter by value, bundle hash only": (adapter, bare),
                 "adapter by value, bundle reference": (adapter, shipped),
                 "adapter by reference, bundle hash only": (adapter_ref, bare),
                 "adapter by reference, bundle reference": (adapter_ref, shipped)}
        for name, (a, ship) in cases.items():
            ms = []
            for _ in range(n):
                t0 = time.perf_counter()
                ray.get(actor.run.remote(task, a, {}, ship))
                ms.append(1000 * (time.perf_counter() - t0))
            print(json.dumps({"case": name, "calls": n, "median_ms": round(statistics.median(ms), 2),
                              "mean_ms": round(statistics.mean(ms), 2), "load_1min": round(os.getloadavg()[0], 1)}))
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,2,4,8,16", help="concurrency levels k (comma-separated)")
    ap.add_argument("--rounds", type=int, default=2, help="episodes per slot: each batch has k x rounds episodes")
    ap.add_argument("--node-cpus", type=int, default=16, help="logical CPUs the local Ray node declares")
    ap.add_argument("--harness", default="mini")
    ap.add_argument("--policy", default="scripted:expert")
    ap.add_argument("--skip-threads", action="store_true")
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--calls", type=int, default=0, metavar="N",
                    help="measure idle actor calls instead (N each way of passing the arguments)")
    args = ap.parse_args()
    if args.calls:
        _calls(args.calls)
        return
    levels = [int(x) for x in args.levels.split(",")]

    import ray
    from ray.cluster_utils import Cluster

    from clawgym_env.envs.runtime import RolloutPool, Runtime
    from clawgym_env.fleet import FleetConfig, RayFleet
    from clawgym_env.plugins import load_suite, make_harness

    all_tasks = load_suite("builtin").tasks
    adapter = make_harness(args.harness)
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory(prefix="cg-bench-fleet-") as out:
        cluster = None
        if not args.skip_ray:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.node_cpus})
            ray.init(address=cluster.address, log_to_driver=False)
        try:
            with Runtime(args.policy, out_dir=Path(out) / "threads") as rt:
                rt.run(all_tasks[0], adapter)  # warm-up: policy, tokenizer, proxy
                for k in levels:
                    tasks = [all_tasks[i % len(all_tasks)] for i in range(k * args.rounds)]
                    if not args.skip_threads:
                        pool = RolloutPool(rt, concurrency=k, progress=False)
                        emit(_measure("threads", k, functools.partial(pool.run, tasks, adapter)))
                    if cluster is not None:
                        cfg = FleetConfig(policy=args.policy, out_dir=str(Path(out) / f"ray{k}"),
                                          max_episodes_per_node=k, episode_cpus=args.node_cpus / max(levels))
                        with RayFleet(cfg) as fleet:
                            fleet.run(tasks[:1], adapter)  # warm-up: the worker's first episode
                            emit(_measure("ray", k, functools.partial(fleet.run, tasks, adapter)))
        finally:
            if cluster is not None:
                ray.shutdown()
                cluster.shutdown()
    base = {r["backend"]: r["episodes_per_min"] for r in rows if r["k"] == levels[0]}
    print(f"\n{'backend':<8} {'k':>3} {'eps':>4} {'ep/min':>7} {'eff':>5} {'cpu':>5} {'wall s':>7} {'ep s':>6} "
          f"{'slot ms':>8} {'ray ms':>7} {'call ms':>7} {'tail ms':>7} {'load':>5}  statuses")
    for r in rows:
        eff = r["episodes_per_min"] / (r["k"] / levels[0] * base[r["backend"]]) if base.get(r["backend"]) else 0.0
        ray_ms, call_ms, tail_ms = ("-" if r[key] is None else r[key]
                                    for key in ("ray_overhead_ms", "ray_call_ms", "worker_tail_ms"))
        print(f"{r['backend']:<8} {r['k']:>3} {r['episodes']:>4} {r['episodes_per_min']:>7} {eff:>5.2f} "
              f"{r['cpu_util']:>5} {r['wall_s']:>7} {r['mean_episode_s']:>6} {r['slot_overhead_ms']:>8} "
              f"{ray_ms:>7} {call_ms:>7} {tail_ms:>7} {r['load_1min']:>5}  {r['statuses']}")


if __name__ == "__main__":
    main()
