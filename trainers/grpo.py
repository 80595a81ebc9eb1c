"""GRPO over call trees, through real harnesses — one file, one loop (``clawgym train`` runs it).

Each step:

1. **Rollouts.** ``groups_per_step`` tasks are drawn from the train suite (a per-step seeded draw,
   so a resumed run draws what the uninterrupted one would have) and split between the harnesses
   of ``harnesses`` by ratio; each (task, harness) runs ``group_size`` episodes against the serving
   copy of the policy, sampling at ``temperature`` (the action of every episode).
2. **Groups.** Episodes are grouped by (task, harness); infrastructure failures are excluded (never
   scored 0); a group whose rewards are all equal is skipped; each episode gets one advantage
   ``A_e = r_e - mean(r)`` (``/ std`` with ``normalize_std``) for all of its sampled tokens.
   Calls not token-exact: their tokens are masked (see :mod:`trainers.tree_batch`).
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
5. **Sync.** After the update the serving policy gets the new weights and version (``trainers.sync``).

Metrics per step (``metrics.jsonl``): rollout reward and pass rate overall and per harness, groups
trained/skipped, ``kl_rollout`` (k3 estimate of KL(rollout ‖ trained) on the sampled tokens),
``clip_fraction`` (trainable tokens whose ratio left the clip range), importance weights, losses,
grad norm, tokens/s of training and of rollouts. ``step`` counts iterations; ``version`` counts
optimiser updates (a step whose groups all had constant reward makes no update).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clawgym_env.errors import PolicyError
from trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from trainers.evaluation import eval_harnesses, evaluate_harnesses
from trainers.logprobs import token_logprobs
from trainers.metrics import MetricsLogger, MetricsRow, MetricValue, plot_curves, rollout_metrics
from trainers.policy import PolicyConfig, TrainablePolicy
from trainers.rollouts import RolloutConfig, harness_plan, judge_for, rollout_fleet, run_jobs
from trainers.summary import TrainSummary
from trainers.sync import InProcessSync
from trainers.tree_batch import LOSS_NORMS, OVERLONG_MODES, TrainPack, group_summary, make_groups, pack_groups


@dataclasses.dataclass
class Args:
    """Every setting of a GRPO run (``clawgym train --help-config grpo`` lists them)."""
    out_dir: str = "runs/grpo"
    """folder of the run: metrics.jsonl, checkpoints/, episodes/, config.json, summary.json"""
    seed: int = 0
    """seed of Python, NumPy and torch, and of every step's task draw (a resumed run draws what the uninterrupted one
    would)"""
    steps: int = 10
    """number of iterations (each: rollouts, then an update)"""
    resume: bool = True
    """continue from ``out_dir``'s latest checkpoint when there is one"""
    save_every: int = 1
    """write a checkpoint every this many steps (and after the last one)"""
    keep_checkpoints: int = 2
    """keep only this many newest checkpoints"""
    # tasks and harnesses
    suite: str = "builtin"
    """train suite: a bundled suite name (``builtin``) or a folder of ClawGym task dirs"""
    harnesses: dict[str, float] = dataclasses.field(default_factory=lambda: {"mini": 1.0})
    """harnesses to roll out through, with ratios: each step's groups/tasks are split between them (mix-harness),
    e.g. ``{mini: 1, claude-code: 1}``"""
    groups_per_step: int = 4
    """(task, harness) groups per step, drawn from the suite without replacement"""
    group_size: int = 4
    """G: rollouts per group; each episode's advantage is its reward against the group's"""
    sandbox: str = "bwrap"
    """sandbox backend of every episode: ``bwrap`` or ``docker``"""
    concurrency: int = 4
    """episodes run at once (one sandbox each) on threads (the ``threads`` rollout backend, and evaluation)"""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """where the rollouts run: this process's threads or a Ray cluster (see the ``rollout.*`` fields)"""
    temperature: float = 1.0
    """sampling temperature of the rollouts; the trainer scores tokens at the same temperature"""
    top_p: float = 1.0
    """nucleus sampling of the rollouts; keep 1.0: the trainer does not reproduce top-p truncation"""
    max_tokens: int = 512
    """cap on the tokens one model call may sample (overrides the harness's own value)"""
    pass_threshold: float = 1.0
    """an episode whose reward reaches this counts as passed in the metrics"""
    # policy and optimisation
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    """the model to train (see the ``policy.*`` fields)"""
    learning_rate: float = 1e-5
    """AdamW learning rate of the policy"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradients are clipped to this global norm before each optimiser step"""
    update_epochs: int = 1
    """passes over one step's batch (> 1 moves the ratio away from 1, so clipping matters)"""
    minibatches: int = 1
    """optimiser steps per epoch: the step's packs are split into this many minibatches"""
    clip_eps: float = 0.2
    """PPO clip range: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]"""
    clip_eps_high: float | None = None
    """upper clip (DAPO's clip-higher); ``None``: ``clip_eps``"""
    is_clip: float = 2.0
    """cap of the truncated importance weight exp(logp_old - logp_rollout) against the serving policy's recorded
    logprobs"""
    kl_coef: float = 0.0
    """weight of the k3 KL penalty to the reference (the initial weights); 0: none and no reference kept"""
    normalize_std: bool = True
    """divide advantages by the group's reward standard deviation (Dr. GRPO argues for off)"""
    loss_norm: str = "episode"
    """how (token, episode) pair weights are normalised. ``"episode"`` (default, the original GRPO): each
    episode's loss is the mean over its own trainable tokens, then the group's mean — a token of a short
    episode weighs more than one of a long episode, so long failures are punished less per token (a
    length bias). ``"token"`` (DAPO): one mean over every pair of the step — long episodes weigh more.
    ``"constant"`` (Dr. GRPO): divided by ``G · loss_norm_constant`` per group — no length bias; the
    gradient's scale depends on the constant."""
    loss_norm_constant: float | None = None
    """the divisor of ``loss_norm="constant"`` (default: ``max_tokens``)"""
    overlong: str = "keep"
    """episodes with a call cut at ``max_tokens``: ``"keep"`` (trained as they are), ``"mask"`` (in the
    group's baseline, but no training pairs), ``"penalty"`` (reward minus ``overlong_penalty`` before
    the advantages)"""
    overlong_penalty: float = 1.0
    """what ``overlong="penalty"`` subtracts from an overlong episode's reward"""
    refill_groups: int = 0
    """dynamic sampling (DAPO): up to this many extra groups per step are drawn and rolled out while fewer
    than ``groups_per_step`` groups can train (constant reward, all infrastructure failures, ...); 0: off"""
    max_pack_tokens: int | None = None
    """pack several trees into one sequence up to this many tokens; ``None``: one group (tree) per pack"""
    chunk_size: int = 1024
    """LM-head rows computed at once when scoring (memory vs speed with the 151k vocabulary)"""
    # evaluation and logging
    eval_suite: str | None = None
    """held-out suite evaluated in the loop (``None``: no in-loop evaluation)"""
    eval_every: int = 0
    """evaluate every this many steps and after the last one (0: never)"""
    eval_samples: int = 1
    """episodes per held-out task and harness"""
    eval_harness: str | None = None
    """harness of the in-loop evaluation; ``None``: every harness of ``harnesses`` (metrics per harness)"""
    tensorboard: bool = False
    """also write TensorBoard event files into ``out_dir``"""
    plot: bool = True
    """draw ``curves.png`` from the metrics at the end"""
    progress: bool = True
    """show a progress bar"""

    def __post_init__(self) -> None:
        if self.loss_norm not in LOSS_NORMS:
            raise PolicyError(f"loss_norm must be one of {LOSS_NORMS}, got {self.loss_norm!r}")
        if self.overlong not in OVERLONG_MODES:
            raise PolicyError(f"overlong must be one of {OVERLONG_MODES}, got {self.overlong!r}")
        if self.refill_groups < 0 or (self.loss_norm_constant is not None and self.loss_norm_constant <= 0):
            raise PolicyError("refill_groups must be >= 0 and loss_norm_constant > 0 when set")


