"""``example-reinforce``: REINFORCE with a group-mean baseline, written against :mod:`trainers.api` only.

Each step draws ``tasks_per_step`` tasks of the suite, rolls each out ``group_size`` times through
``harness`` against the serving copy of the policy, groups the episodes by task (infrastructure failures
excluded, never a 0), gives every episode the advantage ``A_e = r_e - mean(r)`` of its group, packs each
group's call tree into one sequence and takes one optimiser step on

    loss = - Σ_pairs pair_weight · A_e · log π(token)

(``pair_weight`` makes it each episode's mean over its own sampled tokens, averaged over episodes and
groups). The rollouts are on-policy (one update per batch), so no importance weight is needed. After the
update the serving policy gets the new weights under the next version.

Run: ``clawgym train --config cfg.yaml`` with ``algo: example-reinforce`` (``clawgym train --help-config
example-reinforce`` lists the fields). Writes ``metrics.jsonl``, ``summary.json`` and, at the end, a
checkpoint under ``out_dir``.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import torch

from trainers.api import (
    ConfigError,
    InProcessSync,
    MetricsLogger,
    MetricsRow,
    RunArgs,
    Runtime,
    TrainablePolicy,
    TrainPack,
    TrainSummary,
    draw_jobs,
    group_summary,
    judge_for,
    load_suite,
    make_groups,
    pack_groups,
    rollout_metrics,
    run_jobs,
    save_checkpoint,
    token_logprobs,
)

ALGO = "example-reinforce"


@dataclasses.dataclass
class Args(RunArgs):
    """The settings of an ``example-reinforce`` run: the shared fields of ``RunArgs``, then these."""

    out_dir: str = "runs/example-reinforce"
    steps: int = 2
    suite: str = "example"
    harness: str = "example-agent"
    """the harness every episode runs through"""
    tasks_per_step: int = 2
    """tasks drawn per step (one group each)"""
    group_size: int = 4
    """episodes per task and step; the baseline is their mean reward"""
    temperature: float = 1.0
    """sampling temperature of the rollouts (the loss scores tokens at the same temperature)"""
    max_tokens: int = 256
    """cap on the tokens one model call may sample"""
    learning_rate: float = 1e-4

    def __post_init__(self) -> None:
        if self.tasks_per_step < 1 or self.group_size < 2:
            raise ConfigError(f"tasks_per_step must be >= 1 and group_size >= 2 (a baseline needs two episodes), got "
                              f"{self.tasks_per_step} and {self.group_size}")


def reinforce_loss(policy: TrainablePolicy, pack: TrainPack, *, temperature: float, chunk_size: int) -> torch.Tensor:
    """``- Σ pair_weight · advantage · logprob`` over the pack's (token, episode) pairs (gradients flow)."""
    logp = token_logprobs(policy.causal_lm, pack.packed, chunk_size, mask=pack.trainable, temperature=temperature,
                          vocab_limit=policy.vocab_limit)
    return -(pack.pair_weight * pack.pair_adv * logp[pack.pair_token]).sum()


def train(args: Args) -> TrainSummary:
    """Run ``args.steps`` REINFORCE steps (module docstring); returns the run's summary."""
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    policy = TrainablePolicy(args.policy)
    sync = InProcessSync.for_policy(policy, name=ALGO)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=args.learning_rate,
                                  weight_decay=args.weight_decay)
    tasks = list(load_suite(args.suite).tasks)
    if not tasks:
        raise ConfigError(f"suite {args.suite!r} has no tasks")
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    metrics = MetricsLogger(out, log=args.log, config=dataclasses.asdict(args))  # + the trackers of log:
    version, last = 0, {}
    with Runtime(sync.serving, sandbox=args.sandbox, out_dir=out / "episodes",
                 max_context_tokens=args.max_context_tokens) as runtime:
        for step in range(1, args.steps + 1):
            jobs = draw_jobs(tasks, step, harnesses={args.harness: 1.0}, n=args.tasks_per_step, seed=args.seed)
            results = run_jobs(runtime, jobs, group_size=args.group_size, sampling=sampling,
                               policy_version=version, concurrency=args.concurrency, judge=judge_for(tasks))
            groups = make_groups(results, normalize_std=False, clean=args.clean)
            packs = pack_groups(groups, max_tokens=args.max_pack_tokens, device=policy.device)
            row: MetricsRow = {**rollout_metrics(results), **group_summary(groups)}
            if packs:
                optimizer.zero_grad()
                loss = torch.zeros((), device=policy.device)
                for pack in packs:  # one backward per pack: only one pack's activations are held at a time
                    part = reinforce_loss(policy, pack, temperature=args.temperature, chunk_size=args.chunk_size)
                    part.backward()
                    loss = loss + part.detach()
                grad_norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), args.max_grad_norm)
                optimizer.step()
                version = sync.push(policy, version + 1)
                row.update(loss=float(loss), grad_norm=float(grad_norm),
                           trained_tokens=sum(p.num_trainable for p in packs))
            row["version"] = version
            last = metrics.log(step, row)
    metrics.close()
    checkpoint = save_checkpoint(out, args.steps, policy, optimizer, config=args, version=version)
    summary = TrainSummary(algo=ALGO, out_dir=str(out), steps=args.steps, metrics=str(metrics.path), last=last,
                           version=version, checkpoint=str(checkpoint))
    summary.write()
    return summary
