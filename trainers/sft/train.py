"""Black-box trajectory SFT: imitate expert episodes captured through a harness.

The expert (by default the scripted expert, ``scripted:expert``) solves the train tasks through a
real harness behind the serving proxy; every model call it made is captured at token level. The
policy is then trained to maximise the log-likelihood of the **sampled tokens** of those calls —
the assistant outputs exactly as the harness received them — with all context tokens (system
prompt, tool schemas, user turns, tool results, and whatever the harness rewrote) masked out.

Batches: ``batch_episodes`` episodes (different tasks) form one call tree, so the harness's
shared system prompt and tool schemas are computed once per batch, not once per call. Loss: the
mean over episodes of each episode's mean token NLL (the same normalisation as GRPO's, via
:func:`trainers.batch.tree_batch.build_pack` with advantage 1), so an expert episode with many calls
weighs no more than a short one. Episodes below ``min_reward`` (a demonstration that failed) and
infrastructure failures are not trained on; tokens only on calls recorded as not token-exact are
masked (see :mod:`trainers.batch.tree_batch`). Every episode is cleaned first (``clean:``,
:mod:`trainers.batch.clean`, as in GRPO and PPO): only the expert's calls of ``train_kinds`` (its main
trajectory by default, not its side calls) minus dead retries are imitated, and an episode whose cleaned
tree has more than ``max_leaves`` leaves is left out; the counts are in every metrics row (``clean/...``).

Under N ranks (``torchrun``): rank 0 collects the expert episodes and broadcasts them; every rank draws
the same batches; a batch's episodes are split between the ranks balanced by tokens (greedy
largest-first), each rank packing its share as one tree whose pair weights keep the batch's
``1 / (B · N_e)``, so the summed gradient is the one-pack gradient (a rank without an episode runs a
zero-weight forward); the statistics are summed over ranks (``token_nll`` and the token counts then
count a token shared by episodes on two ranks once per rank).
"""

from __future__ import annotations

import dataclasses
import functools
import random
import time
from pathlib import Path

import torch

from clawgym_env.errors import ConfigError
from trainers.batch.clean import CleanConfig, CleanStats, clean_rollouts
from trainers.batch.logprobs import token_logprobs
from trainers.batch.packing import tree_tokens
from trainers.batch.tree_batch import (
    EpisodePair,
    PackItem,
    TrainPack,
    as_episode,
    build_pack,
    build_packs,
    episode_packs,
    episodes_tree,
)
from trainers.metrics import MetricsLogger, MetricsRow, plot_curves
from trainers.policy import TrainablePolicy
from trainers.ranks import check_context
from trainers.rollouts.sync import judge_for, run_jobs
from trainers.run_args import RunArgs
from trainers.scale.checkpoint import latest_checkpoint, save_checkpoint
from trainers.scale.fsdp import (
    DistConfig,
    all_reduce_sums,
    balance,
    broadcast_object,
    clip_grad_norm,
    dist_info,
    fsdp_forward,
    init_distributed,
    local_device,
    one_forward_form,
    shard_policy,
    slots,
)
from trainers.summary import ExpertCounts, TrainSummary


@dataclasses.dataclass
class Args(RunArgs):
    """Every setting of an SFT run (``clawgym train --help-config sft`` lists them): the shared ones of
    :class:`~trainers.run_args.RunArgs`, then the expert, its episodes and the batches."""
    out_dir: str = "runs/sft"
    seed: int = 0
    """seed of Python, NumPy and torch (batch order, the tiny model's weights)"""
    learning_rate: float = 1e-3
    harness: str = "mini"
    """harness the expert's trajectories are captured through"""
    expert: str = "scripted:expert"
    """policy spec of the expert (``scripted:expert``, ``vllm:URL``, ``passthrough:...``)"""
    episodes_per_task: int = 1
    """expert episodes captured per task"""
    min_reward: float = 1.0
    """keep only expert episodes whose reward reaches this"""
    batch_episodes: int = 8
    """episodes per optimiser step (their call trees packed together)"""
    log_every: int = 10
    """log the training metrics every this many steps"""
    stop_nll: float = 0.0
    """stop before ``steps`` once a step's batch token NLL (the same on every rank) is at or below this; 0: run
    every step. A warm start meant to leave RL something to learn stops at a loss, not at a step count: the step
    at which a tiny model crosses a given loss varies widely with its seed (``clawgym quickstart`` uses it)"""
    save_model: bool = True
    """write ``<out_dir>/model`` (a plain model dir: ``transformers:<out_dir>/model`` serves it)"""
    dist: DistConfig = dataclasses.field(default_factory=DistConfig)
    """data parallelism under ``torchrun --nproc-per-node N`` (see the ``dist.*`` fields)"""

    def __post_init__(self) -> None:
        check_context(self.max_context_tokens, self.max_pack_tokens)
        if self.stop_nll < 0:
            raise ConfigError(f"stop_nll must be >= 0 (0: run every step), got {self.stop_nll}")

    def harness_names(self) -> list[str]:
        """The one harness the expert runs through."""
        return [self.harness]


