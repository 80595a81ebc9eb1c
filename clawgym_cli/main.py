"""``clawgym`` command line: the parser and the entry point (commands in :mod:`clawgym_cli.commands`)."""

from __future__ import annotations

import argparse
import logging
import sys

from clawgym_cli.audit_cmd import add_audit_parser
from clawgym_cli.commands import (
    cmd_eval,
    cmd_export,
    cmd_grade,
    cmd_harness_check,
    cmd_harness_install,
    cmd_harness_list,
    cmd_leaderboard,
    cmd_plugins_list,
    cmd_quickstart,
    cmd_run,
    cmd_serve_proxy,
    cmd_tasks_list,
    cmd_train,
    cmd_tree_show,
)
from clawgym_env.errors import ClawGymError
from clawgym_env.redact import redact
from harness_adapters.options import add_harness_arguments

POOL_HELP = ("with --sandbox docker: keep N warm containers per sandbox shape, created ahead so that an episode's "
             "sandbox starts without waiting for the engine (0: every sandbox starts cold)")


def build_parser() -> argparse.ArgumentParser:
    """The ``clawgym`` argument parser: one subcommand per ``cmd_*`` of :mod:`clawgym_cli.commands`,
    each bound as ``func``."""
    p = argparse.ArgumentParser(prog="clawgym", description="Black-box RL of LLM agents through real agent harnesses.")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    tasks = sub.add_parser("tasks", help="list tasks").add_subparsers(dest="tasks_cmd", required=True)
    tl = tasks.add_parser("list", help="one task per line, its id first")
    tl.add_argument("--suite", default="builtin", help="suite name (builtin, a plugin's) or a folder of task dirs")
    tl.add_argument("--task", help="one task: SUITE/ID or a task dir")
    tl.set_defaults(func=cmd_tasks_list)

    run = sub.add_parser("run", help="run harness episodes and grade them")
    run.add_argument("--harness", default="mini")
    run.add_argument("--task", help="SUITE/ID or a task dir")
    run.add_argument("--suite", help="suite name (builtin, a plugin's) or a folder of task dirs")
    run.add_argument("--limit", type=int, help="only the first N tasks of the suite")
    run.add_argument("--policy", default="scripted:expert",
                     help="scripted:expert|wrong|noop|file:PATH, transformers:MODEL_DIR, tiny")
    run.add_argument("--sandbox", default="bwrap", choices=["bwrap", "docker"])
    run.add_argument("--sandbox-pool", dest="sandbox_pool", type=int, default=0, metavar="N", help=POOL_HELP)
    run.add_argument("--samples", type=int, default=1, help="episodes per task")
    run.add_argument("--concurrency", type=int, default=2)
    run.add_argument("--temperature", type=float)
    run.add_argument("--top-p", dest="top_p", type=float)
    run.add_argument("--max-tokens", dest="max_tokens", type=int)
    run.add_argument("--out", default="runs/episodes", help="folder for episode records and captured calls")
    run.add_argument("--keep-workspace", action="store_true")
    run.add_argument("--json", action="store_true", help="print one JSON object per episode")
    add_harness_arguments(run)
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
    sp.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                    help="a resource bound of the proxy (ProxyLimits field, e.g. max_body_bytes=33554432); repeatable")
    sp.set_defaults(func=cmd_serve_proxy)

    h = sub.add_parser("harness", help="harness adapters").add_subparsers(dest="harness_cmd", required=True)
    hl = h.add_parser("list", help="list the registered harnesses; a broken one is marked BROKEN with why")
    hl.add_argument("--check", action="store_true", help="exit 1 when a harness is broken")
    hl.set_defaults(func=cmd_harness_list)
    pl = sub.add_parser("plugins", help="registered plugins of every kind").add_subparsers(dest="plugins_cmd",
                                                                                          required=True)
    pls = pl.add_parser("list", help="KIND NAME SOURCE per plugin (a broken one marked BROKEN with why)")
    pls.add_argument("kinds", nargs="*", help="plugin kinds (harness, suite, grader, ...; default: all)")
    pls.add_argument("--check", action="store_true", help="exit 1 when a plugin is broken")
    pls.set_defaults(func=cmd_plugins_list)
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
    add_harness_arguments(hc)
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
    ev.add_argument("--suite", required=True, help="suite name (builtin, a plugin's) or a folder of task dirs")
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
    ev.add_argument("--sandbox-pool", dest="sandbox_pool", type=int, default=0, metavar="N",
                    help=POOL_HELP + "; with --ray-address, in each node's rollout worker")
    ev.add_argument("--retries", type=int, default=2, help="re-runs of an episode after an infrastructure failure")
    ev.add_argument("--rerun-infra", action="store_true", help="also re-run episodes recorded as infra_error")
    ev.add_argument("--episodes-dir", help="episode records and captured calls (default: <out>-episodes/)")
    ev.add_argument("--temperature", type=float)
    ev.add_argument("--top-p", dest="top_p", type=float)
    ev.add_argument("--max-tokens", dest="max_tokens", type=int)
    ev.add_argument("--keep-workspace", action="store_true")
    ev.add_argument("--no-progress", action="store_true")
    ev.add_argument("--ray-address", help="run the episodes on a Ray cluster: 'auto' (a started cluster), 'local' "
                                          "(start one here) or HOST:PORT; one rollout worker per node")
    ev.add_argument("--max-episodes-per-node", type=int,
                    help="with --ray-address: episodes at once per node (default: --concurrency)")
    add_harness_arguments(ev)
    ev.set_defaults(func=cmd_eval)

    lb = sub.add_parser("leaderboard", help="Markdown table, static HTML page and charts from results JSONL files")
    lb.add_argument("results", nargs="+", help="results JSONL files written by `clawgym eval`")
    lb.add_argument("--out", default="site", help="output folder (leaderboard.md, index.html, bar_<suite>.png)")
    lb.set_defaults(func=cmd_leaderboard)
    add_audit_parser(sub)

    from trainers.train import add_arguments as train_arguments

    trn = sub.add_parser("train", help="train a policy from a YAML/JSON config (algo: grpo | sft | ...)")
    train_arguments(trn).set_defaults(func=cmd_train)
    ex = sub.add_parser("export", help="write a checkpoint as a Hugging Face model directory (LoRA merged, or the "
                                       "adapter with --adapter) that transformers, vLLM and --policy load")
    ex.add_argument("checkpoint", metavar="CKPT_OR_RUN",
                    help="a checkpoint folder (RUN/checkpoints/step_N) or a run's out_dir (its latest checkpoint)")
    ex.add_argument("--out", required=True, help="the model directory to write")
    ex.add_argument("--adapter", action="store_true", help="LoRA runs: write the peft adapter (and its base) instead "
                                                          "of the merged model")
    ex.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    ex.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                    help="dtype of the written weights, whatever the masters' (default: bfloat16)")
    ex.set_defaults(func=cmd_export)
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
    """The console script: parse ``argv``, run the command; a :class:`ClawGymError` prints one redacted
    line and exits 2. Log lines are redacted too."""
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