def grpo_loss(logp: torch.Tensor, logp_old: torch.Tensor, is_weight: torch.Tensor, pack: TrainPack, *,
              clip_low: float, clip_high: float, kl_coef: float = 0.0,
              logp_ref: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The step-4 loss of one pack (all inputs [T] tensors aligned with ``pack``)."""
    t = pack.pair_token
    ratio = torch.exp(logp[t] - logp_old[t])
    adv = pack.pair_adv
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)
    pg = -(pack.pair_weight * is_weight[t] * surrogate).sum()
    loss = pg
    stats = {"pg_loss": float(pg.detach())}
    m = pack.trainable
    if logp_ref is not None:
        d = logp_ref[m] - logp[m]
        kl = (pack.token_weight[m] * (torch.exp(d) - d - 1.0)).sum()
        loss = loss + kl_coef * kl
        stats["kl_ref"] = float(kl.detach())
    r_tok = torch.exp((logp - logp_old)[m].detach())
    stats["clipped_tokens"] = float(((r_tok < 1.0 - clip_low) | (r_tok > 1.0 + clip_high)).sum())
    stats["tokens"] = float(m.sum())
    return loss, stats


def _score(policy: TrainablePolicy, model, pack: TrainPack, args: Args) -> torch.Tensor:
    return token_logprobs(model, pack.packed, args.chunk_size, mask=pack.trainable, temperature=args.temperature,
                          vocab_limit=policy.vocab_limit)


def grpo_update(policy: TrainablePolicy, optimizer: torch.optim.Optimizer, packs: list[TrainPack],
                args: Args) -> MetricsRow:
    """Steps 4 of the module docstring over ``packs``; returns the update's statistics."""
    clip_high = args.clip_eps if args.clip_eps_high is None else args.clip_eps_high
    model = policy.causal_lm
    t0 = time.perf_counter()
    olds: list[torch.Tensor] = []
    weights: list[torch.Tensor] = []
    refs: list[torch.Tensor | None] = []
    kl_roll, is_sum, is_clipped, n_tok = 0.0, 0.0, 0, 0
    with torch.no_grad():
        for pack in packs:
            old = _score(policy, model, pack, args)
            m = pack.trainable
            log_w = old - pack.packed.rollout_logprobs
            w = torch.where(m, torch.exp(log_w).clamp(max=args.is_clip), torch.zeros_like(old))
            olds.append(old)
            weights.append(w)
            lw = log_w[m].double()  # float64: the k3 terms are ~lw²/2, below float32 resolution near 0
            kl_roll += float((torch.exp(lw) - 1.0 - lw).sum())  # k3 of KL(rollout || trained), r = p_old/p_roll
            is_sum += float(w[m].sum())
            is_clipped += int((torch.exp(lw) > args.is_clip).sum())
            n_tok += int(m.sum())
            if args.kl_coef > 0:
                with policy.reference() as ref_model:
                    refs.append(_score(policy, ref_model, pack, args))
            else:
                refs.append(None)
    groups_of = [len({e.group for e in p.episodes}) for p in packs]
    total_groups = sum(groups_of)
    totals: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0, "kl_ref": 0.0, "clipped_tokens": 0.0, "tokens": 0.0}
    grad_norms = []
    processed = 0
    for _ in range(args.update_epochs):
        order = np.random.permutation(len(packs)).tolist() if args.minibatches > 1 else list(range(len(packs)))
        for chunk in np.array_split(np.asarray(order, dtype=int), max(1, min(args.minibatches, len(packs)))):
            if len(chunk) == 0:
                continue
            scale = total_groups / max(1, sum(groups_of[i] for i in chunk))  # mean over this minibatch's groups
            optimizer.zero_grad(set_to_none=True)
            for i in chunk.tolist():
                pack = packs[i]
                logp = _score(policy, model, pack, args)
                loss, st = grpo_loss(logp, olds[i], weights[i], pack, clip_low=args.clip_eps, clip_high=clip_high,
                                     kl_coef=args.kl_coef, logp_ref=refs[i])
                (loss * scale).backward()
                processed += pack.num_tokens
                totals["loss"] += float(loss.detach())
                for k in ("pg_loss", "kl_ref", "clipped_tokens", "tokens"):
                    totals[k] += st.get(k, 0.0)
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(),
                                                                   args.max_grad_norm)))
            optimizer.step()
    epochs = max(1, args.update_epochs)
    dt = time.perf_counter() - t0
    return {"loss": totals["loss"] / epochs, "pg_loss": totals["pg_loss"] / epochs,
            "kl_ref": totals["kl_ref"] / epochs if args.kl_coef > 0 else None,
            "clip_fraction": totals["clipped_tokens"] / totals["tokens"] if totals["tokens"] else None,
            "kl_rollout": kl_roll / n_tok if n_tok else None, "is_weight_mean": is_sum / n_tok if n_tok else None,
            "is_clipped_share": is_clipped / n_tok if n_tok else None, "trainable_tokens": n_tok,
            "train_tokens": processed, "train_s": dt, "train_tokens_per_s": processed / dt if dt > 0 else None,
            "grad_norm": max(grad_norms) if grad_norms else None, "updates": len(grad_norms)}


