"""``clawgym`` command line: tasks, episodes, grading, the serving proxy."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from clawgym_env.errors import ClawGymError


def _episode_json(result) -> dict[str, Any]:
    rec = result.record
    return {"task_id": rec.task_id, "suite": rec.suite, "harness": rec.harness, "policy": rec.policy,
            "reward": rec.reward, "subscores": rec.subscores, "status": rec.status, "num_calls": rec.num_calls,
            "wall_s": round(rec.wall_s, 3), "calls_path": rec.calls_path,
            "episode_dir": str(Path(rec.calls_path).parent) if rec.calls_path else None,
            "final_message": rec.final_message, "error": rec.error, "reward_reason": rec.reward_reason,
            "timings": {k: round(v, 3) for k, v in rec.timings.items()}}


def cmd_tasks_list(args) -> int:
    from tasks import load_suite, resolve_task

    if args.task:
        tasks, issues = [resolve_task(args.task)], []
    else:
        suite = load_suite(args.suite)
        tasks, issues = suite.tasks, suite.issues
    for t in tasks:
        first = t.instruction.strip().splitlines()[0] if t.instruction.strip() else ""
        print(f"{t.full_id}\t{t.metadata.get('category') or '-'}\t{first[:80]}")
    for issue in issues:
        print(f"warning: skipped {issue.path}: {issue.error}", file=sys.stderr)
    return 0


def _sampling(args) -> dict[str, Any]:
    out = {}
    for key in ("temperature", "top_p", "max_tokens"):
        if getattr(args, key, None) is not None:
            out[key] = getattr(args, key)
    return out


def cmd_run(args) -> int:
    from clawgym_env.runtime import RolloutPool, Runtime
    from harness_adapters.registry import get_adapter
    from tasks import load_suite, resolve_task

    if bool(args.task) == bool(args.suite):
        raise ClawGymError("give exactly one of --task SUITE/ID (or a task dir) and --suite NAME (or a folder)")
    if args.task:
        tasks = [resolve_task(args.task)]
    else:
        suite = load_suite(args.suite)
        for issue in suite.issues:
            print(f"warning: skipped {issue.path}: {issue.error}", file=sys.stderr)
        tasks = suite.tasks[: args.limit] if args.limit else suite.tasks
    adapter = get_adapter(args.harness)
    with Runtime(args.policy, sandbox=args.sandbox, out_dir=args.out) as rt:
        pool = RolloutPool(rt, concurrency=args.concurrency, progress=not args.json and len(tasks) * args.samples > 1)
        results = pool.run(tasks, adapter, samples=args.samples, sampling=_sampling(args),
                           keep_workspace=args.keep_workspace)
    if args.json:
        for r in results:
            print(json.dumps(_episode_json(r)))
    else:
        for r in results:
            rec = r.record
            print(f"{rec.suite or '-'}/{rec.task_id}\t{rec.status}\treward={rec.reward:.3f}\tcalls={rec.num_calls}"
                  f"\t{rec.wall_s:.1f}s")
        mean = sum(r.record.reward for r in results) / max(len(results), 1)
        solved = sum(r.record.reward >= 1.0 for r in results)
        infra = sum(r.record.is_infra_failure for r in results)
        print(f"{len(results)} episodes: mean reward {mean:.3f}, solved {solved}/{len(results)}, "
              f"infra failures {infra}; records under {args.out}")
    return 0


def cmd_grade(args) -> int:
    from clawgym_env.reward import grade_workspace
    from tasks import load_task_dir, resolve_task

    task = load_task_dir(args.task_dir) if args.task_dir else resolve_task(args.task)
    final = args.final_message
    if args.final_message_file:
        final = Path(args.final_message_file).read_text()
    ws = Path(args.workspace)
    if not ws.is_dir():
        raise ClawGymError(f"workspace {ws} is not a folder")
    rr = grade_workspace(task, ws, final_message=final, sandbox=args.sandbox)
    out = {"task_id": task.id, "reward": rr.reward, "subscores": rr.subscores, "ok": rr.ok, "reason": rr.reason}
    print(json.dumps(out) if args.json else f"reward {rr.reward:.3f} {rr.subscores}" + (f" ({rr.reason})" if rr.reason else ""))
    return 0


def cmd_serve_proxy(args) -> int:
    from clawgym_env.policy import make_policy
    from clawgym_env.proxy.server import serve_proxy

    serve_proxy(make_policy(args.policy), host=args.host, port=args.port, calls_out=args.calls_out)
    return 0


def cmd_harness_install(args) -> int:
    from harness_adapters.registry import get_adapter, list_harnesses

    names = list_harnesses() if args.all or not args.names else args.names
    for name in names:
        adapter = get_adapter(name)
        adapter.install(args.cache_dir)
        print(f"{adapter.name}: installed")
    return 0


def cmd_harness_list(args) -> int:
    from harness_adapters.registry import list_harnesses

    for name in list_harnesses():
        print(name)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clawgym", description="Black-box RL of LLM agents through real agent harnesses.")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    tasks = sub.add_parser("tasks", help="list tasks").add_subparsers(dest="tasks_cmd", required=True)
    tl = tasks.add_parser("list", help="one task per line, its id first")
    tl.add_argument("--suite", default="builtin", help="bundled suite name or a folder of task dirs")
    tl.add_argument("--task", help="one task: SUITE/ID or a task dir")
    tl.set_defaults(func=cmd_tasks_list)

    run = sub.add_parser("run", help="run harness episodes and grade them")
    run.add_argument("--harness", default="mini")
    run.add_argument("--task", help="SUITE/ID or a task dir")
    run.add_argument("--suite", help="bundled suite name or a folder of task dirs")
    run.add_argument("--limit", type=int, help="only the first N tasks of the suite")
    run.add_argument("--policy", default="scripted:expert",
                     help="scripted:expert|wrong|noop|file:PATH, transformers:MODEL_DIR, tiny")
    run.add_argument("--sandbox", default="bwrap", choices=["bwrap", "docker"])
    run.add_argument("--samples", type=int, default=1, help="episodes per task")
    run.add_argument("--concurrency", type=int, default=2)
    run.add_argument("--temperature", type=float)
    run.add_argument("--top-p", dest="top_p", type=float)
    run.add_argument("--max-tokens", dest="max_tokens", type=int)
    run.add_argument("--out", default="runs/episodes", help="folder for episode records and captured calls")
    run.add_argument("--keep-workspace", action="store_true")
    run.add_argument("--json", action="store_true", help="print one JSON object per episode")
    run.set_defaults(func=cmd_run)

    grade = sub.add_parser("grade", help="grade an existing workspace hermetically")
    g = grade.add_mutually_exclusive_group(required=True)
    g.add_argument("--task-dir")
    g.add_argument("--task", help="SUITE/ID")
    grade.add_argument("--workspace", required=True)
    grade.add_argument("--final-message")
    grade.add_argument("--final-message-file")
    grade.add_argument("--sandbox", default="bwrap", choices=["bwrap", "docker"])
    grade.add_argument("--json", action="store_true")
    grade.set_defaults(func=cmd_grade)

    sp = sub.add_parser("serve-proxy", help="serve a policy behind the proxy in the foreground")
    sp.add_argument("--policy", default="scripted:expert")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8000)
    sp.add_argument("--calls-out", help="write the captured calls (JSONL) here on exit")
    sp.set_defaults(func=cmd_serve_proxy)

    h = sub.add_parser("harness", help="harness adapters").add_subparsers(dest="harness_cmd", required=True)
    h.add_parser("list", help="list the registered harnesses").set_defaults(func=cmd_harness_list)
    hi = h.add_parser("install", help="install harnesses (pinned versions) into the project cache; idempotent")
    hi.add_argument("names", nargs="*", help="harness names (default: all)")
    hi.add_argument("--all", action="store_true")
    hi.add_argument("--cache-dir", help="install here instead of the project cache (~/.cache/clawgym/harnesses)")
    hi.set_defaults(func=cmd_harness_install)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except ClawGymError as exc:
        print(f"clawgym: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
