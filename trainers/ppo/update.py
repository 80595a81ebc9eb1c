"""PPO's update (:mod:`trainers.ppo.train`): the loss of one pack, the optimiser steps over a step's targets, and the
batch metrics — in one process or data-parallel over the ranks of a process group (:mod:`trainers.scale.fsdp`).

Every rank passes the targets of ALL packs of the step (:func:`trainers.ppo.targets.prepare` shares them).
Rank 0 shuffles each epoch's order (the draw one process makes) and broadcasts it; each minibatch's packs
are balanced over the ranks by packed tokens; every pack's loss is divided by the minibatch's global
``denom`` and backpropagated on its rank; a short rank runs zero-weight forwards until it has run as many
as the busiest rank; FSDP sums the gradients over ranks; the clipping norms are global; the statistics are
summed over ranks before the per-minibatch average, so every rank returns what one process would.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

import torch

from clawgym_env.errors import PolicyError
from trainers.batch.pack_parts import pack_units
from trainers.metrics import MetricsRow
from trainers.ppo.targets import Args as TargetsArgs
from trainers.ppo.targets import PackTargets, forward_pack, zero_loss
from trainers.ppo.value import Critic
from trainers.scale.fsdp import all_reduce_sums, balance, broadcast_object, clip_grad_norm, dist_info, slots


class LossArgs(TargetsArgs, Protocol):
    """The fields of :class:`trainers.ppo.train.Args` the update reads: those of the targets
    (:class:`trainers.ppo.targets.Args`) and the loss's own (a protocol: no import of ``trainers.ppo.train``)."""

    @property
    def clip_eps(self) -> float: ...  # noqa: D102 - a config field
    @property
    def clip_high(self) -> float: ...  # noqa: D102 - the upper clip range
    @property
    def vf_coef(self) -> float: ...  # noqa: D102 - a config field
    @property
    def vf_clip(self) -> float: ...  # noqa: D102 - a config field
    @property
    def ent_coef(self) -> float: ...  # noqa: D102 - a config field
    @property
    def kl_coef(self) -> float: ...  # noqa: D102 - a config field
    @property
    def update_epochs(self) -> int: ...  # noqa: D102 - a config field
    @property
    def minibatches(self) -> int: ...  # noqa: D102 - a config field
    @property
    def max_grad_norm(self) -> float: ...  # noqa: D102 - a config field


def ppo_loss(model, critic: Critic, t: PackTargets, args: LossArgs, denom: float, *, value_only: bool = False,
             vocab_limit: int | None = None, policy_root: Any = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The pack's share of a minibatch's loss (weights divided by the minibatch ``denom``) and its stats.
    ``value_only`` (value pretraining): the value term alone, the policy outside autograd."""
    want_ent = args.ent_coef > 0 and not value_only
    logp, values, ent = forward_pack(model, critic, t.pack, args, t.mask, policy=not value_only, entropy=want_ent,
                                     vocab_limit=vocab_limit, policy_root=policy_root)
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


def update(model, critic: Critic, targets: list[PackTargets], args: LossArgs, optimizer, *, pretrain: bool = False,
           vocab_limit: int | None = None, rng: random.Random | None = None,
           policy_root: Any = None) -> dict[str, float]:
    """``update_epochs`` epochs of ``minibatches`` optimiser steps over the packs (shuffled each epoch).

    ``optimizer`` holds the policy's and the critic's parameters; gradients are clipped separately.
    ``pretrain`` trains the critic alone: the policy gets no gradient, so the optimiser (which skips
    parameters without one) leaves it bit-identical. ``policy_root``: the policy's FSDP root (module
    docstring). Returns the stats averaged over minibatches.
    """
    shuffle = rng.shuffle if rng is not None else random.shuffle  # default: the global RNG, which checkpoints save
    info = dist_info()
    units = [u for u in pack_units([t.batch for t in targets]) if sum(targets[i].denom for i in u) > 0]
    live = targets  # a split tree's parts stay in one minibatch (a part may carry no primary episode: denom 0)
    pol = [p for p in model.parameters() if p.requires_grad]
    val = [p for p in critic.parameters() if p.requires_grad]
    orders: list[list[int]] | None = None
    if info.is_main:
        orders = []
        for _ in range(args.update_epochs):
            order = list(range(len(units)))
            shuffle(order)  # the permutation one process draws for its list of (units of) targets
            orders.append(order)
    orders = broadcast_object(orders)
    assert orders is not None  # rank 0 drew them
    sums: dict[str, float] = {}
    n = 0
    for order in orders:
        k = max(1, min(args.minibatches, len(order)))
        for picked in (order[i::k] for i in range(k)):
            mb = [j for u in picked for j in units[u]]
            optimizer.zero_grad(set_to_none=True)
            denom = sum(live[i].denom for i in mb)
            share = [[mb[j] for j in js] for js in balance([live[i].pack.num_tokens for i in mb], info.world_size)]
            filler = min(mb, key=lambda i: live[i].pack.num_tokens)
            for i, real in slots(share[info.rank], share, filler):
                t = live[i]
                if not real:  # a zero-weight forward: joins the FSDP collectives, adds nothing
                    pad = zero_loss(forward_pack(model, critic, t.pack, args, t.mask, policy=not pretrain,
                                                 vocab_limit=vocab_limit, policy_root=policy_root))
                    if pad is not None:
                        pad.backward()
                    continue
                loss, st = ppo_loss(model, critic, t, args, denom, value_only=pretrain, vocab_limit=vocab_limit,
                                    policy_root=policy_root)
                loss.backward()
                st["loss"] = float(loss.detach())
                for key, v in st.items():
                    sums[key] = sums.get(key, 0.0) + v
            share_of = 1.0 / info.world_size  # every rank has the global norm; the stats are summed over ranks
            if not pretrain:
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + clip_grad_norm(pol, args.max_grad_norm) * share_of
            elif any(p.grad is not None for p in pol):
                raise PolicyError("value pretraining produced a policy gradient; the policy must stay frozen")
            sums["grad_norm_value"] = sums.get("grad_norm_value", 0.0) + \
                clip_grad_norm(val, args.max_grad_norm) * share_of
            optimizer.step()
            n += 1
    optimizer.zero_grad(set_to_none=True)
    sums = all_reduce_sums(sums) if info.distributed else sums
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
