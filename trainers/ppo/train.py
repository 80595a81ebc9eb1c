"""PPO with a critic over call trees, through real harnesses — one file, one loop (``clawgym train`` runs it).

Each step: ``tasks_per_step`` tasks (split between ``harnesses`` by ratio) × ``samples_per_task``
rollouts (the paper: 256 × 1) run against the serving copy of the policy; ONE call tree per episode
(a harness that forks — retries, subagents, compaction — gives a tree with several leaves); the
trees are packed, scored once without gradient (``logp_old``, the critic's ``V_old``, the reference's
logprob with ``kl_coef > 0``); advantages and returns come from :func:`trainers.batch.advantages.tree_gae`
(``gamma = lam = 1`` by default). The first ``value_pretrain_steps`` steps train only the critic
(the policy is frozen: it gets no gradient and is not synced); later steps run ``update_epochs`` ×
``minibatches`` optimiser steps of the loss below, then sync the weights to the serving policy
(its version goes up by one). Checkpoints hold policy, critic and optimiser (:mod:`trainers.scale.checkpoint`).

Where a value is read. ``V_t`` is the value of the state from which sampled token ``t`` was drawn,
the prefix *before* ``t``: it is read from the hidden state at ``t``'s predecessor index
(:mod:`trainers.batch.packing`), the row whose logits score ``t``. That row sees exactly the prefix before
``t``; reading it at ``t`` itself would let the critic see the action it judges. The packed forward
computes every tree token once, so a token on a shared prefix has ONE value, the same for every
path through it, and children forking after a sampled token all read their parent's last row.

Advantages on shared nodes (:mod:`trainers.batch.advantages`). GAE runs along every root→leaf path over
its sampled tokens (context tokens are the environment's moves, not actions); the path's terminal
reward (mean reward of the episodes ending at its leaf) arrives at its last sampled token. A token
on a node shared by several paths takes the MEAN over the paths through it of its per-path
advantage and return (each leaf counts once). With ``gamma = lam = 1`` each path of one episode gives
``A_t = R - V_t``, so the mean is exact; otherwise it is the documented combination.

Loss normalisation (per rollout, as GRPO and the paper weight tokens): a trained token counts once
for each rollout (episode) whose calls pass through it — a prefix shared by a retry's two branches
is one token of that episode, not one per path (:func:`loss_weights`). ``loss_norm="tree"`` (default)
makes each episode's loss the mean over its own distinct trained tokens and averages the episodes of
a minibatch (every episode counts the same, however it branched); ``"token"`` divides the summed
per-rollout token terms by their count over the minibatch.

The per-token targets below are built once per update in :mod:`trainers.ppo.targets`.

Per trained token (sampled, with a predecessor, on a token-exact call: :func:`trainers.batch.packing.trainable_mask`),
``r = exp(logp - logp_old)``:

* policy ``-w * min(r A, clip(r, 1 - clip_eps, 1 + clip_eps_high) A)`` with token-level truncated IS
  ``w = min(exp(logp_old - logp_rollout), is_clip)`` against the serving policy's recorded logprob;
* value ``vf_coef * 0.5 * max((V - R)^2, (V_old + clip(V - V_old, ±vf_clip) - R)^2)`` (plain when 0);
* optional ``- ent_coef * entropy`` and ``+ kl_coef * (exp(q) - q - 1)``, ``q = logp_ref - logp``.

Failed rollouts are records: infrastructure failures are dropped (never scored 0), other failures
train with their reward; a step without a trainable token makes no update and still logs.

Cleaning (``clean:``, :mod:`trainers.batch.clean`), before the trees are built: only the calls of
``train_kinds`` (the main agent by default) minus dead retries are trained, and a rollout whose cleaned tree
has more than ``max_leaves`` leaves is dropped; counted in the ``clean/...`` metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from pathlib import Path
from typing import Any

import torch

from clawgym_env.errors import ConfigError
from trainers.batch.clean import CleanConfig, CleanStats, clean_rollouts
from trainers.batch.pack_parts import pack_stats
from trainers.batch.tree_batch import as_episode, rollout_packs
from trainers.metrics import MetricsRow
from trainers.policy import TrainablePolicy
from trainers.ppo.targets import PackTargets, add_reference, forward_pack, gae_targets, loss_weights, prepare
from trainers.ppo.update import batch_metrics, ppo_loss, update
from trainers.ppo.value import CRITIC_KINDS, ActorCritic, Critic
from trainers.ranks import check_context, generation_services, rollout_services, setup_policy
from trainers.rollouts.ahead import RolloutAhead, StepBatch, jobs_for
from trainers.rollouts.draw import draw_jobs as draw_step_jobs
from trainers.run_args import RLArgs
from trainers.scale.fsdp import broadcast_object, shard_model
from trainers.summary import TrainSummary

__all__ = ["Args", "PackTargets", "add_reference", "batch_metrics", "clean_trees", "draw_jobs", "episode_trees",
           "forward_pack",
           "gae_targets", "loss_weights", "ppo_loss", "prepare", "train", "update"]


@dataclasses.dataclass
class Args(RLArgs):
    """Every setting of a PPO run (``clawgym train --help-config ppo`` lists them): the shared ones of
    :class:`~trainers.run_args.RLArgs`, then PPO's tasks per step, critic, GAE and value loss."""
    out_dir: str = "runs/ppo"
    learning_rate: float = 1e-6
    minibatches: int = 4
    tasks_per_step: int = 256
    """tasks per step (the paper: 256), split between the harnesses by ratio"""
    samples_per_task: int = 1
    """rollouts per task (the paper: 1); one call tree per episode"""
    critic: str = "separate"
    """``separate``: the critic has its own trainable trunk (a copy of the policy's, or ``value_model``); ``shared``:
    a value head on the policy's trunk, trained through it; ``lora``: the policy's frozen base under the critic's
    own LoRA adapters; ``head``: a value head on the policy's detached hidden states (``lora``/``head`` fit LoRA
    runs on one GPU; ``separate`` under LoRA warns of its memory)"""
    critic_lora_rank: int = 0
    """``critic: lora``: the rank of the critic's adapters (0: ``policy.lora_rank``; alpha, dropout and targets
    are the policy's)"""
    value_model: str | None = None
    """separate critic: start its trunk from this model directory instead of the policy"""
    value_head_init_std: float | None = None
    """standard deviation of the value head's initial weights (``None``: 1 / hidden size)"""
    critic_learning_rate: float = 1e-5
    """AdamW learning rate of the critic"""
    value_pretrain_steps: int = 0
    """the first this many steps train only the critic (the policy is frozen and not synced)"""
    gamma: float = 1.0
    """GAE discount over sampled tokens along each root-to-leaf path"""
    lam: float = 1.0
    """GAE lambda"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    vf_clip: float = 0.2
    """value clipping around the old value (0: plain squared error)"""
    ent_coef: float = 0.0
    """weight of the entropy bonus (0: none, and no entropy computed)"""
    normalize_advantages: bool = False
    """normalise the advantages of the step's trained tokens to mean 0, std 1"""
    loss_norm: str = "tree"
    """``tree``: each episode's loss is the mean over its own distinct trained tokens, episodes averaged; ``token``:
    one mean over the per-rollout token terms of the minibatch"""

    def __post_init__(self) -> None:
        if self.loss_norm not in ("tree", "token") or self.critic not in CRITIC_KINDS:
            raise ConfigError(f"loss_norm must be tree|token and critic {'|'.join(CRITIC_KINDS)}, got "
                              f"{self.loss_norm!r}, {self.critic!r}")
        if self.critic_lora_rank < 0:
            raise ConfigError(f"critic_lora_rank must be >= 0, got {self.critic_lora_rank}")
        if self.critic == "lora" and (self.critic_lora_rank or self.policy.lora_rank) <= 0:
            raise ConfigError("critic: lora needs a LoRA rank: set critic_lora_rank (or policy.lora_rank) > 0")
        if self.value_model and self.critic != "separate":
            raise ConfigError(f"value_model starts a separate critic's trunk; critic: {self.critic} has none of its "
                              "own to load (set critic: separate, or drop value_model)")
        if self.clip_eps < 0 or (self.clip_eps_high or 0) < 0 or self.is_clip <= 0 or self.vf_clip < 0:
            raise ConfigError("clip_eps, clip_eps_high and vf_clip must be >= 0 and is_clip > 0")
        check_context(self.max_context_tokens, self.max_pack_tokens)


