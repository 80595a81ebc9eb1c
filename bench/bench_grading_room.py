"""How long grading takes whatever the agent left: the grader's own room and deadline, measured.

For each backend asked (``--sandbox bwrap,docker``) it grades, with the real hermetic grader
(:func:`clawgym_env.grading.reward.grade_workspace`), three host workspaces an agent may leave:

* ``quota``: as many empty files as the default inode quota lets a place hold (262,144, its root
  included): graded as usual (the grader has room for it);
* ``million``: a million empty files, what an agent whose sandbox could not enforce the quota (a non-root
  driver) may leave: the grading copy stops at the agent's quota and scores 0 with the reason;
* ``full``: one file as large as the default disk quota (2 GiB, real data, no holes): graded as usual.

Printed per case: files, grading wall time, reward, whether the verifier ran cleanly and the reason,
after the defaults and the grader's copy deadline. ``--scratch`` grades with a grading sandbox that
discards its copy at close (``SandboxSpec.hand_back=False``) instead of copying it back to the host,
to measure what that spares. Example: ``python bench/bench_grading_room.py --sandbox bwrap --cases
quota,million``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_files(root: Path, n: int) -> None:
    """``n`` empty files in ``root`` (created quickly, without a shell)."""
    root.mkdir(parents=True)
    for i in range(n):
        os.close(os.open(root / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644))


def make_full(root: Path, mib: int) -> None:
    """One file of ``mib`` MiB of real data."""
    root.mkdir(parents=True)
    chunk = b"\1" * (1 << 20)
    with open(root / "full.bin", "wb") as fh:
        for _ in range(mib):
            fh.write(chunk)


def main() -> int:
    """Build the workspaces, grade each with each backend and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sandbox", default="bwrap", help="comma-separated backends (bwrap, docker)")
    ap.add_argument("--cases", default="quota,million,full", help="comma-separated: quota, million, full")
    ap.add_argument("--scratch", action="store_true", help="the grading sandbox discards its copy at close")
    args = ap.parse_args()
    if args.scratch:
        import functools

        import clawgym_env.grading.reward as reward_module
        from clawgym_env.sandbox import SandboxSpec

        reward_module.SandboxSpec = functools.partial(SandboxSpec, hand_back=False)  # type: ignore[misc]

    from clawgym_env.files.workspace import remove_tree
    from clawgym_env.grading.reward import grade_workspace
    from clawgym_env.grading.room import GRADING_COPY_S
    from clawgym_env.sandbox import SandboxLimits
    from clawgym_env.task import TaskLimits
    from clawgym_env.testing import EchoTaskSpec, echo_suite

    defaults = SandboxLimits()
    limits = TaskLimits(timeout_s=300.0, max_turns=4, reward_timeout_s=60.0)
    with tempfile.TemporaryDirectory(prefix="bench-grading-room-") as tmp:
        task = echo_suite(Path(tmp) / "suite", [EchoTaskSpec("g", "x", expect="x")], limits=limits).tasks[0]
        print(f"defaults: disk_mb={defaults.disk_mb} inodes={defaults.inodes}; grading copy deadline "
              f"{GRADING_COPY_S:.0f} s; reward_timeout_s {limits.reward_timeout_s:.0f} s")
        print(f"{'sandbox':8} {'case':8} {'entries':>9} {'build s':>8} {'grade s':>8} {'reward':>6} ok  reason")
        for case in args.cases.split(","):
            ws = Path(tmp) / case
            t0 = time.monotonic()
            if case == "quota":
                make_files(ws, (defaults.inodes or 0) - 1)
            elif case == "million":
                make_files(ws, 1_000_000)
            elif case == "full":
                make_full(ws, defaults.disk_mb or 0)
            else:
                raise SystemExit(f"unknown case {case!r}; use quota, million or full")
            built = time.monotonic() - t0
            entries = len(os.listdir(ws))
            for backend in args.sandbox.split(","):
                t1 = time.monotonic()
                rr = grade_workspace(task, ws, final_message="x", sandbox=backend)
                took = time.monotonic() - t1
                print(f"{backend:8} {case:8} {entries:>9} {built:>8.1f} {took:>8.1f} {rr.reward:>6.1f} "
                      f"{'y' if rr.ok else 'n'}   {(rr.reason or '')[:110]}", flush=True)
            remove_tree(ws)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