def collect_expert(args: Args, tasks: list | None = None) -> tuple[list[EpisodePair], ExpertCounts]:
    """Run the expert through the harness on the suite; returns (kept episodes, counts)."""
    from clawgym_env.envs.runtime import Runtime
    from tasks import load_suite

    tasks = tasks if tasks is not None else list(load_suite(args.suite).tasks)
    with Runtime(args.expert, sandbox=args.sandbox, out_dir=Path(args.out_dir) / "expert_episodes",
                 judge=judge_for(tasks), max_context_tokens=args.max_context_tokens) as rt:
        results = run_jobs(rt, [(t, args.harness) for t in tasks], group_size=args.episodes_per_task,
                           concurrency=args.concurrency, adapters=args.harness_adapters())
    eps = [as_episode(r) for r in results]
    kept = [(rec, calls) for rec, calls in eps
            if not rec.is_infra_failure and rec.reward >= args.min_reward and calls]
    counts = ExpertCounts(episodes=len(eps), kept=len(kept), infra_failures=sum(rec.is_infra_failure for rec, _ in eps),
                          reward_mean=sum(rec.reward for rec, _ in eps) / len(eps) if eps else None)
    return kept, counts


def clean_expert(episodes: list[EpisodePair], clean: CleanConfig | None) -> tuple[list[EpisodePair], CleanStats]:
    """The episodes with only their calls to imitate (:mod:`trainers.batch.clean`); an episode over ``max_leaves``
    or left without a call is left out. Returns (episodes, what cleaning removed)."""
    keep, cleaned, stats = clean_rollouts(episodes, clean)
    return [(episodes[i][0], calls) for i, calls in zip(keep, cleaned) if calls], stats


def sft_pack(episodes: list[EpisodePair], device=None) -> TrainPack:
    """One pack over ``episodes`` (one tree), every episode weighted by ``1 / (B · N_e)`` per token."""
    return build_pack([PackItem(episodes_tree(episodes), [1.0] * len(episodes))], device=device)


def sft_loss(logp: torch.Tensor, pack: TrainPack) -> torch.Tensor:
    """Weighted NLL of the trainable (sampled) tokens: the mean over episodes of per-episode means."""
    return -(pack.pair_weight * logp[pack.pair_token]).sum()


def rank_packs(episodes: list[EpisodePair], world_size: int, max_tokens: int | None = None,
               device=None) -> list[list[TrainPack]]:
    """Each rank's packs over its share of a batch (episodes balanced by tree tokens), every pack at most
    ``max_tokens`` tokens (a larger tree is split, :func:`trainers.batch.tree_batch.build_packs`); pair weights
    ``1 / (B · N_e)`` with ``B`` the whole batch, so the ranks' losses sum to the one-pack loss (an empty list
    for a rank without an episode). One rank: the packs of :func:`sft_pack`'s tree."""
    if world_size <= 1:
        return [episode_packs(episodes, max_tokens, device=device)]
    share = balance([tree_tokens(episodes_tree([e])) for e in episodes], world_size)
    return [build_packs([PackItem(episodes_tree([episodes[i] for i in s]), [1.0] * len(s))], max_tokens,
                        scale=len(s) / len(episodes), device=device) if s else [] for s in share]