# ---- the loop --------------------------------------------------------------------------------------
def draw_jobs(args: Args, tasks: list, step: int) -> list[tuple[Any, str]]:
    """(task, harness) jobs of a step: ``tasks_per_step`` tasks (:func:`trainers.rollouts.draw.draw_jobs`)."""
    return draw_step_jobs(tasks, step, harnesses=args.harnesses, n=args.tasks_per_step, seed=args.seed,
                          adapters=args.harness_adapters())


def clean_trees(results, clean: CleanConfig | None = None) -> tuple[list[Any], CleanStats]:
    """One call tree per episode over its cleaned calls (:mod:`trainers.batch.clean`; ``meta`` carries harness and
    reward), and what cleaning removed; infra failures, rollouts over ``max_leaves`` and episodes left without a
    call are dropped."""
    from clawgym_env.capture.tree import CallTree

    episodes = [ep for ep in map(as_episode, results) if not ep[0].is_infra_failure]
    keep, cleaned, stats = clean_rollouts(episodes, clean)
    return [CallTree.from_episodes([(episodes[i][0], calls)]) for i, calls in zip(keep, cleaned) if calls], stats


def episode_trees(results, clean: CleanConfig | None = None) -> list[Any]:
    """The trees of :func:`clean_trees` (``clean=None``: every call as captured)."""
    return clean_trees(results, clean)[0]


