"""GRPO's update (steps 4 of :mod:`trainers.grpo.train`): the loss of one pack, and the optimiser steps over a step's
packs in one process or data-parallel over the ranks of a process group (:mod:`trainers.scale.fsdp`).

Every rank calls :func:`grpo_update` with ALL packs of the step, in the same order (they are built the same
way from the groups rank 0 broadcast). Then:

1. **Scoring.** The packs are balanced over the ranks by packed tokens; each rank scores its own without
   gradient (``logp_old``, the truncated IS weights, the reference's logprobs) and the per-pack results are
   all-gathered, so every rank holds them for every pack.
2. **Minibatches.** Rank 0 draws each epoch's order (the NumPy draw a single process makes) and broadcasts it;
   each minibatch's packs are balanced over the ranks; every pack's loss is scaled by :func:`minibatch_scale`
   (the step's groups over the minibatch's, or under ``loss_norm="token"`` the step's pairs over the
   minibatch's) and backpropagated on its rank; a rank with fewer packs runs zero-weight forwards until it has
   run as many as the busiest rank; FSDP sums the gradients over ranks, so the gradient is the
   single-process one; the clipping norm is the global norm.
3. **Statistics** are summed over ranks: rank 0 logs what one process would (up to float rounding).

Invariants: in one process (no process group) this is exactly the single-device update. Every optimiser step
is normalised by its own minibatch: under ``loss_norm="token"`` its pair weights sum to exactly 1 whatever the
minibatches' sizes (verl's and DAPO's token mean per minibatch); under ``"episode"`` and ``"constant"`` it is
the mean over its groups (:mod:`trainers.batch.tree_batch`). The truncated importance weight of a (token,
episode) pair is ``min(exp(logp_old - pair_logprob), is_clip)`` with the pair's OWN behaviour logprob
(``TrainPack.pair_logprobs``): a token several episodes sampled at different policy versions gets each
episode's version's weight. The rollout metrics (``kl_rollout``, ``is_weight_mean``, ``is_clipped_share``) stay
per distinct token, against the token's first sampler (``packed.rollout_logprobs``).
"""

from __future__ import annotations

import functools
import time
from typing import Protocol

import numpy as np
import torch

from clawgym_env.errors import PolicyError
from trainers.batch.logprobs import token_logprobs
from trainers.batch.pack_parts import pack_units
from trainers.batch.tree_batch import TrainPack
from trainers.metrics import MetricsRow
from trainers.policy import TrainablePolicy
from trainers.scale.fsdp import (
    all_gather_object,
    all_reduce_sums,
    balance,
    broadcast_object,
    clip_grad_norm,
    dist_info,
    fsdp_forward,
    is_main,
    one_forward_form,
    slots,
)


class UpdateArgs(Protocol):
    """The fields of :class:`trainers.grpo.train.Args` the update reads (a protocol: no import of
    ``trainers.grpo.train``)."""

    @property
    def chunk_size(self) -> int: ...  # noqa: D102 - a config field
    @property
    def temperature(self) -> float: ...  # noqa: D102 - a config field
    @property
    def clip_eps(self) -> float: ...  # noqa: D102 - a config field
    @property
    def clip_eps_high(self) -> float | None: ...  # noqa: D102 - a config field
    @property
    def is_clip(self) -> float: ...  # noqa: D102 - a config field
    @property
    def kl_coef(self) -> float: ...  # noqa: D102 - a config field
    @property
    def update_epochs(self) -> int: ...  # noqa: D102 - a config field
    @property
    def minibatches(self) -> int: ...  # noqa: D102 - a config field
    @property
    def max_grad_norm(self) -> float: ...  # noqa: D102 - a config field


