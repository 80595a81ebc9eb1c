"""GRPO over call trees, through real harnesses — one file, one loop (``clawgym train`` runs it).

Each step:

1. **Rollouts.** ``groups_per_step`` tasks are drawn from the train suite (a per-step seeded draw,
   so a resumed run draws what the uninterrupted one would have) and split between the harnesses
   of ``harnesses`` by ratio; each (task, harness) runs ``group_size`` episodes against the serving
   copy of the policy, sampling at ``temperature`` (the action of every episode).
2. **Groups.** Episodes are grouped by (task, harness); infrastructure failures are excluded (never
   scored 0); each rollout is cleaned (``clean:``, :mod:`trainers.batch.clean`: only the calls of
   ``train_kinds`` — the main agent by default — minus dead retries are trained, and a rollout whose
   cleaned tree has more than ``max_leaves`` leaves leaves its group); a group whose rewards are all equal
   is skipped; each episode gets one advantage
   ``A_e = r_e - mean(r)`` (``/ std`` with ``normalize_std``) for all of its sampled tokens.
   Calls not token-exact: their tokens are masked (see :mod:`trainers.batch.tree_batch`).
3. **One forward per group.** A group's episodes are one call tree, packed into one sequence with a
   tree attention mask, so a shared prefix (system prompt, task, earlier turns) is computed once.
4. **Loss.** For token ``t`` and every episode ``e`` through it (weights ``W[t,e] = 1/(G·N_e)`` per
   group, averaged over groups)::

       r_t   = exp(logp_t - logp_old_t)                 logp_old: trained model before this update
       w_t   = min(exp(logp_old_t - logp_rollout_t), is_clip)    truncated importance sampling
       loss  = Σ_{t,e} W[t,e] · w_t · -min(r_t A_e, clip(r_t, 1-clip_eps, 1+clip_eps_high) A_e)
             + kl_coef · Σ_t (Σ_e W[t,e]) · k3_t,     k3_t = exp(d) - d - 1,  d = logp_ref_t - logp_t

   Logprobs are of the sampling distribution: ``softmax(logits / temperature)`` over the real
   vocabulary. With ``top_p < 1`` the rollout logprobs are of the truncated distribution, which the
   trainer does not reproduce; the importance weights then absorb the difference (keep top_p = 1).
5. **Sync.** After the update the serving policy gets the new weights and version (``trainers.scale.weight_sync``).

Metrics per step (``metrics.jsonl``): rollout reward and pass rate overall and per harness, groups
trained/skipped, what cleaning removed (``clean/side_calls``, ``clean/side_tokens``, ...,
``clean/discarded_tokens``, ``clean/dropped_rollouts_max_leaves``, ``clean/kept_tokens``),
``kl_rollout`` (k3 estimate of KL(rollout ‖ trained) on the sampled tokens), ``clip_fraction``
(trainable tokens whose ratio left the clip range), importance weights, losses, grad norm, tokens/s
of training and of rollouts. ``step`` counts iterations; ``version`` counts
optimiser updates (a step whose groups all had constant reward makes no update).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clawgym_env.errors import ConfigError
from trainers.batch.pack_parts import pack_stats
from trainers.batch.tree_batch import LOSS_NORMS, OVERLONG_MODES, group_summary, make_groups, pack_groups
from trainers.grpo.update import grpo_loss, grpo_update, score_pack
from trainers.metrics import MetricsLogger, MetricsRow, MetricValue, plot_curves, rollout_metrics
from trainers.policy import TrainablePolicy
from trainers.ranks import check_context, generation_services, rollout_services, setup_policy
from trainers.rollouts.ahead import RolloutAhead, StepBatch, jobs_for
from trainers.rollouts.draw import draw_jobs as draw_step_jobs
from trainers.rollouts.evaluation import eval_harnesses, evaluate_harnesses
from trainers.rollouts.sync import fleet_metrics, judge_for, run_jobs
from trainers.run_args import RLArgs
from trainers.scale.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from trainers.scale.fsdp import broadcast_object
from trainers.summary import TrainSummary

__all__ = ["Args", "collect_groups", "draw_jobs", "grpo_loss", "grpo_update", "resume", "train"]
_score = score_pack  # the name earlier code and tests use


@dataclasses.dataclass
class Args(RLArgs):
    """Every setting of a GRPO run (``clawgym train --help-config grpo`` lists them): the shared ones of
    :class:`~trainers.run_args.RLArgs`, then GRPO's groups, advantages and loss normalisation."""
    out_dir: str = "runs/grpo"
    steps: int = 10
    save_every: int = 1
    max_tokens: int = 512
    groups_per_step: int = 4
    """(task, harness) groups per step, drawn from the suite without replacement"""
    group_size: int = 4
    """G: rollouts per group; each episode's advantage is its reward against the group's"""
    normalize_std: bool = True
    """divide advantages by the group's reward standard deviation (Dr. GRPO argues for off)"""
    loss_norm: str = "episode"
    """how (token, episode) pair weights are normalised. ``"episode"`` (default, the original GRPO): each
    episode's loss is the mean over its own trainable tokens, then the group's mean — a token of a short
    episode weighs more than one of a long episode, so long failures are punished less per token (a
    length bias). ``"token"`` (DAPO): one mean over every pair of the step — long episodes weigh more.
    ``"constant"`` (Dr. GRPO): divided by ``G · loss_norm_constant`` per group — no length bias; the
    gradient's scale depends on the constant. With ``minibatches > 1`` each optimiser step is normalised by its
    own minibatch: by its groups (``episode``, ``constant``) or its pairs (``token``: the weights of every
    optimiser step sum to 1, as verl's and DAPO's token mean)."""
    loss_norm_constant: float | None = None
    """the divisor of ``loss_norm="constant"``: an episode's token budget (default: ``max_context_tokens``, which
    bounds the sampled tokens of an episode whose calls extend one another; one call's ``max_tokens`` does not)"""
    overlong: str = "keep"
    """episodes with a call cut at ``max_tokens``: ``"keep"`` (trained as they are), ``"mask"`` (in the
    group's baseline, but no training pairs), ``"penalty"`` (reward minus ``overlong_penalty`` before
    the advantages)"""
    overlong_penalty: float = 1.0
    """what ``overlong="penalty"`` subtracts from an overlong episode's reward"""
    refill_groups: int = 0
    """dynamic sampling (DAPO): up to this many extra groups per step are drawn and rolled out while fewer
    than ``groups_per_step`` groups can train (constant reward, all infrastructure failures, ...); 0: off"""

    def __post_init__(self) -> None:
        if self.loss_norm not in LOSS_NORMS:
            raise ConfigError(f"loss_norm must be one of {LOSS_NORMS}, got {self.loss_norm!r}")
        if self.overlong not in OVERLONG_MODES:
            raise ConfigError(f"overlong must be one of {OVERLONG_MODES}, got {self.overlong!r}")
        if self.refill_groups < 0 or (self.loss_norm_constant is not None and self.loss_norm_constant <= 0):
            raise ConfigError("refill_groups must be >= 0 and loss_norm_constant > 0 when set")
        check_context(self.max_context_tokens, self.max_pack_tokens)

    @property
    def norm_constant(self) -> float:
        """The divisor of ``loss_norm="constant"``: ``loss_norm_constant``, else the episode budget
        ``max_context_tokens``."""
        return float(self.loss_norm_constant or self.max_context_tokens)