def train(args: Args, *, policy: TrainablePolicy | None = None, echo=print) -> TrainSummary:
    """Run PPO per ``args`` (on every rank under ``torchrun``: rank 0 rolls out, logs and writes the summary,
    every rank trains on its share); returns its summary (also written to ``<out_dir>/summary.json``)."""
    from tasks import load_suite
    from trainers.metrics import MetricsLogger, plot_curves, rollout_metrics
    from trainers.rollouts.evaluation import eval_harnesses, evaluate_harnesses
    from trainers.rollouts.sync import fleet_metrics, judge_for, run_jobs
    from trainers.scale.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from trainers.scale.fsdp import shard_policy

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    # the reference (initial weights, also when resuming), the serving copy and the critic's copy of the policy
    # are taken from the unsharded module
    scale = args.scale
    ranks = setup_policy(args.policy, scale.dist, policy, reference=args.kl_coef > 0, name="ppo", shard=False,
                         serve_in_process=scale.generation.backend == "transformers")
    main, policy = ranks.info.is_main, ranks.policy
    say = echo if main else (lambda *_: None)
    critic = Critic.for_policy(policy, args.critic, args.value_model, args.value_head_init_std, args.seed,
                               lora_rank=args.critic_lora_rank)
    shard_policy(policy, scale.dist)
    shard_model(critic, mixed_precision=scale.dist.mixed_precision,
                reshard_after_forward=scale.dist.reshard_after_forward)
    optimizer = torch.optim.AdamW([{"params": policy.trainable_parameters(), "lr": args.learning_rate},
                                   {"params": [p for p in critic.parameters() if p.requires_grad],
                                    "lr": args.critic_learning_rate}], weight_decay=args.weight_decay)
    state = ActorCritic(policy, critic)
    start, version = 1, 0
    if args.resume and latest_checkpoint(out) is not None:
        loaded = load_checkpoint(out, state, optimizer)
        start, version = loaded["step"] + 1, loaded["version"]
        say(f"resumed from {loaded['path']} (step {loaded['step']}, version {version})")
    tasks = list(load_suite(args.suite).tasks) if main else []
    eval_tasks = list(load_suite(args.eval.suite).tasks) if args.eval.suite and main else []
    metrics = (MetricsLogger(out, start_step=start, log=args.log, config=dataclasses.asdict(args)) if main
               else None)
    sampling = args.sampling()
    last: MetricsRow = {}
    judge = judge_for(tasks + eval_tasks)
    adapters = args.harness_adapters()  # built, so checked, before the first step
    ref_root = policy.module if policy.lora else None  # LoRA's reference is the policy with adapters off

    def run(jobs):  # async: no version given, every call records the serving version that sampled it
        return run_jobs(rt, jobs, group_size=args.samples_per_task, sampling=sampling, concurrency=args.concurrency,
                        fleet=fleet, adapters=adapters,
                        policy_version=None if scale.async_.max_staleness else version)

    ahead = RolloutAhead(lambda n: StepBatch(n, run(draw_jobs(args, tasks, n)), []), scale.async_, start=start,
                         stop=args.steps, rerun=lambda keys: run(jobs_for(keys, tasks)))
    with generation_services(ranks, scale.generation, out, max_context_tokens=args.max_context_tokens,
                            version=version), \
            rollout_services(ranks, rollout=scale.rollout, sandbox=args.sandbox, out_dir=out / "episodes", judge=judge,
                          max_context_tokens=args.max_context_tokens) as (rt, fleet), \
            ahead if main else contextlib.nullcontext():
        for step in range(start, args.steps + 1):
            t0 = time.perf_counter()
            row: MetricsRow = {}
            trees: list[Any] = []
            if main:
                batch = ahead.get(step, version)
                results = batch.results
                row = {**rollout_metrics(results, args.pass_threshold), "rollout_s": batch.rollout_s}
                row.update(fleet_metrics(fleet))  # the Ray fleet's counts ({} on threads)
                if batch.metrics is not None and scale.async_.max_staleness:
                    row.update(batch.metrics.row(scale.async_.max_staleness))
                trees, cleaned = clean_trees(results, args.clean)
                row.update(cleaned.as_metrics())
            trees = broadcast_object(trees)
            packs = rollout_packs(trees, args.max_pack_tokens, device=policy.device)
            row.update(pack_stats(packs).as_metrics())
            pretrain = step <= args.value_pretrain_steps
            # colocated engines sleep through the update (forwards included) and wake for the push
            with ranks.sync.updating() if not pretrain else contextlib.nullcontext():
                model = policy.causal_lm
                model.eval()
                critic.eval()
                targets = prepare(model, critic, packs, args, policy.vocab_limit, policy_root=policy.module)
                if args.kl_coef > 0 and not pretrain:
                    with policy.reference() as ref:
                        add_reference(targets, ref, args, policy.vocab_limit, root=ref_root)
                model.train()
                critic.train()  # a separate critic's trunk checkpoints activations only in training mode
                t1 = time.perf_counter()
                stats = update(model, critic, targets, args, optimizer, pretrain=pretrain,
                               vocab_limit=policy.vocab_limit, policy_root=policy.module)
                if stats and not pretrain:
                    version += 1
                    ranks.sync.push(policy, version)
            row.update(batch_metrics(targets, args.is_clip), **stats, trees=len(trees), packs=len(packs),
                       phase="value_pretrain" if pretrain else "ppo", version=version,
                       train_s=time.perf_counter() - t1)
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
                save_checkpoint(out, step, state, optimizer, config=args, version=version, keep=args.keep_checkpoints)
            if args.log.progress:
                say(f"ppo step {step}/{args.steps} [{row['phase']}] reward {row.get('reward_mean')} "
                    f"v_loss {row.get('v_loss')} version {version}")
    if metrics is not None:
        metrics.close()
    curves = plot_curves(metrics.path, out) if args.log.plot and metrics is not None else None
    ckpt = latest_checkpoint(out)
    summary = TrainSummary(algo="ppo", out_dir=str(out), steps=args.steps, metrics=str(out / "metrics.jsonl"),
                           last=last, version=version, checkpoint=str(ckpt) if ckpt else None,
                           curves=str(curves) if curves else None)
    if main:
        summary.write()
    if not math.isfinite(summary.final_loss or 0.0):
        say("warning: the last loss is not finite")
    return summary
