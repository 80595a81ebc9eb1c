"""The ``clawgym`` commands: each ``cmd_*`` takes the parsed arguments and returns an exit code.

This package is the app layer: the only one that imports every other (the engine ``clawgym_env``,
``tasks``, ``harness_adapters``, ``trainers`` and ``leaderboards``). Heavy imports stay inside the
commands so that ``clawgym --help`` starts fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from clawgym_env.capture.records import sanitize
from clawgym_env.errors import ClawGymError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.base import SamplingOverrides


def _episode_json(result) -> JSONObject:
    rec = result.record
    return {"task_id": rec.task_id, "suite": rec.suite, "harness": rec.harness, "policy": rec.policy,
            "reward": rec.reward, "subscores": rec.subscores, "status": rec.status, "num_calls": rec.num_calls,
            "wall_s": round(rec.wall_s, 3), "calls_path": rec.calls_path,
            "episode_dir": str(Path(rec.calls_path).parent) if rec.calls_path else None,
            "final_message": rec.final_message, "error": rec.error, "failure_boundary": rec.failure_boundary,
            "reward_reason": rec.reward_reason, "limits_hit": rec.limits_hit,
            "inputs_modified": [{"path": c.path, "change": c.change} for c in rec.inputs_modified],
            "grader_notes": rec.logs.get("grader_notes", "").splitlines(),
            "timings": {k: round(v, 3) for k, v in rec.timings.items()}}


def cmd_tasks_list(args) -> int:
    """``clawgym tasks list``: one line per task of ``--suite`` (or the one ``--task``): full id, category,
    the instruction's first line; tasks that failed to load are warnings on stderr."""
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


def _sampling(args) -> SamplingOverrides:
    return SamplingOverrides(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)


def cmd_run(args) -> int:
    """``clawgym run``: episodes of ``--task`` or ``--suite`` through one harness and policy, records under
    ``--out``; one JSON line per episode with ``--json``, else a table and the mean reward of scored ones."""
    from clawgym_env.envs.runtime import RolloutPool, Runtime
    from harness_adapters.options import harness_from_args
    from leaderboards.run import check_sandbox_pool
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
    check_sandbox_pool(args.sandbox, args.sandbox_pool)
    adapter = harness_from_args(args.harness, args)
    with Runtime(args.policy, sandbox=args.sandbox, out_dir=args.out, sandbox_pool=args.sandbox_pool) as rt:
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
    """``clawgym grade``: the task's grader over an existing workspace folder (no harness, no policy)."""
    from clawgym_env.grading.inputs import modified_inputs
    from clawgym_env.grading.reward import grade_workspace
    from tasks import load_task_dir, resolve_task

    task = load_task_dir(args.task_dir) if args.task_dir else resolve_task(args.task)
    final = args.final_message
    if args.final_message_file:
        final = Path(args.final_message_file).read_text()
    ws = Path(args.workspace)
    if not ws.is_dir():
        raise ClawGymError(f"workspace {ws} is not a folder")
    rr = grade_workspace(task, ws, final_message=final, sandbox=args.sandbox)
    changed = [{"path": c.path, "change": c.change} for c in modified_inputs(task, ws)]
    out = {"task_id": task.id, "reward": rr.reward, "subscores": rr.subscores, "ok": rr.ok, "reason": rr.reason,
           "grader_notes": rr.notes, "inputs_modified": changed}
    text = f"reward {rr.reward:.3f} {rr.subscores}" + (f" ({rr.reason})" if rr.reason else "")
    text += "".join(f"\n  grader: {note}" for note in rr.notes)
    text += "".join(f"\n  input {c['change']}: {c['path']}" for c in changed)
    print(json.dumps(out) if args.json else text)
    return 0


def cmd_serve_proxy(args) -> int:
    """``clawgym serve-proxy``: the serving proxy in the foreground with one open episode, until Ctrl-C;
    the policy it built is closed when it stops (a passthrough's client holds connections)."""
    from clawgym_env.policy import make_policy
    from clawgym_env.proxy.guards.bounds import ProxyLimits
    from clawgym_env.proxy.server import serve_proxy

    try:
        bounds = ProxyLimits.from_pairs(getattr(args, "limit", None) or [])
    except ValueError as exc:
        raise ClawGymError(f"--limit {exc}") from None
    policy = make_policy(args.policy)
    try:
        serve_proxy(policy, host=args.host, port=args.port, calls_out=args.calls_out, bounds=bounds)
    finally:
        policy.close()
    return 0


def cmd_harness_install(args) -> int:
    """``clawgym harness install``: install the named harnesses (all with ``--all``) into the cache."""
    from clawgym_env.plugins import harnesses, make_harness

    names = harnesses.names() if args.all or not args.names else args.names
    for name in names:
        adapter = make_harness(name)
        adapter.install(args.cache_dir)
        print(f"{adapter.name}: installed")
    return 0


def cmd_harness_list(args) -> int:
    """``clawgym harness list``: the registered harness names, one a line; a broken one (its module raises on
    import, a misnamed entry point, two distributions declaring it) as ``NAME  BROKEN: <why>``. Exit 1 when one
    is broken only with ``--check``."""
    from clawgym_env.plugins import harnesses

    broken = 0
    for name in harnesses.names():
        problem = harnesses.problem(name)
        broken += problem is not None
        print(name if problem is None else f"{name}  BROKEN: {problem}")
    return 1 if broken and getattr(args, "check", False) else 0