def draw_jobs(args: Args, tasks: list, step: int, groups: int | None = None, refill: int = 0) -> list[tuple[Any, str]]:
    """(task, harness) jobs of a step: a seeded draw per step (and per refill round), without replacement
    within a draw; ``groups`` defaults to ``groups_per_step``."""
    seed = args.seed * 1_000_003 + step
    rng = random.Random(seed if refill == 0 else seed * 1_009 + refill)
    plan = harness_plan(args.harnesses, args.groups_per_step if groups is None else groups)
    jobs = []
    for harness, n in sorted(plan.items()):
        picks: list[Any] = []
        while len(picks) < n:
            picks += rng.sample(tasks, min(len(tasks), n - len(picks)))
        jobs += [(t, harness) for t in picks]
    return jobs


def collect_groups(args: Args, tasks: list, step: int, run) -> tuple[list[Any], list[Any], dict[str, int]]:
    """Step 1-2 with dynamic sampling: ``run(jobs) -> results``; returns (results, groups, refill stats).

    While fewer than ``groups_per_step`` groups can train and the ``refill_groups`` budget lasts, new
    groups are drawn (fresh seeded draws) and rolled out; every group drawn stays in the metrics.
    """
    results = list(run(draw_jobs(args, tasks, step)))
    groups = make_groups(results, normalize_std=args.normalize_std, overlong=args.overlong,
                         overlong_penalty=args.overlong_penalty)
    drawn = rounds = 0
    while drawn < args.refill_groups:
        missing = args.groups_per_step - sum(g.skipped is None for g in groups)
        if missing <= 0:
            break
        n = min(missing, args.refill_groups - drawn)
        rounds += 1
        more = list(run(draw_jobs(args, tasks, step, groups=n, refill=rounds)))
        drawn += n
        results += more
        groups += make_groups(more, normalize_std=args.normalize_std, overlong=args.overlong,
                              overlong_penalty=args.overlong_penalty)
    return results, groups, {"refill_groups": drawn, "refill_rounds": rounds}


