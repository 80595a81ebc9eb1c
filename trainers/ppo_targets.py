"""What one PPO update holds fixed: the per-token targets of a pack, scored once before the update.

:func:`prepare` scores a batch of packed trees with the current weights (``logp_old``, the critic's
``V_old``), runs GAE on every tree (:func:`trainers.advantages.tree_gae`), and sets each trained
token's truncated IS weight and per-rollout loss weight (:func:`loss_weights`; the weighting is
described in :mod:`trainers.ppo`). :func:`add_reference` adds the frozen reference's logprobs.

Invariants: every tensor of a :class:`PackTargets` is ``[T]`` and aligned with its pack; ``weight``
is 0 off ``mask``; ``is_weight`` is 1.0 off ``mask``; nothing here builds a graph (no gradient).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from trainers.advantages import episode_own_tokens, leaf_rewards, tree_gae
from trainers.logprobs import chunked_logprobs, packed_hidden_states
from trainers.packing import PackedTree, trainable_mask
from trainers.value import Critic, node_values, scatter_node_lists

if TYPE_CHECKING:
    from trainers.ppo import Args


@dataclasses.dataclass
class PackTargets:
    """What one update holds fixed for one pack (all [T] tensors, no gradient)."""

    pack: PackedTree
    mask: torch.Tensor        # bool: trained tokens
    weight: torch.Tensor      # loss weight before the minibatch division (0 off ``mask``)
    denom: float              # this pack's share of the minibatch divisor
    old_logp: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    is_weight: torch.Tensor   # truncated IS weight (1.0 off ``mask``)
    ref_logp: torch.Tensor | None = None


def trained_mask(pack: PackedTree) -> torch.Tensor:
    """The trained tokens: :func:`trainers.packing.trainable_mask` (one rule for every trainer)."""
    return trainable_mask(pack)


def loss_weights(pack: PackedTree, mask: torch.Tensor, loss_norm: str = "tree") -> tuple[torch.Tensor, float]:
    """``(weight [T], denom)`` of the per-rollout weighting (module docstring): a trained token counts
    once for every rollout (episode) whose own calls sampled it, however many paths of that rollout
    share it; an episode that received the token only as context does not count.

    ``"tree"``: ``weight[t] = Σ_{e ∋ t} 1 / N_e`` (``N_e``: episode ``e``'s distinct trained tokens),
    ``denom`` = episodes with a trained token, so the loss is the mean over episodes of each episode's
    mean over its own tokens. ``"token"``: ``weight[t]`` = episodes through ``t``, ``denom`` = their sum.
    """
    w = torch.zeros(pack.num_tokens, dtype=torch.float32, device=mask.device)
    episodes = 0
    for ti, tree in enumerate(pack.trees):
        slices = [pack.node_slice(ti, nid) for nid in range(len(tree.nodes))]
        # per node, {episode: its own trained tokens} (a token an episode got only as context is not its action)
        own = [{e: mask[sl] & torch.tensor(flags, dtype=torch.bool, device=mask.device) for e, flags in eps.items()}
               for sl, eps in zip(slices, episode_own_tokens(tree))]
        per_episode: dict[int, int] = defaultdict(int)
        for node in own:
            for e, m in node.items():
                per_episode[e] += int(m.sum())
        for sl, node in zip(slices, own):
            for e, m in node.items():
                if per_episode[e]:
                    w[sl] += m.float() * (1.0 if loss_norm == "token" else 1.0 / per_episode[e])
        episodes += sum(1 for n in per_episode.values() if n > 0)
    return w, (float(w.sum()) if loss_norm == "token" else float(episodes))


def gae_targets(pack: PackedTree, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed ``(advantages, returns)`` of :func:`tree_gae` on every tree (rewards from ``meta["episodes"]``)."""
    per_tree, adv, ret = node_values(pack, values), [], []
    for ti, tree in enumerate(pack.trees):
        rewards = [float(e["reward"]) for e in tree.meta.get("episodes") or [{"reward": tree.meta.get("reward", 0)}]]
        a, r = tree_gae(tree, per_tree[ti], leaf_rewards(tree, rewards), gamma=gamma, lam=lam)
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
    hidden = logp = ent = values = None
    if policy or (critic is not None and critic.trunk is None):
        with torch.set_grad_enabled(policy and torch.is_grad_enabled()):
            hidden = packed_hidden_states(model, pack)
    if policy:
        idx = mask.nonzero()[:, 0]
        res = chunked_logprobs(hidden[pack.predecessor[idx]], model.get_output_embeddings(), pack.input_ids[idx],
                               args.chunk_size, args.temperature, vocab_limit, return_entropy=entropy)
        lp, en = res if entropy else (res, None)
        logp = torch.zeros(pack.num_tokens, dtype=lp.dtype, device=lp.device).index_put((idx,), lp)
        if entropy:
            ent = torch.zeros_like(logp).index_put((idx,), en)
    if critic is not None:
        h = hidden if critic.trunk is None else packed_hidden_states(critic.trunk, pack)
        values = critic.values_from_hidden(h, pack, pack.target_mask)
    return logp, values, ent


@torch.no_grad()
def prepare(model, critic: Critic, packs: list[PackedTree], args: Args,
            vocab_limit: int | None = None) -> list[PackTargets]:
    """Score the batch once with the current weights; every per-token target of the update but the
    reference logprobs (:func:`add_reference`)."""
    out = []
    for pack in packs:
        mask = trained_mask(pack)
        old_logp, old_v, _ = forward_pack(model, critic, pack, args, mask, vocab_limit=vocab_limit)
        adv, ret = gae_targets(pack, old_v, args.gamma, args.lam)
        is_w = torch.where(mask, torch.exp(old_logp - pack.rollout_logprobs).clamp(max=args.is_clip),
                           torch.ones_like(old_logp))
        weight, denom = loss_weights(pack, mask, args.loss_norm)
        out.append(PackTargets(pack, mask, weight, denom, old_logp, old_v, adv, ret, is_w))
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