def draw_jobs(args: Args, tasks: list, step: int, groups: int | None = None, refill: int = 0,
              drawn: Sequence[tuple[Any, str]] = ()) -> list[tuple[Any, str]]:
    """(task, harness) jobs of a step (:func:`trainers.rollouts.draw.draw_jobs`); ``groups`` defaults to
    ``groups_per_step``, ``refill`` numbers the dynamic-sampling rounds of a step, ``drawn`` (the step's jobs so
    far) are not drawn again."""
    return draw_step_jobs(tasks, step, harnesses=args.harnesses, seed=args.seed, refill=refill, drawn=drawn,
                          n=args.groups_per_step if groups is None else groups, adapters=args.harness_adapters())


def collect_groups(args: Args, tasks: list, step: int, run) -> tuple[list[Any], list[Any], dict[str, int]]:
    """Step 1-2 with dynamic sampling: ``run(jobs) -> results``; returns (results, groups, refill stats).

    While fewer than ``groups_per_step`` groups can train and the ``refill_groups`` budget lasts, new
    groups are drawn (fresh seeded draws, without the step's earlier jobs: no two groups of a step share a key)
    and rolled out, until the suite has no undrawn task left; every group drawn stays in the metrics.
    """
    jobs = draw_jobs(args, tasks, step)
    results = list(run(jobs))
    groups = make_groups(results, normalize_std=args.normalize_std, overlong=args.overlong,
                         overlong_penalty=args.overlong_penalty, clean=args.clean)
    drawn = rounds = 0
    while drawn < args.refill_groups:
        missing = args.groups_per_step - sum(g.skipped is None for g in groups)
        if missing <= 0:
            break
        n = min(missing, args.refill_groups - drawn)
        new = draw_jobs(args, tasks, step, groups=n, refill=rounds + 1, drawn=jobs)
        if not new:  # every task of the suite was drawn this step (the draw logged it)
            break
        rounds += 1
        jobs += new
        more = list(run(new))
        drawn += len(new)
        results += more
        groups += make_groups(more, normalize_std=args.normalize_std, overlong=args.overlong,
                              overlong_penalty=args.overlong_penalty, clean=args.clean)
    return results, groups, {"refill_groups": drawn, "refill_rounds": rounds}