def grpo_loss(logp: torch.Tensor, logp_old: torch.Tensor, is_weight: torch.Tensor, pack: TrainPack, *,
              clip_low: float, clip_high: float, kl_coef: float = 0.0, logp_ref: torch.Tensor | None = None,
              pair_is_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The step-4 loss of one pack (all inputs [T] tensors aligned with ``pack``; ``pair_is_weight``, when given,
    is the [P] truncated importance weight of each pair (:func:`pair_is_weights`) and replaces ``is_weight[t]``)."""
    t = pack.pair_token
    ratio = torch.exp(logp[t] - logp_old[t])
    adv = pack.pair_adv
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)
    w = is_weight[t] if pair_is_weight is None else pair_is_weight
    pg = -(pack.pair_weight * w * surrogate).sum()
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


def pair_is_weights(pack: TrainPack, logp_old: torch.Tensor, is_clip: float) -> torch.Tensor:
    """[P] truncated importance weights ``min(exp(logp_old[t] - pair_logprob), is_clip)``: each pair against its
    own episode's behaviour logprob (module docstring)."""
    return torch.exp(logp_old[pack.pair_token] - pack.pair_logprobs()).clamp(max=is_clip)


def minibatch_scale(packs: list[TrainPack], idx: list[int], groups_of: list[set[int]]) -> float:
    """The factor of a minibatch's losses (the packs ``idx`` of the step's ``packs``): the step's normalising
    units over the minibatch's — groups for ``episode``/``constant``, pairs for ``token`` (module docstring).
    ``groups_of[i]`` is the set of group numbers of pack ``i`` (a split group's parts share one)."""
    norms = {p.loss_norm for p in packs}
    if len(norms) > 1:
        raise PolicyError(f"the packs of one step mix loss norms {sorted(norms)}; build them with one loss_norm")
    if norms == {"token"}:
        total = sum(int(p.pair_weight.numel()) for p in packs)
        return total / max(1, sum(int(packs[i].pair_weight.numel()) for i in idx))
    total_groups = len(set().union(*groups_of)) if groups_of else 0
    return total_groups / max(1, len(set().union(*(groups_of[i] for i in idx))))  # mean over its groups


def score_pack(policy: TrainablePolicy, model, pack: TrainPack, args: UpdateArgs) -> torch.Tensor:
    """[T] logprobs of ``pack``'s trainable tokens under ``model`` at the rollout temperature (one trunk forward
    under FSDP, :func:`trainers.scale.fsdp.one_forward_form`)."""
    return token_logprobs(model, pack.packed, args.chunk_size, mask=pack.trainable, temperature=args.temperature,
                          vocab_limit=policy.vocab_limit, mask_form=one_forward_form(model, pack.packed))


def _score_all(policy: TrainablePolicy, packs: list[TrainPack], args: UpdateArgs
               ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Step 1: ``(logp_old, logp_ref or None)`` of every pack, each scored on one rank and shared with all."""
    info = dist_info()
    share = balance([p.num_tokens for p in packs], info.world_size)
    filler = min(range(len(packs)), key=lambda i: packs[i].num_tokens)
    mine: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
    with torch.no_grad():
        for i, real in slots(share[info.rank], share, filler):
            old = fsdp_forward(policy.module, functools.partial(score_pack, policy, policy.causal_lm, packs[i], args))
            ref = None
            if args.kl_coef > 0:
                with policy.reference() as ref_model:
                    root = policy.module if policy.lora else ref_model
                    ref = fsdp_forward(root, functools.partial(score_pack, policy, ref_model, packs[i], args))
            if real:
                mine[i] = (old, ref)
    if not info.distributed:
        return [mine[i][0] for i in range(len(packs))], [mine[i][1] for i in range(len(packs))]
    cpu = {i: (o.cpu(), r.cpu() if r is not None else None) for i, (o, r) in mine.items()}
    merged: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for part in all_gather_object(cpu):
        merged.update(part)
    dev = packs[0].trainable.device
    return ([merged[i][0].to(dev) for i in range(len(packs))],
            [r.to(dev) if (r := merged[i][1]) is not None else None for i in range(len(packs))])


def grpo_update(policy: TrainablePolicy, optimizer: torch.optim.Optimizer, packs: list[TrainPack],
                args: UpdateArgs) -> MetricsRow:
    """Steps 4 of :mod:`trainers.grpo.train` over ``packs`` (every rank passes all of them; module docstring);
    returns the update's statistics (the same on every rank)."""
    clip_high = args.clip_eps if args.clip_eps_high is None else args.clip_eps_high
    info = dist_info()
    model = policy.causal_lm
    t0 = time.perf_counter()
    olds, refs = _score_all(policy, packs, args)
    weights: list[torch.Tensor] = []
    pair_weights: list[torch.Tensor] = []
    kl_roll, is_sum, is_clipped, n_tok = 0.0, 0.0, 0, 0
    for pack, old in zip(packs, olds):
        m = pack.trainable
        log_w = old - pack.packed.rollout_logprobs
        w = torch.where(m, torch.exp(log_w).clamp(max=args.is_clip), torch.zeros_like(old))
        weights.append(w)
        pair_weights.append(pair_is_weights(pack, old, args.is_clip))
        lw = log_w[m].double()  # float64: the k3 terms are ~lw²/2, below float32 resolution near 0
        kl_roll += float((torch.exp(lw) - 1.0 - lw).sum())  # k3 of KL(rollout || trained), r = p_old/p_roll
        is_sum += float(w[m].sum())
        is_clipped += int((torch.exp(lw) > args.is_clip).sum())
        n_tok += int(m.sum())
    groups_of = [{e.group for e in p.episodes} for p in packs]  # a split group's parts share its number
    units = pack_units(packs)  # a split tree's packs stay in one minibatch
    keys = ("loss", "pg_loss", "kl_ref", "clipped_tokens", "tokens", "train_tokens")
    totals: dict[str, float] = dict.fromkeys(keys, 0.0)
    grad_norms = []
    orders = None
    if is_main():
        orders = [np.random.permutation(len(units)).tolist() if args.minibatches > 1 else list(range(len(units)))
                  for _ in range(args.update_epochs)]
    orders = broadcast_object(orders)
    assert orders is not None  # rank 0 drew them
    for order in orders:
        for chunk in np.array_split(np.asarray(order, dtype=int), max(1, min(args.minibatches, len(units)))):
            idx = [i for u in chunk.tolist() for i in units[u]]
            if not idx:
                continue
            scale = minibatch_scale(packs, idx, groups_of)
            optimizer.zero_grad(set_to_none=True)
            share = [[idx[k] for k in ks] for ks in balance([packs[i].num_tokens for i in idx], info.world_size)]
            filler = min(idx, key=lambda i: packs[i].num_tokens)
            for i, real in slots(share[info.rank], share, filler):
                pack = packs[i]
                logp = fsdp_forward(policy.module, functools.partial(score_pack, policy, model, pack, args))
                if not real:  # a zero-weight forward: joins the FSDP collectives, adds nothing
                    (logp.sum() * 0.0).backward()
                    continue
                loss, st = grpo_loss(logp, olds[i], weights[i], pack, clip_low=args.clip_eps, clip_high=clip_high,
                                     kl_coef=args.kl_coef, logp_ref=refs[i], pair_is_weight=pair_weights[i])
                (loss * scale).backward()
                totals["train_tokens"] += pack.num_tokens
                totals["loss"] += float(loss.detach())
                for k in ("pg_loss", "kl_ref", "clipped_tokens", "tokens"):
                    totals[k] += st.get(k, 0.0)
            grad_norms.append(clip_grad_norm(policy.trainable_parameters(), args.max_grad_norm))
            optimizer.step()
    totals = all_reduce_sums(totals)
    epochs = max(1, args.update_epochs)
    dt = time.perf_counter() - t0
    processed = int(totals["train_tokens"])
    return {"loss": totals["loss"] / epochs, "pg_loss": totals["pg_loss"] / epochs,
            "kl_ref": totals["kl_ref"] / epochs if args.kl_coef > 0 else None,
            "clip_fraction": totals["clipped_tokens"] / totals["tokens"] if totals["tokens"] else None,
            "kl_rollout": kl_roll / n_tok if n_tok else None, "is_weight_mean": is_sum / n_tok if n_tok else None,
            "is_clipped_share": is_clipped / n_tok if n_tok else None, "trainable_tokens": n_tok,
            "train_tokens": processed, "train_s": dt, "train_tokens_per_s": processed / dt if dt > 0 else None,
            "grad_norm": max(grad_norms) if grad_norms else None, "updates": len(grad_norms)}