def sft_step(policy: TrainablePolicy, optimizer: torch.optim.Optimizer, batch: list[EpisodePair],
             args: Args) -> dict[str, float]:
    """One optimiser step on ``batch`` (every rank passes the same batch; module docstring); returns the step's
    loss, token NLL, grad norm and token counts (the same on every rank)."""
    info = dist_info()
    model = policy.causal_lm
    per_rank = rank_packs(batch, info.world_size, args.max_pack_tokens, device=policy.device)
    flat = [p for ps in per_rank for p in ps]
    starts = [sum(len(ps) for ps in per_rank[:r]) for r in range(len(per_rank))]
    share = [list(range(s, s + len(ps))) for s, ps in zip(starts, per_rank)]
    filler = min(range(len(flat)), key=lambda i: flat[i].num_tokens)
    optimizer.zero_grad(set_to_none=True)
    sums = dict.fromkeys(("loss", "nll", "tokens", "train_tokens", "trainable_tokens"), 0.0)
    for i, real in slots(share[info.rank], share, filler):
        pack = flat[i]
        logp = fsdp_forward(policy.module, functools.partial(
            token_logprobs, model, pack.packed, args.chunk_size, mask=pack.trainable, vocab_limit=policy.vocab_limit,
            mask_form=one_forward_form(model, pack.packed)))
        if not real:  # a zero-weight forward: joins the FSDP collectives, adds nothing
            (logp.sum() * 0.0).backward()
            continue
        loss = sft_loss(logp, pack)
        loss.backward()
        m = pack.trainable
        sums["loss"] += float(loss.detach())
        sums["nll"] += float(-(logp[m].detach()).sum())
        sums["tokens"] += float(m.sum())
        sums["train_tokens"] += pack.num_tokens
        sums["trainable_tokens"] += pack.num_trainable
    grad_norm = clip_grad_norm(policy.trainable_parameters(), args.max_grad_norm)
    optimizer.step()
    sums = all_reduce_sums(sums)
    return {"loss": sums["loss"], "token_nll": sums["nll"] / max(1.0, sums["tokens"]), "grad_norm": grad_norm,
            "train_tokens": int(sums["train_tokens"]), "trainable_tokens": int(sums["trainable_tokens"])}


def train(args: Args, *, policy: TrainablePolicy | None = None, episodes: list[EpisodePair] | None = None,
          echo=print) -> TrainSummary:
    """SFT per ``args`` (expert episodes collected unless given; on every rank under ``torchrun``: rank 0
    collects, logs and writes the summary); returns its summary (also written to ``<out_dir>/summary.json``)."""
    info = init_distributed(args.dist.backend, args.dist.timeout_s)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    counts: ExpertCounts | None = None
    if episodes is None:
        episodes, counts = collect_expert(args) if info.is_main else ([], None)
        episodes, counts = broadcast_object((episodes, counts))
    episodes, cleaned = clean_expert(episodes, args.clean)  # every rank: the same episodes, the same result
    if not episodes:
        raise ConfigError("no expert episode to train on (all failed, scored below min_reward, had no calls or "
                          f"no call of clean.train_kinds {list(args.clean.train_kinds)})")
    policy = policy or TrainablePolicy(dataclasses.replace(args.policy,
                                                           device=local_device(args.policy.device, info)))
    shard_policy(policy, args.dist)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    metrics = MetricsLogger(out, log=args.log, config=dataclasses.asdict(args)) if info.is_main else None
    bar = None
    if args.log.progress and info.is_main:
        from tqdm.auto import tqdm

        bar = tqdm(total=args.steps, desc="sft", unit="step")
    order: list[int] = []
    t_start = time.perf_counter()
    tokens = 0
    last: MetricsRow = {}
    done = 0
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        if len(order) < args.batch_episodes:  # epochs: every episode once before any repeats
            fresh = list(range(len(episodes)))
            rng.shuffle(fresh)
            order += fresh
        batch = [episodes[i] for i in order[:args.batch_episodes]]
        del order[:args.batch_episodes]
        st = sft_step(policy, optimizer, batch, args)
        tokens += int(st["train_tokens"])
        dt = time.perf_counter() - t0
        stop = 0.0 < st["token_nll"] <= args.stop_nll
        if metrics is not None and (step % max(1, args.log_every) == 0 or step == args.steps or stop):
            last = metrics.log(step, {**st, "train_tokens_per_s": st["train_tokens"] / dt if dt > 0 else None,
                                      **(counts.as_metrics() if counts else {}), **cleaned.as_metrics()})
        if bar is not None:
            bar.set_postfix_str(f"loss {st['loss']:.3f}")
            bar.update(1)
        done = step
        if stop:
            break
    if bar is not None:
        bar.close()
    if metrics is not None:
        metrics.close()
    save_checkpoint(out, done, policy, optimizer, config=args, version=0, keep=1)
    model_dir = policy.save_pretrained(out / "model") if args.save_model else None
    curves = plot_curves(metrics.path, out) if args.log.plot and metrics is not None else None
    summary = TrainSummary(algo="sft", out_dir=str(out), steps=done, metrics=str(out / "metrics.jsonl"),
                           last=last, checkpoint=str(ckpt) if (ckpt := latest_checkpoint(out)) else None,
                           curves=str(curves) if curves else None, model_dir=str(model_dir) if model_dir else None,
                           episodes=len(episodes), expert=counts, train_s=time.perf_counter() - t_start,
                           train_tokens=tokens)
    if info.is_main:
        summary.write()
    return summary