def _number(value: MetricValue) -> float:
    """A metric as a float for display (NaN when it is missing or not a number)."""
    return float(value) if isinstance(value, (int, float)) and value is not None else float("nan")


def resume(args: Args, policy: TrainablePolicy, optimizer: torch.optim.Optimizer, out: Path,
           echo=print, *, reference_taken: bool = False) -> tuple[int, int]:
    """Take the KL reference (unless ``reference_taken``), then load ``out``'s latest checkpoint if resuming (on
    every rank: a collective under FSDP); returns (first step, version).

    Invariant: the reference is always the weights the run *started* from (``args.policy``), taken
    before any checkpoint is loaded (:func:`train` takes it before sharding), so a resumed run penalises
    drift from the same model as the uninterrupted one would (not from the resumed weights).
    """
    if args.kl_coef > 0 and not reference_taken:
        policy.freeze_reference()
    if not (args.resume and latest_checkpoint(out) is not None):
        return 1, 0
    state = load_checkpoint(out, policy, optimizer)
    echo(f"resumed from {state['path']} (step {state['step']}, version {state['version']})")
    return state["step"] + 1, state["version"]


def _slim(groups: list[Any]) -> list[Any]:
    """Groups without their episodes' records: what :func:`pack_groups` reads (trees, advantages, masks)."""
    return [dataclasses.replace(g, episodes=[], dropped=[]) for g in groups]


