"""PPO with a critic over call trees, through real harnesses — one file, one loop (``clawgym train`` runs it).

Each step: ``tasks_per_step`` tasks (split between ``harnesses`` by ratio) × ``samples_per_task``
rollouts (the paper: 256 × 1) run against the serving copy of the policy; ONE call tree per episode
(a harness that forks — retries, subagents, compaction — gives a tree with several leaves); the
trees are packed, scored once without gradient (``logp_old``, the critic's ``V_old``, the reference's
logprob with ``kl_coef > 0``); advantages and returns come from :func:`trainers.advantages.tree_gae`
(``gamma = lam = 1`` by default). The first ``value_pretrain_steps`` steps train only the critic
(the policy is frozen: it gets no gradient and is not synced); later steps run ``update_epochs`` ×
``minibatches`` optimiser steps of the loss below, then sync the weights to the serving policy
(its version goes up by one). Checkpoints hold policy, critic and optimiser (:mod:`trainers.checkpoint`).

Where a value is read. ``V_t`` is the value of the state from which sampled token ``t`` was drawn,
the prefix *before* ``t``: it is read from the hidden state at ``t``'s predecessor index
(:mod:`trainers.packing`), the row whose logits score ``t``. That row sees exactly the prefix before
``t``; reading it at ``t`` itself would let the critic see the action it judges. The packed forward
computes every tree token once, so a token on a shared prefix has ONE value, the same for every
path through it, and children forking after a sampled token all read their parent's last row.

Advantages on shared nodes (:mod:`trainers.advantages`). GAE runs along every root→leaf path over
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

The per-token targets below are built once per update in :mod:`trainers.ppo_targets`.

Per trained token (sampled, with a predecessor, on a token-exact call: :func:`trainers.packing.trainable_mask`),
``r = exp(logp - logp_old)``:

* policy ``-w * min(r A, clip(r, 1 - clip_eps, 1 + clip_eps_high) A)`` with token-level truncated IS
  ``w = min(exp(logp_old - logp_rollout), is_clip)`` against the serving policy's recorded logprob;
* value ``vf_coef * 0.5 * max((V - R)^2, (V_old + clip(V - V_old, ±vf_clip) - R)^2)`` (plain when 0);
* optional ``- ent_coef * entropy`` and ``+ kl_coef * (exp(q) - q - 1)``, ``q = logp_ref - logp``.

Failed rollouts are records: infrastructure failures are dropped (never scored 0), other failures
train with their reward; a step without a trainable token makes no update and still logs.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from pathlib import Path
from typing import Any

import torch

from clawgym_env.errors import PolicyError
from trainers.metrics import MetricsRow
from trainers.policy import PolicyConfig, TrainablePolicy
from trainers.ppo_targets import PackTargets, add_reference, forward_pack, gae_targets, loss_weights, prepare  # noqa: F401
from trainers.rollouts import RolloutConfig
from trainers.summary import TrainSummary
from trainers.tree_batch import rollout_packs
from trainers.value import ActorCritic, Critic


@dataclasses.dataclass
class Args:
    """Every setting of a PPO run (``clawgym train --help-config ppo`` lists them)."""
    out_dir: str = "runs/ppo"
    """folder of the run: metrics.jsonl, checkpoints/, episodes/, config.json, summary.json"""
    seed: int = 0
    """seed of Python, NumPy and torch, and of every step's task draw (a resumed run draws what the uninterrupted one
    would)"""
    steps: int = 100
    """number of iterations (each: rollouts, then an update)"""
    resume: bool = True
    """continue from ``out_dir``'s latest checkpoint when there is one"""
    save_every: int = 10
    """write a checkpoint every this many steps (and after the last one)"""
    keep_checkpoints: int = 2
    """keep only this many newest checkpoints"""
    # tasks and harnesses (ratios split each step's tasks between harnesses)
    suite: str = "builtin"
    """train suite: a bundled suite name (``builtin``) or a folder of ClawGym task dirs"""
    harnesses: dict[str, float] = dataclasses.field(default_factory=lambda: {"mini": 1.0})
    """harnesses to roll out through, with ratios: each step's groups/tasks are split between them (mix-harness),
    e.g. ``{mini: 1, claude-code: 1}``"""
    tasks_per_step: int = 256
    """tasks per step (the paper: 256), split between the harnesses by ratio"""
    samples_per_task: int = 1
    """rollouts per task (the paper: 1); one call tree per episode"""
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
    max_tokens: int = 1024
    """cap on the tokens one model call may sample (overrides the harness's own value)"""
    pass_threshold: float = 1.0
    """an episode whose reward reaches this counts as passed in the metrics"""
    # policy, critic and optimisation
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    """the model to train (see the ``policy.*`` fields)"""
    critic: str = "separate"
    """``separate``: the critic has its own trunk (a copy of the policy's, or ``value_model``); ``shared``: a value
    head on the policy's trunk"""
    value_model: str | None = None
    """separate critic: start its trunk from this model directory instead of the policy"""
    value_head_init_std: float | None = None
    """standard deviation of the value head's initial weights (``None``: 1 / hidden size)"""
    learning_rate: float = 1e-6
    """AdamW learning rate of the policy"""
    critic_learning_rate: float = 1e-5
    """AdamW learning rate of the critic"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradients are clipped to this global norm before each optimiser step"""
    value_pretrain_steps: int = 0
    """the first this many steps train only the critic (the policy is frozen and not synced)"""
    update_epochs: int = 1
    """passes over one step's batch (> 1 moves the ratio away from 1, so clipping matters)"""
    minibatches: int = 4
    """optimiser steps per epoch: the step's packs are split into this many minibatches"""
    max_pack_tokens: int | None = 32768
    """pack several trees into one sequence up to this many tokens"""
    chunk_size: int = 1024
    """LM-head rows computed at once when scoring (memory vs speed with the 151k vocabulary)"""
    gamma: float = 1.0
    """GAE discount over sampled tokens along each root-to-leaf path"""
    lam: float = 1.0
    """GAE lambda"""
    clip_eps: float = 0.2
    """PPO clip range: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]"""
    clip_eps_high: float | None = None
    """upper clip (DAPO's clip-higher); ``None``: ``clip_eps``"""
    is_clip: float = 2.0
    """cap of the truncated importance weight exp(logp_old - logp_rollout) against the serving policy's recorded
    logprobs"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    vf_clip: float = 0.2
    """value clipping around the old value (0: plain squared error)"""
    ent_coef: float = 0.0
    """weight of the entropy bonus (0: none, and no entropy computed)"""
    kl_coef: float = 0.0
    """weight of the k3 KL penalty to the reference (the initial weights); 0: none and no reference kept"""
    normalize_advantages: bool = False
    """normalise the advantages of the step's trained tokens to mean 0, std 1"""
    loss_norm: str = "tree"
    """``tree``: each episode's loss is the mean over its own distinct trained tokens, episodes averaged; ``token``:
    one mean over the per-rollout token terms of the minibatch"""
    # evaluation and logging
    eval_suite: str | None = None
    """held-out suite evaluated in the loop (``None``: no in-loop evaluation)"""
    eval_every: int = 0
    """evaluate every this many steps and after the last one (0: never)"""
    eval_samples: int = 1
    """episodes per held-out task and harness"""
    eval_harness: str | None = None
    """harness of the in-loop evaluation; ``None``: every harness of ``harnesses`` (metrics per harness)"""
    plot: bool = True
    """draw ``curves.png`` from the metrics at the end"""

    def __post_init__(self) -> None:
        if self.loss_norm not in ("tree", "token") or self.critic not in ("shared", "separate"):
            raise PolicyError(f"loss_norm must be tree|token and critic shared|separate, got {self.loss_norm!r}, "
                              f"{self.critic!r}")
        if self.clip_eps < 0 or (self.clip_eps_high or 0) < 0 or self.is_clip <= 0 or self.vf_clip < 0:
            raise PolicyError("clip_eps, clip_eps_high and vf_clip must be >= 0 and is_clip > 0")

    @property
    def clip_high(self) -> float:
        """The upper clip range: ``clip_eps_high``, or ``clip_eps`` when unset."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


def ppo_loss(model, critic: Critic, t: PackTargets, args: Args, denom: float, *, value_only: bool = False,
             vocab_limit: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The pack's share of a minibatch's loss (weights divided by the minibatch ``denom``) and its stats.
    ``value_only`` (value pretraining): the value term alone, the policy outside autograd."""
    want_ent = args.ent_coef > 0 and not value_only
    logp, values, ent = forward_pack(model, critic, t.pack, args, t.mask, policy=not value_only, entropy=want_ent,
                                     vocab_limit=vocab_limit)
    w = t.weight / denom
    v_tok = (values - t.returns) ** 2
    if args.vf_clip > 0:
        clipped_v = t.old_values + (values - t.old_values).clamp(-args.vf_clip, args.vf_clip)
        v_tok = torch.maximum(v_tok, (clipped_v - t.returns) ** 2)
    v_tok = 0.5 * v_tok
    stats = {"v_loss": float((w * v_tok).sum().detach())}
    if value_only:
        return args.vf_coef * (w * v_tok).sum(), stats
    log_ratio = torch.where(t.mask, logp - t.old_logp, torch.zeros_like(logp))
    ratio = torch.exp(log_ratio)
    a = t.advantages
    pg_tok = -t.is_weight * torch.minimum(ratio * a, ratio.clamp(1 - args.clip_eps, 1 + args.clip_high) * a)
    tok = pg_tok + args.vf_coef * v_tok
    if want_ent:
        tok = tok - args.ent_coef * ent
        stats["entropy"] = float((w * ent).sum().detach())
    if t.ref_logp is not None and args.kl_coef > 0:
        q = t.ref_logp - logp
        kl = torch.exp(q) - q - 1
        tok = tok + args.kl_coef * kl
        stats["kl_ref"] = float((w * kl).sum().detach())
    loss = (w * torch.where(t.mask, tok, torch.zeros_like(tok))).sum()
    with torch.no_grad():
        clipped = ((ratio < 1 - args.clip_eps) | (ratio > 1 + args.clip_high)) & t.mask
        stats.update(pg_loss=float((w * pg_tok).sum()), clip_fraction=float((w * clipped).sum()),
                     approx_kl=float((w * ((ratio - 1) - log_ratio)).sum()))
    return loss, stats


