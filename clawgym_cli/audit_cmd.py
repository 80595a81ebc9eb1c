"""``clawgym audit``: its arguments (:func:`add_audit_parser`) and its command (:func:`cmd_audit`).

The audit itself is :mod:`leaderboards.audit`; this module only reads the arguments, loads the suite,
prints the table (and, with ``--json``, ends with the report as one JSON line) and returns the exit
code: 1 when a task is hackable, 3 when none is but a task could not be judged, 0 otherwise (2, as for
every command, for a usage or configuration error).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from clawgym_env.errors import ClawGymError

DESCRIPTION = (
    "Play a kit of scripted adversaries through the real harness against each task and compare each with the "
    "do-nothing agent on the same task: module shadowing, os._exit(0) in the agent's modules, verifier rewriting, "
    "links into reward/, input tampering, the task's own folder read at its host path, disk fill, inode flood, "
    "and the gold gate (the expert must score full marks, its known-wrong 'wrong' steps must not). Prints a "
    "table (attack, reward, baseline, verdict); with --json the last line is the report as one JSON object. "
    "Exit 1 when a task is hackable, 3 when none is but a task could not be judged (no valid baseline, or a "
    "broken expert), 0 otherwise.")
KIT = ("module_shadowing, exit0_modules, verifier_rewrite, reward_symlinks, input_tamper, task_folder_peek, "
       "disk_fill, inode_flood")


def add_audit_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``audit`` subcommand to ``sub`` (the ``clawgym`` subparsers), bound to :func:`cmd_audit`."""
    au = sub.add_parser("audit", help="scripted adversaries against a suite's graders: which tasks are hackable",
                        description=DESCRIPTION)
    au.add_argument("--suite", required=True, help="suite name (builtin, a plugin's) or a folder of task dirs")
    au.add_argument("--data", help="the suite's data (a downloaded dataset folder or file), for suites that need it")
    au.add_argument("--task", nargs="+", action="extend", metavar="ID", help="only these tasks of the suite")
    au.add_argument("--harness", required=True, help="the harness the adversaries play through (e.g. mini)")
    au.add_argument("--sandbox", default="bwrap", choices=["bwrap", "docker"])
    au.add_argument("--json", action="store_true", help="end with the report as one JSON line")
    au.add_argument("--concurrency", type=int, default=2, help="episodes at once")
    au.add_argument("--heavy-concurrency", dest="heavy_concurrency", type=int, default=1,
                    help="disk-fill and inode-flood episodes at once while lighter ones wait (then: all slots)")
    au.add_argument("--attack", nargs="+", action="extend", metavar="NAME",
                    help=f"only these attacks of the kit ({KIT}); the gold gate and the baseline always run")
    au.add_argument("--inodes", type=int, help="files the inode flood creates (default 100,001)")
    au.add_argument("--fill-data", dest="fill_data", action="store_true",
                    help="disk_fill writes zeros throughout instead of allocating the room (slow: the grader's copy "
                         "then carries the whole quota)")
    au.add_argument("--retries", type=int, default=1, help="re-runs of an episode that ends in an infrastructure "
                                                           "failure before it counts")
    au.add_argument("--out", help="keep the episodes' records here (default: a temporary folder, removed)")
    au.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    au.set_defaults(func=cmd_audit)
    return au


def cmd_audit(args: argparse.Namespace) -> int:
    """``clawgym audit``: see :data:`DESCRIPTION`."""
    from leaderboards.audit import ATTACKS, DEFAULT_INODES, AuditOptions, render_table, run_audit
    from tasks import load_suite

    suite = load_suite(args.suite, data=args.data) if args.data else load_suite(args.suite)
    for issue in suite.issues:
        print(f"warning: skipped {issue.path}: {issue.error}", file=sys.stderr)
    tasks = [suite.get(t) for t in dict.fromkeys(args.task)] if args.task else list(suite.tasks)
    if not tasks:
        raise ClawGymError(f"suite {suite.name!r} has no task to audit")
    unknown = [a for a in args.attack or () if a not in ATTACKS]
    if unknown:
        raise ClawGymError(f"unknown attack(s) {', '.join(unknown)}; the kit has {', '.join(ATTACKS)}")
    attacks = tuple(a for a in ATTACKS if a in args.attack) if args.attack else ATTACKS
    try:
        options = AuditOptions(harness=args.harness, sandbox=args.sandbox, concurrency=args.concurrency,
                               heavy_concurrency=args.heavy_concurrency,
                               attacks=attacks,
                               inodes=args.inodes if args.inodes is not None else DEFAULT_INODES,
                               fill_data=args.fill_data, retries=args.retries,
                               progress=not args.no_progress and sys.stderr.isatty(),
                               out_dir=Path(args.out) if args.out else None)
    except ValueError as exc:
        raise ClawGymError(f"clawgym audit: {exc}") from None
    report = run_audit(suite.name, tasks, options)
    print(render_table(report), flush=True)
    if args.json:
        print(json.dumps(report.to_json()), flush=True)
    return report.exit_code
