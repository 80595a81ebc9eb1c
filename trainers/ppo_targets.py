"""What one PPO update holds fixed: the per-token targets of a pack, scored once before the update.

The batch is the trainers' one batch model, :class:`trainers.tree_batch.TrainPack` (built for PPO by
:func:`trainers.tree_batch.rollout_packs`); a :class:`PackTargets` adds what PPO needs on top of it.
:func:`prepare` scores the packs with the current weights (``logp_old``, the critic's ``V_old``),
runs GAE on every tree (:func:`trainers.advantages.tree_gae`), and sets each trained token's
truncated IS weight and per-rollout loss weight (:func:`loss_weights`, from the pack's own
(token, episode) pairs; the weighting is described in :mod:`trainers.ppo`). :func:`add_reference`
adds the frozen reference's logprobs.

Invariants: every tensor of a :class:`PackTargets` is ``[T]`` and aligned with its pack; ``mask`` is
the pack's ``trainable`` (:func:`trainers.packing.trainable_mask`); ``weight`` is 0 off ``mask``;
``is_weight`` is 1.0 off ``mask``; nothing here builds a graph (no gradient).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from trainers.advantages import leaf_rewards, tree_gae
from trainers.logprobs import chunked_logprobs, packed_hidden_states
from trainers.packing import PackedTree
from trainers.tree_batch import TrainPack
from trainers.value import Critic, node_values, scatter_node_lists


class Args(Protocol):
    """The fields of :class:`trainers.ppo.Args` these targets read (a protocol: no import of ``trainers.ppo``)."""

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
    as context has no pair there (:func:`trainers.advantages.episode_own_tokens`).

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
    episodes = sum(1 for e in batch.episodes if e.trainable_tokens > 0)
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
                 policy: bool = True, entropy: bool = False, vocab_limit: int | None = None):
    """One packed forward → ``(logp, values, entropy)`` ([T] each, or None): logprobs and entropies on
    ``mask``, values on every sampled token with a predecessor (GAE reads them all).

    A shared critic reads the policy's hidden states (one trunk forward for both heads); with
    ``policy=False`` (value pretraining) the LM head is skipped and the policy stays out of autograd;
    ``critic=None`` skips the values (the reference model).
    """
    hidden: torch.Tensor | None = None
    logp = ent = values = None
    if policy or (critic is not None and critic.trunk is None):
        with torch.set_grad_enabled(policy and torch.is_grad_enabled()):
            hidden = packed_hidden_states(model, pack)
    if policy:
        assert hidden is not None  # computed just above whenever the policy is scored
        idx = mask.nonzero()[:, 0]
        res = chunked_logprobs(hidden[pack.predecessor[idx]], model.get_output_embeddings(), pack.input_ids[idx],
                               args.chunk_size, args.temperature, vocab_limit, return_entropy=entropy)
        lp, en = res if entropy else (res, None)
        logp = torch.zeros(pack.num_tokens, dtype=lp.dtype, device=lp.device).index_put((idx,), lp)
        if en is not None:
            ent = torch.zeros_like(logp).index_put((idx,), en)
    if critic is not None:
        h = packed_hidden_states(critic.trunk, pack) if critic.trunk is not None else hidden
        assert h is not None  # a shared critic reads the policy's hidden states, computed above
        values = critic.values_from_hidden(h, pack, pack.target_mask)
    return logp, values, ent


@torch.no_grad()
def prepare(model, critic: Critic, batches: list[TrainPack], args: Args,
            vocab_limit: int | None = None) -> list[PackTargets]:
    """Score the batch once with the current weights; every per-token target of the update but the
    reference logprobs (:func:`add_reference`)."""
    out = []
    for batch in batches:
        pack, mask = batch.packed, batch.trainable
        old_logp, old_v, _ = forward_pack(model, critic, pack, args, mask, vocab_limit=vocab_limit)
        adv, ret = gae_targets(pack, old_v, args.gamma, args.lam)
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
def add_reference(targets: list[PackTargets], ref_model, args: Args, vocab_limit: int | None = None) -> None:
    """Score the trained tokens with the frozen reference (a separate pass: under LoRA the reference is
    the policy module itself with its adapters disabled)."""
    for t in targets:
        t.ref_logp = forward_pack(ref_model, None, t.pack, args, t.mask, vocab_limit=vocab_limit)[0]