def update(model, critic: Critic, targets: list[PackTargets], args: Args, optimizer, *, pretrain: bool = False,
           vocab_limit: int | None = None, rng: random.Random | None = None) -> dict[str, float]:
    """``update_epochs`` epochs of ``minibatches`` optimiser steps over the packs (shuffled each epoch).

    ``optimizer`` holds the policy's and the critic's parameters; gradients are clipped separately.
    ``pretrain`` trains the critic alone: the policy gets no gradient, so the optimiser (which skips
    parameters without one) leaves it bit-identical. Returns the stats averaged over minibatches.
    """
    shuffle = rng.shuffle if rng is not None else random.shuffle  # default: the global RNG, which checkpoints save
    live = [t for t in targets if t.denom > 0]
    pol = [p for p in model.parameters() if p.requires_grad]
    val = [p for p in critic.parameters() if p.requires_grad]
    sums: dict[str, float] = {}
    n = 0
    for _ in range(args.update_epochs):
        order = live[:]
        shuffle(order)
        k = max(1, min(args.minibatches, len(order)))
        for mb in (order[i::k] for i in range(k)):
            optimizer.zero_grad(set_to_none=True)
            denom = sum(t.denom for t in mb)
            for t in mb:
                loss, st = ppo_loss(model, critic, t, args, denom, value_only=pretrain, vocab_limit=vocab_limit)
                loss.backward()
                st["loss"] = float(loss.detach())
                for key, v in st.items():
                    sums[key] = sums.get(key, 0.0) + v
            if not pretrain:
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(
                    torch.nn.utils.clip_grad_norm_(pol, args.max_grad_norm))
            elif any(p.grad is not None for p in pol):
                raise PolicyError("value pretraining produced a policy gradient; the policy must stay frozen")
            sums["grad_norm_value"] = sums.get("grad_norm_value", 0.0) + float(
                torch.nn.utils.clip_grad_norm_(val, args.max_grad_norm))
            optimizer.step()
            n += 1
    optimizer.zero_grad(set_to_none=True)
    return {k: v / n for k, v in sums.items()} if n else {}