def cmd_plugins_list(args) -> int:
    """``clawgym plugins list [KIND ...]``: every registered plugin of each kind (all kinds by default) as
    ``KIND NAME SOURCE`` (``runtime``, ``built-in`` or the declaring distribution), a broken one with
    ``BROKEN: <why>``. Exit 1 when one is broken only with ``--check``."""
    from clawgym_env.plugins import ALL

    kinds = {r.kind: r for r in ALL}
    wanted = args.kinds or list(kinds)
    unknown = [k for k in wanted if k not in kinds]
    if unknown:
        raise ClawGymError(f"unknown plugin kind(s) {', '.join(unknown)}; the kinds are {', '.join(kinds)}")
    broken = 0
    for kind in wanted:
        registry = kinds[kind]
        for name in registry.names():
            problem = registry.problem(name)
            broken += problem is not None
            print(f"{kind}\t{name}\t{registry.source(name)}" + ("" if problem is None else f"\tBROKEN: {problem}"))
    return 1 if broken and args.check else 0


def cmd_tree_show(args) -> int:
    """``clawgym tree show``: an outline of a call-tree JSONL or an episode's ``calls.jsonl``; HTML/PNG on request."""
    from clawgym_env.capture.tree_show import show
    from clawgym_env.policy.tokenizer import load_tokenizer

    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")  # kind tags coloured in a terminal only
    tokenizer = None if args.no_decode else load_tokenizer()
    print(show(args.file, html_out=args.html, png_out=args.png, tokenizer=tokenizer, width=args.width,
               colour=colour), end="")
    return 0


def cmd_harness_check(args) -> int:
    """``clawgym harness check``: the conformance check of one harness (a report; JSON with ``--json``)."""
    from harness_adapters.check import check_harness, report_json
    from harness_adapters.options import parse_harness_opts
    from tasks import resolve_task

    report = check_harness(args.name, task=resolve_task(args.task), policy=args.policy, sandbox=args.sandbox,
                           options=parse_harness_opts(args.harness_opts), cache_dir=args.harness_cache_dir)
    print(report_json(report) if args.json else report.render())
    return 0


def cmd_eval(args) -> int:
    """``clawgym eval``: a resumable evaluation run into ``--out``, then its Pass@1 summary."""
    from harness_adapters.options import parse_harness_opts
    from leaderboards.metrics import summarize
    from leaderboards.run import run_eval
    from leaderboards.schema import read_results

    s = run_eval(args.suite, data=args.data, harness=args.harness, policy=args.policy, samples=args.samples,
                 concurrency=args.concurrency, out=args.out, limit=args.limit, sandbox=args.sandbox,
                 retries=args.retries, episodes_dir=args.episodes_dir, rerun_infra=args.rerun_infra,
                 sampling=_sampling(args), keep_workspace=args.keep_workspace, progress=not args.no_progress,
                 ray_address=args.ray_address, max_episodes_per_node=args.max_episodes_per_node,
                 sandbox_pool=args.sandbox_pool, harness_options=parse_harness_opts(args.harness_opts),
                 harness_cache_dir=args.harness_cache_dir)
    print(f"{s.out}: {s.ran} episode(s) written, {s.skipped} already done of {s.total}; infra failures "
          f"{s.infra_failures} (after {s.retried} retries)"
          + ("; repaired a torn last line" if s.repaired_tail else ""))
    policy = args.policy.strip()
    for g in summarize(read_results(s.out).rows, by_category=False):
        if g.harness == args.harness and g.policy == policy:
            print(f"{g.suite} · {g.harness} · {g.policy}: Pass@1 {g.pass1:.3f}, strict {g.strict:.3f}, "
                  f"{g.tasks} task(s), {g.episodes} episode(s), {g.infra_failures} infra failure(s)")
    return 0


def cmd_leaderboard(args) -> int:
    """``clawgym leaderboard``: the Markdown/HTML leaderboard from result files; prints what it wrote."""
    from leaderboards.site import build_site

    for path in build_site(args.results, args.out).values():
        print(f"wrote {path}")
    return 0


def cmd_train(args) -> int:
    """``clawgym train``: one training run from a YAML/JSON config (``algo``: grpo, ppo, sft)."""
    from trainers.train import main_args

    return main_args(args)


def cmd_export(args) -> int:
    """``clawgym export``: a checkpoint (or a run's latest) as a Hugging Face model directory, merged or adapter."""
    from trainers.scale.export import export_checkpoint

    res = export_checkpoint(args.checkpoint, args.out, adapter=args.adapter, force=args.force, dtype=args.dtype)
    base = f" (base: {res.base})" if res.base else ""
    print(f"exported step {res.step} of {res.checkpoint} as a {res.kind} model to {res.out}{base}; evaluate it with "
          f"--policy transformers:{res.out}" + ("" if res.base else f" or --policy vllm:{res.out}"))
    return 0


def cmd_quickstart(args) -> int:
    """``clawgym quickstart``: the CPU demo: a tiny Qwen3, SFT on expert trajectories, then GRPO."""
    from trainers.quickstart import main_args

    return main_args(args)
