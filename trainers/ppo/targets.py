"""What one PPO update holds fixed: the per-token targets of a pack, scored once before the update.

The batch is the trainers' one batch model, :class:`trainers.batch.tree_batch.TrainPack` (built for PPO by
:func:`trainers.batch.tree_batch.rollout_packs`); a :class:`PackTargets` adds what PPO needs on top of it.
:func:`prepare` scores the packs with the current weights (``logp_old``, the critic's ``V_old``),
runs GAE on every tree (:func:`trainers.batch.advantages.tree_gae`), and sets each trained token's
truncated IS weight and per-rollout loss weight (:func:`loss_weights`, from the pack's own
(token, episode) pairs; the weighting is described in :mod:`trainers.ppo.train`). :func:`add_reference`
adds the frozen reference's logprobs.

Invariants: every tensor of a :class:`PackTargets` is ``[T]`` and aligned with its pack; ``mask`` is
the pack's ``trainable`` (:func:`trainers.batch.packing.trainable_mask`); ``weight`` is 0 off ``mask``;
``is_weight`` is 1.0 off ``mask``; nothing here builds a graph (no gradient).

Under N ranks (:mod:`trainers.scale.fsdp`) every rank passes ALL packs of the step: the packs are balanced
over the ranks, each rank scores its own (the same number of forwards on every rank, zero-weight ones
padding a short rank), and the scores are all-gathered, so every rank ends with the targets of every pack
(GAE and the advantage normalisation then run on the whole step, as in one process). The policy's and the
critic's forwards run inside their FSDP roots (``policy_root``: the policy's sharded module; the critic is
its own root).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch

from trainers.batch.advantages import leaf_rewards, tree_gae
from trainers.batch.logprobs import chunked_logprobs, packed_hidden_states
from trainers.batch.pack_parts import gae_over_packs
from trainers.batch.packing import PackedTree
from trainers.batch.tree_batch import TrainPack
from trainers.ppo.value import Critic, node_values, scatter_node_lists
from trainers.scale.fsdp import all_gather_object, balance, dist_info, fsdp_forward, one_forward_form, slots


class Args(Protocol):
    """The fields of :class:`trainers.ppo.train.Args` these targets read (a protocol: no import of
    ``trainers.ppo.train``)."""

    @property
    def chunk_size(self) -> int: ...  # noqa: D102 - a config field
    @property
    def temperature(self) -> float: ...  # noqa: D102 - a config field
    @property
    def gamma(self) -> float: ...  # noqa: D102 - a config field
    @property
    def lam(self) -> float: ...  # noqa: D102 - a config field
    @property
    def is_clip(self) -> float: ...  # noqa: D102 - a config field
    @property
    def loss_norm(self) -> str: ...  # noqa: D102 - a config field
    @property
    def normalize_advantages(self) -> bool: ...  # noqa: D102 - a config field


@dataclasses.dataclass
class PackTargets:
    """What one update holds fixed for one pack (all [T] tensors, no gradient)."""

    batch: TrainPack
    mask: torch.Tensor        # bool: trained tokens (``batch.trainable``)
    weight: torch.Tensor      # loss weight before the minibatch division (0 off ``mask``)
    denom: float              # this pack's share of the minibatch divisor
    old_logp: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    is_weight: torch.Tensor   # truncated IS weight (1.0 off ``mask``)
    ref_logp: torch.Tensor | None = None

    @property
    def pack(self) -> PackedTree:
        """The packed sequence of ``batch``."""
        return self.batch.packed


def loss_weights(batch: TrainPack, loss_norm: str = "tree") -> tuple[torch.Tensor, float]:
    """``(weight [T], denom)`` of the per-rollout weighting (module docstring), from ``batch``'s
    (token, episode) pairs: a trained token counts once for every rollout (episode) whose own calls
    sampled it, however many paths of that rollout share it; an episode that received the token only
    as context has no pair there (:func:`trainers.batch.advantages.episode_own_tokens`).

    ``"tree"``: ``weight[t] = Σ_{e ∋ t} 1 / N_e`` (``N_e``: episode ``e``'s distinct trained tokens),
    ``denom`` = episodes with a trained token, so the loss is the mean over episodes of each episode's
    mean over its own tokens. ``"token"``: ``weight[t]`` = episodes through ``t``, ``denom`` = their sum.
    """
    ones = torch.ones_like(batch.pair_weight)
    if loss_norm == "token":
        per_pair = ones
    else:
        inv = torch.tensor([1.0 / e.trainable_tokens if e.trainable_tokens else 0.0 for e in batch.episodes],
                           dtype=torch.float32, device=ones.device)
        per_pair = inv[batch.pair_episode] if len(batch.episodes) else ones
    w = torch.zeros(batch.num_tokens, dtype=torch.float32, device=ones.device).index_add_(0, batch.pair_token,
                                                                                         per_pair)
    episodes = sum(1 for e in batch.episodes if e.trainable_tokens > 0 and e.primary)  # once per split tree
    return w, (float(w.sum()) if loss_norm == "token" else float(episodes))


def gae_targets(pack: PackedTree, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed ``(advantages, returns)`` of :func:`tree_gae` on every tree (rewards: ``meta.episode_rewards()``)."""
    per_tree, adv, ret = node_values(pack, values), [], []
    for ti, tree in enumerate(pack.trees):
        a, r = tree_gae(tree, per_tree[ti], leaf_rewards(tree, tree.meta.episode_rewards()), gamma=gamma, lam=lam)
        adv.append(a)
        ret.append(r)
    return scatter_node_lists(pack, adv), scatter_node_lists(pack, ret)


def forward_pack(model, critic: Critic | None, pack: PackedTree, args: Args, mask: torch.Tensor, *,
                 policy: bool = True, entropy: bool = False, vocab_limit: int | None = None,
                 policy_root: Any = None):
    """One packed forward → ``(logp, values, entropy)`` ([T] each, or None): logprobs and entropies on
    ``mask``, values on every sampled token with a predecessor (GAE reads them all).

    A shared critic reads the policy's hidden states (one trunk forward for both heads); with
    ``policy=False`` (value pretraining) the LM head is skipped and the policy stays out of autograd;
    ``critic=None`` skips the values (the reference model). ``policy_root``: the FSDP root the policy's
    forward runs in (``None``: ``model`` is not sharded).
    """
    hidden: torch.Tensor | None = None
    logp = ent = values = None
    shared = critic is not None and critic.trunk is None
    if policy or shared:
        def run_policy():
            with torch.set_grad_enabled(policy and torch.is_grad_enabled()):
                h = packed_hidden_states(model, pack, one_forward_form(model, pack))
            out_h = h.clone() if shared else None  # only a shared critic reads them (a copy: not a view of an output)
            if not policy:
                return out_h, None, None
            idx = mask.nonzero()[:, 0]
            res = chunked_logprobs(h[pack.predecessor[idx]], model.get_output_embeddings(), pack.input_ids[idx],
                                   args.chunk_size, args.temperature, vocab_limit, return_entropy=entropy)
            lp, en = res if entropy else (res, None)
            full = torch.zeros(pack.num_tokens, dtype=lp.dtype, device=lp.device).index_put((idx,), lp)
            return out_h, full, (torch.zeros_like(full).index_put((idx,), en) if en is not None else None)

        hidden, logp, ent = fsdp_forward(policy_root, run_policy)
    if critic is not None:
        def run_critic() -> torch.Tensor:
            trunk = critic.trunk
            h = packed_hidden_states(trunk, pack, one_forward_form(trunk, pack)) if trunk is not None else hidden
            assert h is not None  # a shared critic reads the policy's hidden states, computed above
            return critic.values_from_hidden(h, pack, pack.target_mask)

        values = fsdp_forward(critic, run_critic)
    return logp, values, ent


def zero_loss(outputs: tuple[torch.Tensor | None, ...]) -> torch.Tensor | None:
    """``0 ×`` the sum of a forward's outputs that carry a gradient (a padding forward's loss: it joins the FSDP
    collectives of the backward and adds nothing); None when none does."""
    live = [o.sum() for o in outputs if o is not None and o.requires_grad]
    return torch.stack(live).sum() * 0.0 if live else None


def _sharded_scores(packs: list[TrainPack], score: Callable[[TrainPack], tuple[torch.Tensor | None, ...]]
                    ) -> list[tuple[torch.Tensor | None, ...]]:
    """``score(pack)`` of every pack: each pack scored on one rank (balanced), the results shared with all."""
    info = dist_info()
    if not packs:
        return []
    share = balance([p.num_tokens for p in packs], info.world_size)
    filler = min(range(len(packs)), key=lambda i: packs[i].num_tokens)
    mine = {}
    for i, real in slots(share[info.rank], share, filler):
        out = score(packs[i])
        if real:
            mine[i] = out
    if not info.distributed:
        return [mine[i] for i in range(len(packs))]
    merged: dict[int, tuple[torch.Tensor | None, ...]] = {}
    for part in all_gather_object({i: tuple(x.cpu() if x is not None else None for x in out)
                                   for i, out in mine.items()}):
        merged.update(part)
    dev = packs[0].trainable.device
    return [tuple(x.to(dev) if x is not None else None for x in merged[i]) for i in range(len(packs))]


@torch.no_grad()
def prepare(model, critic: Critic, batches: list[TrainPack], args: Args,
            vocab_limit: int | None = None, policy_root: Any = None) -> list[PackTargets]:
    """Score the batch once with the current weights; every per-token target of the update but the
    reference logprobs (:func:`add_reference`). Every rank passes all packs (module docstring)."""
    scores = _sharded_scores(batches, lambda b: forward_pack(model, critic, b.packed, args, b.trainable,
                                                             vocab_limit=vocab_limit, policy_root=policy_root)[:2])
    values = []
    for old_logp, old_v in scores:
        assert old_logp is not None and old_v is not None  # the policy and the critic were scored
        values.append(old_v)
    gae = gae_over_packs(batches, values, args.gamma, args.lam)  # whole trees, across a split tree's packs
    out = []
    for batch, (old_logp, old_v), (adv, ret) in zip(batches, scores, gae):
        assert old_logp is not None and old_v is not None
        pack, mask = batch.packed, batch.trainable
        is_w = torch.where(mask, torch.exp(old_logp - pack.rollout_logprobs).clamp(max=args.is_clip),
                           torch.ones_like(old_logp))
        weight, denom = loss_weights(batch, args.loss_norm)
        out.append(PackTargets(batch, mask, weight, denom, old_logp, old_v, adv, ret, is_w))
    flat = torch.cat([t.advantages[t.mask] for t in out]) if out else torch.zeros(0)
    if args.normalize_advantages and flat.numel() > 1:
        mean, std = flat.mean(), flat.std()
        for t in out:
            t.advantages = torch.where(t.mask, (t.advantages - mean) / (std + 1e-8), t.advantages)
    return out


@torch.no_grad()
def add_reference(targets: list[PackTargets], ref_model, args: Args, vocab_limit: int | None = None,
                  root: Any = None) -> None:
    """Score the trained tokens with the frozen reference (a separate pass: under LoRA the reference is
    the policy module itself with its adapters disabled, so ``root`` is then the policy's FSDP root)."""
    by_batch = {id(t.batch): t for t in targets}
    scores = _sharded_scores([t.batch for t in targets],
                             lambda b: (forward_pack(ref_model, None, b.packed, args, by_batch[id(b)].mask,
                                                     vocab_limit=vocab_limit, policy_root=root)[0],))
    for t, (ref,) in zip(targets, scores):
        t.ref_logp = ref