def batch_metrics(targets: list[PackTargets], is_clip: float) -> MetricsRow:
    """Value fit, advantages and rollout/trainer drift over the trained tokens, overall and per harness."""
    per: dict[str, list[list[torch.Tensor]]] = {}
    for t in targets:
        lw = t.old_logp - t.pack.rollout_logprobs
        for ti, (s, e) in enumerate(t.pack.tree_ranges):
            m = t.mask[s:e]
            cols = [x[s:e][m].double() for x in (t.returns, t.old_values, t.advantages, lw)]
            per.setdefault(t.pack.trees[ti].meta.harness or "?", []).append(cols)
    out: MetricsRow = {}
    groups = [("", [c for rows in per.values() for c in rows])] + [(f"{h}/", rows) for h, rows in sorted(per.items())]
    for prefix, rows in groups:
        ret, v, adv, lw = (torch.cat([r[i] for r in rows]) if rows else torch.zeros(0, dtype=torch.float64)
                           for i in range(4))
        n = int(ret.numel())
        var = float(ret.var()) if n > 1 else 0.0
        out[f"{prefix}trained_tokens"] = n
        out[f"{prefix}explained_variance"] = 1.0 - float((ret - v).var()) / var if var > 0 else None
        out[f"{prefix}value_abs_error"] = float((ret - v).abs().mean()) if n else None
        out[f"{prefix}advantage_abs_mean"] = float(adv.abs().mean()) if n else None
        out[f"{prefix}return_mean"] = float(ret.mean()) if n else None
        out[f"{prefix}kl_rollout"] = float((torch.exp(lw) - 1 - lw).mean()) if n else None  # k3, KL(rollout||trained)
        out[f"{prefix}is_clipped_share"] = float((torch.exp(lw) > is_clip).double().mean()) if n else None
    return out


