"""Per-harness figures: install time and size, startup to first call, episode wall time and peak
memory for one builtin task, and the proxy's own share of the episode's time.

    python bench/bench_harnesses.py [--harness mini claude-code ...] [--task builtin/csv_total] [-n 3]

Install time is what the install recorded when it ran (the npm cache may have been warm); run with
``--reinstall`` into a fresh ``--cache-dir`` for a cold figure. Each episode is the scripted expert
through the real harness in the bubblewrap sandbox; figures are medians over ``-n`` episodes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from clawgym_env.envs.runtime import Runtime
from clawgym_env.plugins import harnesses, make_harness
from harness_adapters.install import install_info
from tasks import resolve_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--harness", nargs="*", default=harnesses.names())
    ap.add_argument("--task", default="builtin/csv_total")
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--cache-dir")
    ap.add_argument("--reinstall", action="store_true")
    args = ap.parse_args()
    task = resolve_task(args.task)
    rows = []
    with Runtime("scripted:expert", out_dir=tempfile.mkdtemp(prefix="clawgym-bench-")) as rt:
        for name in args.harness:
            adapter = make_harness(name)
            package = getattr(adapter, "package", None)
            if package is not None and args.reinstall:
                from harness_adapters.install import npm_install

                npm_install(package, args.cache_dir, force=True)
            else:
                adapter.install(args.cache_dir)
            info = install_info(package, args.cache_dir) if package is not None else {}
            startup, wall, peak, proxy_share, rewards = [], [], [], [], []
            for _ in range(args.n):
                res = rt.run(task, adapter)
                rec = res.record
                rewards.append(rec.reward)
                wall.append(rec.wall_s)
                started = rec.resources.get("harness_started_at")
                if res.calls and started:
                    startup.append(res.calls[0].started_at - started)
                if "peak_memory_mb" in rec.resources:
                    peak.append(rec.resources["peak_memory_mb"])
                harness_s = rec.timings.get("harness_s") or 0.0
                if harness_s:
                    proxy_share.append(rec.timings.get("proxy_total_s", 0.0) / harness_s)
            med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
            rows.append((name, info.get("size_bytes", 0) / 2**20, info.get("install_s", float("nan")), med(startup),
                         med(wall), med(peak), med(proxy_share), sum(rewards) / len(rewards)))
    head = ("harness", "install MiB", "install s", "startup s", "episode s", "peak MiB", "proxy share", "reward")
    print(" | ".join(head))
    for r in rows:
        print(f"{r[0]} | {r[1]:.0f} | {r[2]:.1f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.0f} | {r[6]:.1%} | {r[7]:.2f}")


if __name__ == "__main__":
    main()