def _number(value: MetricValue) -> float:
    """A metric as a float for display (NaN when it is missing or not a number)."""
    return float(value) if isinstance(value, (int, float)) and value is not None else float("nan")


def resume(args: Args, policy: TrainablePolicy, optimizer: torch.optim.Optimizer, out: Path,
           echo=print) -> tuple[int, int]:
    """Take the KL reference, then load ``out``'s latest checkpoint if resuming; returns (first step, version).

    Invariant: the reference is always the weights the run *started* from (``args.policy``), taken
    before any checkpoint is loaded, so a resumed run penalises drift from the same model as the
    uninterrupted one would (not from the resumed weights).
    """
    if args.kl_coef > 0:
        policy.freeze_reference()
    if not (args.resume and latest_checkpoint(out) is not None):
        return 1, 0
    state = load_checkpoint(out, policy, optimizer)
    echo(f"resumed from {state['path']} (step {state['step']}, version {state['version']})")
    return state["step"] + 1, state["version"]


def train(args: Args, *, policy: TrainablePolicy | None = None, echo=print) -> TrainSummary:
    """Run GRPO per ``args``; returns its summary (also written to ``<out_dir>/summary.json``)."""
    from clawgym_env.runtime import Runtime
    from tasks import load_suite

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    policy = policy or TrainablePolicy(args.policy)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    start, version = resume(args, policy, optimizer, out, echo)
    tasks = list(load_suite(args.suite).tasks)
    eval_tasks = list(load_suite(args.eval_suite).tasks) if args.eval_suite else []
    sync = InProcessSync.for_policy(policy)
    if version:
        sync.push(policy, version)
    metrics = MetricsLogger(out, tensorboard=args.tensorboard, start_step=start)
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "max_tokens": args.max_tokens}
    bar = None
    if args.progress and start <= args.steps:
        from tqdm.auto import tqdm

        bar = tqdm(total=args.steps, initial=start - 1, desc="grpo", unit="step")
    last: MetricsRow = {}
    judge = judge_for(tasks + eval_tasks)
    with Runtime(sync.serving, sandbox=args.sandbox, out_dir=out / "episodes", judge=judge) as rt, \
            rollout_fleet(args.rollout, sync.serving, sandbox=args.sandbox, out_dir=out / "episodes",
                          judge=judge) as fleet:
        for step in range(start, args.steps + 1):
            t0 = time.perf_counter()
            results, groups, refill = collect_groups(
                args, tasks, step, lambda jobs, v=version: run_jobs(rt, jobs, group_size=args.group_size,
                                                                     sampling=sampling, policy_version=v,
                                                                     concurrency=args.concurrency, fleet=fleet))
            rollout_s = time.perf_counter() - t0
            row = rollout_metrics(results, args.pass_threshold)
            row["rollout_s"] = rollout_s
            row["rollout_tokens_per_s"] = _number(row["sampled_tokens"]) / rollout_s if rollout_s > 0 else None
            row.update(group_summary(groups), **refill)
            packs = pack_groups(groups, max_tokens=args.max_pack_tokens, device=policy.device,
                                loss_norm=args.loss_norm, norm_constant=args.loss_norm_constant or args.max_tokens)
            row["masked_inexact_tokens"] = sum(p.masked_inexact_tokens for p in packs)
            if packs:
                row.update(grpo_update(policy, optimizer, packs, args))
                version += 1
                sync.push(policy, version)
            row["version"] = version
            if eval_tasks and args.eval_every and (step % args.eval_every == 0 or step == args.steps):
                row.update(evaluate_harnesses(rt, eval_tasks, eval_harnesses(args.eval_harness, args.harnesses),
                                              samples=args.eval_samples, sampling=sampling,
                                              concurrency=args.concurrency, pass_threshold=args.pass_threshold))
            row["step_s"] = time.perf_counter() - t0
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
    metrics.close()
    curves = plot_curves(metrics.path, out) if args.plot else None
    ckpt = latest_checkpoint(out)
    summary = TrainSummary(algo="grpo", out_dir=str(out), steps=args.steps, metrics=str(metrics.path), last=last,
                           version=version, checkpoint=str(ckpt) if ckpt else None,
                           curves=str(curves) if curves else None)
    summary.write()
    if not math.isfinite(summary.final_loss or 0.0):
        echo("warning: the last loss is not finite")
    return summary