# ---- the loop --------------------------------------------------------------------------------------
def draw_jobs(args: Args, tasks: list, step: int) -> list[tuple[Any, str]]:
    """(task, harness) jobs of a step: a seeded draw per step, harnesses by ratio (no repeats within one)."""
    from trainers.rollouts import harness_plan

    rng = random.Random(args.seed * 1_000_003 + step)
    jobs = []
    for harness, n in sorted(harness_plan(args.harnesses, args.tasks_per_step).items()):
        picks: list = []
        while len(picks) < n:
            picks += rng.sample(tasks, min(len(tasks), n - len(picks)))
        jobs += [(t, harness) for t in picks]
    return jobs


def episode_trees(results) -> list[Any]:
    """One call tree per episode (``meta`` carries harness and reward); infra failures and empty episodes dropped."""
    from clawgym_env.capture.tree import CallTree

    return [CallTree.from_episodes([(r.record, list(r.calls))]) for r in results
            if not r.record.is_infra_failure and r.calls]


def train(args: Args, *, policy: TrainablePolicy | None = None, echo=print) -> TrainSummary:
    """Run PPO per ``args``; returns its summary (also written to ``<out_dir>/summary.json``)."""
    from clawgym_env.runtime import Runtime
    from tasks import load_suite
    from trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from trainers.evaluation import eval_harnesses, evaluate_harnesses
    from trainers.metrics import MetricsLogger, plot_curves, rollout_metrics
    from trainers.rollouts import judge_for, rollout_fleet, run_jobs
    from trainers.sync import InProcessSync

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    policy = policy or TrainablePolicy(args.policy)
    critic = Critic.for_policy(policy, args.critic, args.value_model, args.value_head_init_std, args.seed)
    optimizer = torch.optim.AdamW([{"params": policy.trainable_parameters(), "lr": args.learning_rate},
                                   {"params": [p for p in critic.parameters() if p.requires_grad],
                                    "lr": args.critic_learning_rate}], weight_decay=args.weight_decay)
    state = ActorCritic(policy, critic)
    if args.kl_coef > 0:  # the initial weights, also when resuming
        policy.freeze_reference()
    start, version = 1, 0
    if args.resume and latest_checkpoint(out) is not None:
        loaded = load_checkpoint(out, state, optimizer)
        start, version = loaded["step"] + 1, loaded["version"]
        echo(f"resumed from {loaded['path']} (step {loaded['step']}, version {version})")
    tasks = list(load_suite(args.suite).tasks)
    eval_tasks = list(load_suite(args.eval_suite).tasks) if args.eval_suite else []
    sync = InProcessSync.for_policy(policy, name="ppo")
    if version:
        sync.push(policy, version)
    metrics = MetricsLogger(out, start_step=start)
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "max_tokens": args.max_tokens}
    last: MetricsRow = {}
    judge = judge_for(tasks + eval_tasks)
    with Runtime(sync.serving, sandbox=args.sandbox, out_dir=out / "episodes", judge=judge) as rt, \
            rollout_fleet(args.rollout, sync.serving, sandbox=args.sandbox, out_dir=out / "episodes",
                          judge=judge) as fleet:
        for step in range(start, args.steps + 1):
            t0 = time.perf_counter()
            results = run_jobs(rt, draw_jobs(args, tasks, step), group_size=args.samples_per_task,
                               sampling=sampling, policy_version=version, concurrency=args.concurrency, fleet=fleet)
            row = {**rollout_metrics(results, args.pass_threshold), "rollout_s": time.perf_counter() - t0}
            trees = episode_trees(results)
            packs = rollout_packs(trees, args.max_pack_tokens, device=policy.device)
            pretrain = step <= args.value_pretrain_steps
            model = policy.causal_lm
            model.eval()
            critic.eval()
            targets = prepare(model, critic, packs, args, policy.vocab_limit)
            if args.kl_coef > 0 and not pretrain:
                with policy.reference() as ref:
                    add_reference(targets, ref, args, policy.vocab_limit)
            model.train()
            critic.train()  # a separate critic's trunk checkpoints activations only in training mode
            t1 = time.perf_counter()
            stats = update(model, critic, targets, args, optimizer, pretrain=pretrain, vocab_limit=policy.vocab_limit)
            if stats and not pretrain:
                version += 1
                sync.push(policy, version)
            row.update(batch_metrics(targets, args.is_clip), **stats, trees=len(trees), packs=len(packs),
                       phase="value_pretrain" if pretrain else "ppo", version=version,
                       train_s=time.perf_counter() - t1)
            if eval_tasks and args.eval_every and (step % args.eval_every == 0 or step == args.steps):
                row.update(evaluate_harnesses(rt, eval_tasks, eval_harnesses(args.eval_harness, args.harnesses),
                                              samples=args.eval_samples, sampling=sampling,
                                              concurrency=args.concurrency, pass_threshold=args.pass_threshold))
            row["step_s"] = time.perf_counter() - t0
            last = metrics.log(step, row)
            if step % max(1, args.save_every) == 0 or step == args.steps:
                save_checkpoint(out, step, state, optimizer, config=args, version=version, keep=args.keep_checkpoints)
            echo(f"ppo step {step}/{args.steps} [{row['phase']}] reward {row.get('reward_mean')} "
                 f"v_loss {row.get('v_loss')} version {version}")
    metrics.close()
    curves = plot_curves(metrics.path, out) if args.plot else None
    ckpt = latest_checkpoint(out)
    summary = TrainSummary(algo="ppo", out_dir=str(out), steps=args.steps, metrics=str(metrics.path), last=last,
                           version=version, checkpoint=str(ckpt) if ckpt else None,
                           curves=str(curves) if curves else None)
    summary.write()
    if not math.isfinite(summary.final_loss or 0.0):
        echo("warning: the last loss is not finite")
    return summary
