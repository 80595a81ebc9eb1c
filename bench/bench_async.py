"""Benchmark async, off-policy rollouts against synchronous GRPO on the same budget.

Every mode runs the same number of steps with the same groups (``--groups`` tasks x ``--group-size`` episodes,
the same seeded draws) of real episodes: the ``mini`` harness in the bubblewrap sandbox, a tiny random Qwen3
on the real tokenizer served in-process, graded by a ``reward.sh`` that scores the parity of the final
answer's length (so a random policy gets mixed rewards and real updates happen). Each step's groups are
trained with the real GRPO update (:func:`trainers.grpo.train.grpo_update`) and the weights pushed to the serving
copy (:class:`trainers.scale.weight_sync.InProcessSync`). Modes: ``sync`` (``max_staleness=0``: rollouts, then training)
and ``async1``/``async2`` (:class:`trainers.rollouts.ahead.RolloutAhead` collecting up to 1 or 2 steps ahead
while the trainer updates).

Printed side by side: wall time per step (whole run / steps, the first step's fill included), the mean rollout
(``collect``) and update times, the mean version lag of the calls trained, stale episodes dropped, and the
rollout and train utilisation (share of the wall time each side was busy; first step left out). ``--repeat N``
runs every mode N times in rotated order and shows means (and each run's step time). The overlap gains most
when rollouts and training take similar times and do not compete for the same cores;
``--hidden``/``--layers``/``--update-epochs`` make training heavier. Example: ``python bench/bench_async.py
--steps 6 --modes sync,async1,async2``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REWARD_SH = """#!/usr/bin/env bash
set -euo pipefail
python3 -c 'import json, os
p = json.load(open(os.environ["OPENCLAW_REWARD_PAYLOAD"]))
print(1.0 if len(p.get("final_message") or "") % 2 == 0 else 0.0)'
"""


def make_suite(root: Path, n: int) -> Path:
    """``n`` parity tasks (one model call each at most two turns)."""
    for i in range(n):
        d = root / f"parity_{i}"
        (d / "reward").mkdir(parents=True)
        (d / "data_entry.json").write_text(json.dumps({
            "task_id": f"parity_{i}", "user_query": f"Say something ({i}).",
            "input_mount_dir": "/root/.openclaw/workspace", "metadata": {"grading_type": "automated"},
            "limits": {"timeout_s": 60, "max_turns": 2, "reward_timeout_s": 30}}))
        (d / "reward" / "reward.sh").write_text(REWARD_SH)
    return root


def run_mode(name: str, staleness: int, opts: argparse.Namespace, suite: Path, out: Path) -> dict:
    """One run of ``opts.steps`` GRPO steps; returns its figures."""
    import torch

    from clawgym_env.envs.runtime import Runtime
    from tasks import load_suite
    from trainers.batch.tree_batch import make_groups, pack_groups
    from trainers.grpo import train as grpo
    from trainers.policy import PolicyConfig, TrainablePolicy
    from trainers.rollouts.ahead import AsyncConfig, RolloutAhead, StepBatch, jobs_for
    from trainers.rollouts.sync import run_jobs
    from trainers.run_args import LogArgs
    from trainers.scale.weight_sync import InProcessSync

    torch.manual_seed(0)
    args = grpo.Args(out_dir=str(out), suite=str(suite), steps=opts.steps, groups_per_step=opts.groups,
                     group_size=opts.group_size, concurrency=opts.concurrency, max_tokens=opts.max_tokens,
                     learning_rate=1e-3, update_epochs=opts.update_epochs, log=LogArgs(progress=False),
                     policy=PolicyConfig(model="tiny", seed=1, tiny_hidden_size=opts.hidden, tiny_layers=opts.layers,
                                         tiny_intermediate=opts.hidden * 2))
    tasks = list(load_suite(args.suite).tasks)
    policy = TrainablePolicy(args.policy)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=args.learning_rate)
    sync = InProcessSync.for_policy(policy)
    version = sync.push(policy, 1)  # from 1: a generation reporting version 0 reads as "unknown" to the proxy
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    cfg = AsyncConfig(max_staleness=staleness)
    rows: list[dict[str, Any]] = []
    with Runtime(sync.serving, sandbox="bwrap", out_dir=out / "episodes") as rt:
        def run(jobs):
            return run_jobs(rt, jobs, group_size=args.group_size, sampling=sampling, concurrency=args.concurrency,
                            policy_version=None if staleness else version)

        def collect(step: int) -> StepBatch:
            results, groups, refill = grpo.collect_groups(args, tasks, step, run)
            return StepBatch(step, results, groups, refill)

        regroup = lambda eps: make_groups(eps, normalize_std=args.normalize_std)  # noqa: E731
        t_run = time.perf_counter()
        with RolloutAhead(collect, cfg, start=1, stop=args.steps, regroup=regroup,
                          rerun=lambda keys: run(jobs_for(keys, tasks))) as ahead:
            for step in range(1, args.steps + 1):
                t0 = time.perf_counter()
                batch = ahead.get(step, version)
                packs = pack_groups(batch.groups, device=policy.device)
                train_s = 0.0
                if packs:
                    t1 = time.perf_counter()
                    grpo.grpo_update(policy, optimizer, packs, args)
                    version = sync.push(policy, version + 1)
                    train_s = time.perf_counter() - t1
                m = batch.metrics
                assert m is not None
                rows.append({"step_s": time.perf_counter() - t0, "train_s": train_s, "rollout_s": batch.rollout_s,
                             "staleness": m.staleness_mean, "dropped": m.dropped, "rollout_util": m.rollout_util,
                             "train_util": m.train_util, "calls": sum(m.lag_counts)})
        wall = time.perf_counter() - t_run
    policy_versions = version - 1

    def mean(key: str, skip_first: bool = False) -> float:
        vals = [float(r[key]) for r in rows[1 if skip_first else 0:] if r[key] is not None]
        return statistics.fmean(vals) if vals else float("nan")

    return {"mode": name, "max_staleness": staleness, "steps": len(rows), "updates": policy_versions,
            "wall_s": wall, "step_s": wall / len(rows), "rollout_s": mean("rollout_s"), "train_s": mean("train_s"),
            "staleness_mean": mean("staleness"), "dropped": sum(r["dropped"] for r in rows),
            "rollout_util": mean("rollout_util", True), "train_util": mean("train_util", True),
            "calls": sum(r["calls"] for r in rows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--groups", type=int, default=2, help="groups (tasks) per step")
    p.add_argument("--group-size", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--hidden", type=int, default=128, help="hidden size of the tiny model")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--update-epochs", type=int, default=2)
    p.add_argument("--modes", default="sync,async1,async2", help="comma-separated: sync, async1, async2, ...")
    p.add_argument("--repeat", type=int, default=1,
                   help="run every mode this many times, the order rotated each round (load drifts); means shown")
    p.add_argument("--json", action="store_true", help="also print one JSON line per run")
    opts = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        suite = make_suite(Path(tmp) / "parity", max(opts.groups, 2))
        modes = opts.modes.split(",")
        runs: list[dict] = []
        for r in range(opts.repeat):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                staleness = 0 if mode == "sync" else int(mode.removeprefix("async"))
                runs.append(run_mode(mode, staleness, opts, suite, Path(tmp) / f"{mode}_{r}"))
    results = []
    for mode in modes:
        mine = [x for x in runs if x["mode"] == mode]
        avg = {k: (statistics.fmean(x[k] for x in mine) if isinstance(v, (int, float)) else v)
               for k, v in mine[0].items()}
        avg["step_s_runs"] = " ".join(f"{x['step_s']:.1f}" for x in mine)
        results.append(avg)
    print(f"{opts.steps} steps x {opts.groups} groups x {opts.group_size} episodes (mini, bwrap, tiny Qwen3 "
          f"hidden {opts.hidden} x {opts.layers} layers, {opts.update_epochs} update epochs)")
    cols = ["mode", "step_s", "rollout_s", "train_s", "staleness_mean", "dropped", "rollout_util", "train_util",
            "updates", "step_s_runs"]
    print("  ".join(f"{c:>14s}" for c in cols))
    for res in results:
        print("  ".join(f"{res[c]:>14.3f}" if isinstance(res[c], float) else f"{res[c]!s:>14s}" for c in cols))
    if opts.json:
        for run in runs:
            print(json.dumps(run))


if __name__ == "__main__":
    main()
