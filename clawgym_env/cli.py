"""``clawgym`` command line: tasks, episodes, grading, the serving proxy."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from clawgym_env.capture.records import sanitize
from clawgym_env.errors import ClawGymError
from clawgym_env.redact import redact


def _episode_json(result) -> dict[str, Any]:
    rec = result.record
    return {"task_id": rec.task_id, "suite": rec.suite, "harness": rec.harness, "policy": rec.policy,
            "reward": rec.reward, "subscores": rec.subscores, "status": rec.status, "num_calls": rec.num_calls,
            "wall_s": round(rec.wall_s, 3), "calls_path": rec.calls_path,
            "episode_dir": str(Path(rec.calls_path).parent) if rec.calls_path else None,
            "final_message": rec.final_message, "error": rec.error, "failure_boundary": rec.failure_boundary,
            "reward_reason": rec.reward_reason,
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
            print(json.dumps(sanitize(_episode_json(r))[0]), flush=True)  # redacted, always valid JSON
    else:
        for r in results:
            rec = r.record
            where = f" ({rec.failure_boundary})" if rec.failure_boundary and rec.status != "ok" else ""
            print(f"{rec.suite or '-'}/{rec.task_id}\t{rec.status}{where}\treward={rec.reward:.3f}"
                  f"\tcalls={rec.num_calls}\t{rec.wall_s:.1f}s")
        scored = [r.record for r in results if r.record.is_task_outcome]
        mean = sum(r.reward for r in scored) / max(len(scored), 1)
        solved = sum(r.reward >= 1.0 for r in scored)
        print(f"{len(results)} episodes: mean reward {mean:.3f}, solved {solved}/{len(scored)} scored, "
              f"not scored (infrastructure or no valid reward) {len(results) - len(scored)}; records under {args.out}")
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


def cmd_tree_show(args) -> int:
    from clawgym_env.capture.tree_show import show

    print(show(args.file, html_out=args.html, png_out=args.png, decode=not args.no_decode, width=args.width), end="")
    return 0


def cmd_harness_check(args) -> int:
    from harness_adapters.check import check_harness, report_json

    report = check_harness(args.name, task=args.task, policy=args.policy, sandbox=args.sandbox)
    print(report_json(report) if args.json else report.render())
    return 0


def cmd_eval(args) -> int:
    from leaderboards.metrics import summarize
    from leaderboards.run import run_eval
    from leaderboards.schema import read_results

    s = run_eval(args.suite, data=args.data, harness=args.harness, policy=args.policy, samples=args.samples,
                 concurrency=args.concurrency, out=args.out, limit=args.limit, sandbox=args.sandbox,
                 retries=args.retries, episodes_dir=args.episodes_dir, rerun_infra=args.rerun_infra,
                 sampling=_sampling(args), keep_workspace=args.keep_workspace, progress=not args.no_progress)
    print(f"{s.out}: {s.ran} episode(s) written, {s.skipped} already done of {s.total}; infra failures "
          f"{s.infra_failures} (after {s.retried} retries)" + ("; repaired a torn last line" if s.repaired_tail else ""))
    policy = args.policy.strip()
    for g in summarize(read_results(s.out).rows, by_category=False):
        if g.harness == args.harness and g.policy == policy:
            print(f"{g.suite} · {g.harness} · {g.policy}: Pass@1 {g.pass1:.3f}, strict {g.strict:.3f}, "
                  f"{g.tasks} task(s), {g.episodes} episode(s), {g.infra_failures} infra failure(s)")
    return 0


def cmd_leaderboard(args) -> int:
    from leaderboards.site import build_site

    for name, path in build_site(args.results, args.out).items():
        print(f"wrote {path}")
    return 0


def cmd_train(args) -> int:
    from trainers.train import main_args

    return main_args(args)


def cmd_quickstart(args) -> int:
    from trainers.quickstart import main_args

    return main_args(args)


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
    hc = h.add_parser("check", help="conformance report: run a probe episode and describe the harness's traffic")
    hc.add_argument("name")
    hc.add_argument("--task", default="builtin/csv_total", help="the probe task (SUITE/ID or a task dir)")
    hc.add_argument("--policy", default="scripted:expert")
    hc.add_argument("--sandbox", default="bwrap", choices=["bwrap", "docker"])
    hc.add_argument("--json", action="store_true")
    hc.set_defaults(func=cmd_harness_check)

    tr = sub.add_parser("tree", help="call trees").add_subparsers(dest="tree_cmd", required=True)
    ts = tr.add_parser("show", help="outline a call-tree JSONL or an episode's calls.jsonl; optional HTML/PNG")
    ts.add_argument("file")
    ts.add_argument("--html", help="write a self-contained HTML page of the (first) tree here")
    ts.add_argument("--png", help="write a picture of the (first) tree here (needs matplotlib)")
    ts.add_argument("--width", type=int, default=120, help="truncate outline lines to this width (0: never)")
    ts.add_argument("--no-decode", action="store_true", help="show token ids instead of decoded text")
    ts.set_defaults(func=cmd_tree_show)
    ev = sub.add_parser("eval", help="evaluate a policy through a harness on a suite; resumable JSONL results",
                        description="One JSON line per episode, appended as episodes finish; a restart skips finished "
                                    "ones. JobBench and ClawGym-Bench rubric tasks are judged on the host by the LLM "
                                    "judge at CLAWGYM_JUDGE_BASE_URL / CLAWGYM_JUDGE_MODEL (/ CLAWGYM_JUDGE_API_KEY).")
    ev.add_argument("--suite", required=True, help="bundled suite name (builtin, ...) or a folder of task dirs")
    ev.add_argument("--data", help="the suite's data (a downloaded dataset folder or file), for suites that need it")
    ev.add_argument("--harness", default="mini")
    ev.add_argument("--policy", default="scripted:expert",
                    help="scripted:expert|..., transformers:DIR, tiny, passthrough:openai:MODEL, "
                         "passthrough:anthropic:MODEL (upstream from CLAWGYM_UPSTREAM_BASE_URL/_API_KEY)")
    ev.add_argument("--samples", type=int, default=1, help="episodes per task (K, for Pass@k)")
    ev.add_argument("--concurrency", type=int, default=2)
    ev.add_argument("--out", required=True, help="results JSONL (appended; finished episodes are skipped)")
    ev.add_argument("--limit", type=int, help="only the first N tasks of the suite")
    ev.add_argument("--sandbox", default="bwrap", choices=["bwrap", "docker"])
    ev.add_argument("--retries", type=int, default=2, help="re-runs of an episode after an infrastructure failure")
    ev.add_argument("--rerun-infra", action="store_true", help="also re-run episodes recorded as infra_error")
    ev.add_argument("--episodes-dir", help="episode records and captured calls (default: <out>-episodes/)")
    ev.add_argument("--temperature", type=float)
    ev.add_argument("--top-p", dest="top_p", type=float)
    ev.add_argument("--max-tokens", dest="max_tokens", type=int)
    ev.add_argument("--keep-workspace", action="store_true")
    ev.add_argument("--no-progress", action="store_true")
    ev.set_defaults(func=cmd_eval)

    lb = sub.add_parser("leaderboard", help="Markdown table, static HTML page and charts from results JSONL files")
    lb.add_argument("results", nargs="+", help="results JSONL files written by `clawgym eval`")
    lb.add_argument("--out", default="site", help="output folder (leaderboard.md, index.html, bar_<suite>.png)")
    lb.set_defaults(func=cmd_leaderboard)

    from trainers.train import add_arguments as train_arguments

    trn = sub.add_parser("train", help="train a policy from a YAML/JSON config (algo: grpo | sft | ...)")
    train_arguments(trn).set_defaults(func=cmd_train)
    from trainers.quickstart import add_arguments as quickstart_arguments

    qs = sub.add_parser("quickstart", help="CPU demo: tiny Qwen3, SFT on expert trajectories, then GRPO; "
                                           "held-out pass rates before/after")
    quickstart_arguments(qs).set_defaults(func=cmd_quickstart)
    return p


class _RedactingFormatter(logging.Formatter):
    """Log lines (messages and tracebacks) with every known secret redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:  # an upstream error echoing a key never reaches the log
        handler.setFormatter(_RedactingFormatter(handler.formatter._fmt if handler.formatter else None))
    try:
        return args.func(args)
    except ClawGymError as exc:
        print(f"clawgym: error: {redact(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