def train(args: Args, *, policy: TrainablePolicy | None = None, echo=print) -> TrainSummary:
    """Run GRPO per ``args`` (on every rank under ``torchrun``: rank 0 rolls out, logs and writes the summary,
    every rank trains on its share); returns its summary (also written to ``<out_dir>/summary.json``)."""
    from tasks import load_suite

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    scale = args.scale
    ranks = setup_policy(args.policy, scale.dist, policy, reference=args.kl_coef > 0,
                         serve_in_process=scale.generation.backend == "transformers")
    main, policy = ranks.info.is_main, ranks.policy
    say = echo if main else (lambda *_: None)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    start, version = resume(args, policy, optimizer, out, say, reference_taken=True)
    tasks = list(load_suite(args.suite).tasks) if main else []
    eval_tasks = list(load_suite(args.eval.suite).tasks) if args.eval.suite and main else []
    metrics = (MetricsLogger(out, start_step=start, log=args.log, config=dataclasses.asdict(args)) if main
               else None)
    sampling = args.sampling()
    bar = None
    if args.log.progress and start <= args.steps and main:
        from tqdm.auto import tqdm

        bar = tqdm(total=args.steps, initial=start - 1, desc="grpo", unit="step")
    last: MetricsRow = {}
    judge = judge_for(tasks + eval_tasks)
    adapters = args.harness_adapters()  # built, so checked, before the first step

    def run(jobs):  # async: no version given, every call records the serving version that sampled it
        return run_jobs(rt, jobs, group_size=args.group_size, sampling=sampling, concurrency=args.concurrency,
                        fleet=fleet, adapters=adapters,
                        policy_version=None if scale.async_.max_staleness else version)

    regroup = functools.partial(make_groups, normalize_std=args.normalize_std, overlong=args.overlong,
                                overlong_penalty=args.overlong_penalty, clean=args.clean)
    ahead = RolloutAhead(lambda n: StepBatch(n, *collect_groups(args, tasks, n, run)), scale.async_, start=start,
                         stop=args.steps, regroup=regroup, rerun=lambda keys: run(jobs_for(keys, tasks)))
    with generation_services(ranks, scale.generation, out, max_context_tokens=args.max_context_tokens,
                            version=version), \
            rollout_services(ranks, rollout=scale.rollout, sandbox=args.sandbox, out_dir=out / "episodes", judge=judge,
                          max_context_tokens=args.max_context_tokens) as (rt, fleet), \
            ahead if main else contextlib.nullcontext():
        for step in range(start, args.steps + 1):
            t0 = time.perf_counter()
            row: MetricsRow = {}
            groups: list[Any] = []
            if main:
                batch = ahead.get(step, version)
                results, groups, rollout_s = batch.results, batch.groups, batch.rollout_s
                row = rollout_metrics(results, args.pass_threshold)
                row["rollout_s"] = rollout_s
                row["rollout_tokens_per_s"] = _number(row["sampled_tokens"]) / rollout_s if rollout_s > 0 else None
                row.update(group_summary(groups), **batch.stats)
                row.update(fleet_metrics(fleet))  # per-node / per-harness counts of the Ray fleet ({} on threads)
                if batch.metrics is not None and scale.async_.max_staleness:
                    row.update(batch.metrics.row(scale.async_.max_staleness))
            if ranks.info.distributed:
                groups = broadcast_object(_slim(groups) if main else [])
            packs = pack_groups(groups, max_tokens=args.max_pack_tokens, device=policy.device,
                                loss_norm=args.loss_norm, norm_constant=args.norm_constant)
            row["masked_inexact_tokens"] = sum(p.masked_inexact_tokens for p in packs)
            row.update(pack_stats(packs).as_metrics())
            if packs:
                with ranks.sync.updating():  # colocated engines sleep through the update, wake for the push
                    row.update(grpo_update(policy, optimizer, packs, args))
                    version += 1
                    ranks.sync.push(policy, version)
            row["version"] = version
            if main and eval_tasks and args.eval.every and (step % args.eval.every == 0 or step == args.steps):
                row.update(evaluate_harnesses(rt, eval_tasks, eval_harnesses(args.eval.harness, args.harnesses),
                                              samples=args.eval.samples, sampling=sampling,
                                              concurrency=args.concurrency, pass_threshold=args.pass_threshold,
                                              adapters=adapters))
            if main:
                row.update(ranks.sync.step_metrics())  # weight-sync timings, prefix-cache hit rates
            row["step_s"] = time.perf_counter() - t0
            if metrics is not None:
                last = metrics.log(step, row)
            if step % max(1, args.save_every) == 0 or step == args.steps:
                save_checkpoint(out, step, policy, optimizer, config=args, version=version,
                                keep=args.keep_checkpoints)
            if bar is not None:
                bar.set_postfix_str(f"reward {_number(row['reward_mean']):.3f} pass {_number(row['pass_rate']):.2f}"
                                    f" groups {row['groups_trained']}/{row['groups']}")
                bar.update(1)
    if bar is not None:
        bar.close()
    if metrics is not None:
        metrics.close()
    curves = plot_curves(metrics.path, out) if args.log.plot and metrics is not None else None
    ckpt = latest_checkpoint(out)
    summary = TrainSummary(algo="grpo", out_dir=str(out), steps=args.steps, metrics=str(out / "metrics.jsonl"),
                           last=last, version=version, checkpoint=str(ckpt) if ckpt else None,
                           curves=str(curves) if curves else None)
    if main:
        summary.write()
    if not math.isfinite(summary.final_loss or 0.0):
        say("warning: the last loss is not finite")
    return summary
