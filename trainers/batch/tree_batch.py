"""Episodes → call trees → THE training batch of every trainer: :class:`TrainPack`, built by :func:`build_pack`.

GRPO: :func:`make_groups` (:mod:`trainers.batch.groups`, re-exported here) buckets rollouts by
``(suite, task_id, harness)``, drops infrastructure failures (never scored 0), cleans every rollout
(:mod:`trainers.batch.clean`), computes GRPO advantages and skips groups whose rewards are all equal;
:func:`pack_groups` packs each group's :class:`~clawgym_env.capture.tree.CallTree` (shared prefixes
once) into :class:`TrainPack` s. SFT: :func:`episodes_tree` + :func:`build_pack` with advantage 1.
PPO: :func:`rollout_packs` (pairs of weight 1; its per-token advantages, values and returns are
computed per update in :mod:`trainers.ppo.targets` on top of the same pack).

The unit of the loss is a **pair** ``(token t, episode e)``: a sampled token shared by several
episodes (an identical prefix they all sampled) appears once in the pack but in one pair per
episode, each with its own advantage, because a clipped surrogate is not linear in the advantage.
Pair weights follow :func:`trainers.batch.advantages.episode_token_weights` — each episode's loss is the
mean over its own distinct trainable tokens, the group the mean over its ``G`` episodes — divided
by the number of groups in the step, so a loss ``Σ pair_weight · term`` is the mean over groups
whatever the packing, and an episode that splits into many calls or branches weighs no more than a
one-call episode.

Token exactness: a call recorded as not token-exact (a turn of its history was re-rendered from
text, or the ids were re-encoded from an upstream's text) has prompt ids the policy may never have
produced and, for a passthrough, meaningless logprobs. A sampled token is **trainable** only when
at least one token-exact call passes through its node; tokens that lie only on inexact calls are
masked (counted in ``masked_inexact_tokens``) and excluded from ``N_e``. Trainable tokens also need
a predecessor and a recorded rollout logprob: :func:`trainers.batch.packing.trainable_mask` (the one rule),
and an episode's pairs are its *own* tokens only (:func:`trainers.batch.advantages.episode_own_tokens`).

Invariants of a :class:`TrainPack` (``T`` packed tokens, ``P`` pairs):

* ``pair_token`` indexes ``trainable`` tokens only; ``pair_weight > 0``;
* ``token_weight[t] == Σ pair_weight over the pairs of t`` (0 on untrainable tokens);
* GRPO (``loss_norm="episode"``): over all packs of one step, ``Σ pair_weight == (episodes with
  trainable tokens) / (G · groups)`` summed per group, so at most 1; PPO's packs (:func:`rollout_pack`)
  have ``pair_weight == 1`` and ``pair_adv == 0`` (its weights and advantages are per token);
* ``pair_episode`` indexes ``episodes`` (one :class:`PackEpisode` per episode of the pack: group,
  harness, task, episode_id, reward, advantage, trainable token count);
* ``pair_logprobs()[p]`` is the behaviour logprob of pair ``p``: what ITS episode's own sampler recorded
  (:mod:`trainers.batch.behaviour`). It differs from ``packed.rollout_logprobs`` (the token's first
  sampler) only where episodes sampled a shared token differently (e.g. at different policy versions):
  those pairs carry it in ``pair_own_logprob`` (NaN elsewhere; None when none differs). The truncated
  importance weight of a pair uses it;
* ``trainable`` is :func:`trainers.batch.packing.trainable_mask` of ``packed`` minus the tokens owned only
  by episodes masked out (``PackItem.skip``).

Loss norms across minibatches (``loss_norm``, kept on the pack): the step's pair weights are a mean over
the step — ``"episode"`` and ``"constant"`` ``1/groups`` per group, ``"token"`` ``1/pairs`` per pair. An
update that splits the step into minibatches rescales each optimiser step by its own minibatch
(:func:`trainers.grpo.update.minibatch_scale`): ``episode``/``constant`` by its groups (each step the mean
over its groups), ``token`` by its pairs, so that **every optimiser step's pair weights sum to 1** under
``token`` (verl's and DAPO's token mean per minibatch), to ``(episodes with trainable tokens) / G``
averaged over its groups under ``episode``, and to the mean over its episodes of ``N_e / norm_constant``
under ``constant`` (at most 1 when ``norm_constant`` is the episode token budget).

Bounded packs: :func:`pack_groups` and :func:`rollout_packs` lay trees into packs of at most
``max_tokens`` tokens (:func:`trainers.batch.pack_split.plan_packs`), splitting a larger tree into parts.
A part's pack carries pairs, weights and trainable flags on the tokens it OWNS only (each token of
the tree is owned by one part); ``N_e`` and the pair weights are those of the whole tree, so the
pairs of a split tree's packs are exactly the pairs of its unsplit pack, and any loss that is a sum
over pairs or trainable tokens is unchanged by the split (its gradient too: a token's logprob
depends only on its path prefix, which every part holding it carries in full). Every part lists
all episodes of its tree; ``PackEpisode.primary`` is True in exactly one of them (the part owning
the episode's first node), so per-episode counts (denominators, metrics) count each episode once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from clawgym_env.capture.records import CallRecord
from clawgym_env.capture.tree import CallTree
from clawgym_env.capture.tree_meta import EpisodeSummary, TreeMeta
from clawgym_env.errors import ConfigError, PolicyError
from trainers.batch.advantages import episode_own_tokens, node_episodes
from trainers.batch.behaviour import BehaviourTable
from trainers.batch.groups import (
    OVERLONG_MODES,
    EpisodePair,
    Group,
    as_episode,
    group_key,
    group_summary,
    is_overlong,
    make_groups,
)
from trainers.batch.pack_split import TreePart, plan_packs
from trainers.batch.packing import PackedTree, pack_trees, scorable_mask, trainable_flags, trainable_mask

LOSS_NORMS = ("episode", "token", "constant")

__all__ = ["LOSS_NORMS", "OVERLONG_MODES", "EpisodePair", "Group", "PackEpisode", "PackItem", "TrainPack",
           "as_episode", "build_pack", "build_packs", "episode_packs", "episodes_tree", "group_key",
           "group_summary", "is_overlong", "make_groups", "pack_groups", "rollout_pack", "rollout_packs"]


def episodes_tree(episodes: Sequence[EpisodePair]) -> CallTree:
    """One tree over episodes of possibly different tasks (an SFT batch), with ``meta.call_episode``."""
    flat: list[CallRecord] = []
    call_episode: list[int] = []
    summary = []
    for e, (rec, calls) in enumerate(episodes):
        start = len(flat)
        flat.extend(calls)
        call_episode.extend([e] * len(calls))
        summary.append(EpisodeSummary(episode_id=rec.episode_id, task_id=rec.task_id, harness=rec.harness,
                                      reward=rec.reward, status=rec.status, calls=list(range(start, len(flat)))))
    return CallTree.from_calls(flat, TreeMeta(call_episode=call_episode, episodes=summary))


@dataclasses.dataclass(frozen=True)
class PackItem:
    """One tree of a pack with the advantage of each of its episode positions (``advantages[e]``),
    and where it came from (copied into its :class:`PackEpisode` entries)."""

    tree: CallTree
    advantages: Sequence[float]
    group: int = 0
    harness: str | None = None
    task_id: str | None = None
    skip: frozenset[int] = frozenset()
    """episode positions that get no pairs (GRPO ``overlong="mask"``)"""
    part: TreePart | None = None
    """the part of ``tree`` this item packs when the tree was split (:mod:`trainers.batch.pack_split`); None: whole"""
    behaviour: BehaviourTable = dataclasses.field(default_factory=dict)
    """per-(token, episode) behaviour logprobs where they differ from the tree's (``Group.behaviour``)"""


@dataclasses.dataclass(frozen=True)
class PackEpisode:
    """One episode of a pack (``TrainPack.episodes[pair_episode[p]]``)."""

    group: int
    harness: str | None
    task_id: str | None
    episode_id: str | None
    reward: float | None
    advantage: float
    trainable_tokens: int
    """``N_e``: the episode's own trainable tokens over its WHOLE tree (also in a split tree's parts)"""
    primary: bool = True
    """False in all but one part of a split tree: count the episode (denominators, metrics) where True"""


@dataclasses.dataclass
class TrainPack:
    """One packed sequence plus its training pairs (see the module invariants)."""

    packed: PackedTree
    trainable: torch.Tensor      # [T] bool
    token_weight: torch.Tensor   # [T] float32
    pair_token: torch.Tensor     # [P] long
    pair_episode: torch.Tensor   # [P] long, index into episodes
    pair_weight: torch.Tensor    # [P] float32
    pair_adv: torch.Tensor       # [P] float32
    episodes: list[PackEpisode]
    masked_inexact_tokens: int = 0
    pair_own_logprob: torch.Tensor | None = None
    """[P] float32: the pairs whose episode's own sampler recorded another logprob than the token's first sampler
    (``packed.rollout_logprobs``) carry it, the others NaN; None when no pair differs (module invariants)"""
    loss_norm: str = "episode"
    """the ``loss_norm`` the pair weights were built with (how an update rescales a minibatch)"""

    def pair_logprobs(self) -> torch.Tensor:
        """[P] behaviour logprob of every pair: its episode's own sampler's (``rollout_logprobs[pair_token]`` where
        ``pair_own_logprob`` does not say otherwise)."""
        first = self.packed.rollout_logprobs[self.pair_token]
        if self.pair_own_logprob is None:
            return first
        return torch.where(torch.isnan(self.pair_own_logprob), first, self.pair_own_logprob)

    @property
    def num_tokens(self) -> int:
        """T, the packed tokens."""
        return self.packed.num_tokens

    @property
    def num_trainable(self) -> int:
        """Tokens with at least one training pair."""
        return int(self.trainable.sum())

    def to(self, device) -> TrainPack:
        """A copy with every tensor on ``device``."""
        moved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k, v in moved.items():
            if isinstance(v, torch.Tensor):
                moved[k] = v.to(device)
        moved["packed"] = self.packed.to(device)
        return TrainPack(**moved)


def build_pack(items: Sequence[PackItem], *, scale: float = 1.0, device: str | torch.device | None = None,
               loss_norm: str = "episode", norm_constant: float | None = None) -> TrainPack:
    """Pack ``items`` into one :class:`TrainPack`: the one builder of every trainer's batch.

    ``item.advantages[e]`` belongs to episode position ``e`` of the tree (``meta.call_episode``; a
    tree without it is one episode); ``G = len(advantages)``; every pair weight is multiplied by
    ``scale`` (``1 / groups in the step``). Episode positions in ``item.skip`` get no pairs. Pair
    weight by ``loss_norm``: ``"episode"`` ``scale/(G·N_e)``, ``"constant"`` ``scale/(G·norm_constant)``,
    ``"token"`` 1 (:func:`pack_groups` rescales). An item with a ``part`` packs that part and gets pairs
    on the part's owned tokens only, weighted with the whole tree's ``N_e`` (module docstring).
    """
    if loss_norm not in LOSS_NORMS:
        raise ConfigError(f"loss_norm must be one of {LOSS_NORMS}, got {loss_norm!r}")
    if loss_norm == "constant" and not (norm_constant and norm_constant > 0):
        raise ConfigError("loss_norm='constant' needs a positive norm_constant (e.g. the max tokens per episode)")
    packed = pack_trees([it.part or it.tree for it in items], device=device)
    rule = trainable_mask(packed)
    masked = int(scorable_mask(packed).sum()) - int(rule.sum())  # scorable, but only on inexact calls
    expected = [False] * packed.num_tokens  # the rule rebuilt from trainable_flags, checked against ``rule``
    p_tok: list[int] = []
    p_ep: list[int] = []
    p_w: list[float] = []
    p_adv: list[float] = []
    p_lp: list[float] = []
    episodes: list[PackEpisode] = []
    for ti, item in enumerate(items):
        part, advs = packed.parts[ti], item.advantages
        tree = part.tree
        members = node_episodes(tree)
        own = episode_own_tokens(tree)
        flags = trainable_flags(tree)
        counts = [0] * len(advs)
        first: dict[int, int] = {}  # episode -> its first node (ids are preorder)
        for node in tree.nodes:  # N_e over the WHOLE tree's trainable tokens
            for e in members[node.id]:
                if e >= len(advs):
                    raise ConfigError(f"tree {tree.meta.tree_id} has episode {e} but only {len(advs)} advantages")
                first.setdefault(e, node.id)
                counts[e] += sum(f and o for f, o in zip(flags[node.id], own[node.id][e]))
        base = len(episodes)
        summaries = tree.meta.episodes
        for e, a in enumerate(advs):
            src = summaries[e] if e < len(summaries) else EpisodeSummary()
            episodes.append(PackEpisode(group=item.group, harness=item.harness or src.harness,
                                        task_id=item.task_id or src.task_id, episode_id=src.episode_id,
                                        reward=src.reward, advantage=float(a), trainable_tokens=counts[e],
                                        primary=first[e] in part.owned if e in first else part.index == 0))
        g = len(advs)
        behaviour = item.behaviour
        for nid in sorted(part.owned):  # pairs on the tokens this pack owns
            start, ok = packed.node_slice(ti, nid).start, flags[nid]
            expected[start:start + len(ok)] = ok
            for e in members[nid]:
                if not counts[e] or e in item.skip:
                    continue
                offsets = [j for j, (f, o) in enumerate(zip(ok, own[nid][e])) if f and o]
                idx = [start + j for j in offsets]
                if loss_norm == "episode":
                    w = scale / (g * counts[e])
                elif loss_norm == "constant":
                    w = scale / (g * float(norm_constant or 1.0))
                else:
                    w = 1.0
                p_tok.extend(idx)
                p_ep.extend([base + e] * len(idx))
                p_w.extend([w] * len(idx))
                p_adv.extend([float(advs[e])] * len(idx))
                if behaviour:
                    p_lp.extend(b.logprob if (b := behaviour.get((nid, j, e))) is not None else math.nan
                                for j in offsets)
                else:
                    p_lp.extend([math.nan] * len(offsets))
    if rule.tolist() != expected:
        raise PolicyError("the packed trainable rule and packing.trainable_flags disagree; they must be one rule")
    dev = rule.device
    pair_token = torch.tensor(p_tok, dtype=torch.long, device=dev)
    pair_weight = torch.tensor(p_w, dtype=torch.float32, device=dev)
    own_lp = None  # NaN but where an episode's own sampler differs from the token's first (module invariants)
    if any(not math.isnan(x) for x in p_lp):
        own_lp = torch.tensor(p_lp, dtype=torch.float32, device=dev)
    return TrainPack(packed=packed, trainable=torch.zeros_like(rule).index_fill_(0, pair_token, True),
                     token_weight=torch.zeros(packed.num_tokens, dtype=torch.float32,
                                              device=dev).index_add_(0, pair_token, pair_weight),
                     pair_token=pair_token, pair_episode=torch.tensor(p_ep, dtype=torch.long, device=dev),
                     pair_weight=pair_weight, pair_adv=torch.tensor(p_adv, dtype=torch.float32, device=dev),
                     episodes=episodes, masked_inexact_tokens=masked,
                     pair_own_logprob=own_lp, loss_norm=loss_norm)


def pack_groups(groups: Sequence[Group], *, max_tokens: int | None = None,
                device: str | torch.device | None = None, loss_norm: str = "episode",
                norm_constant: float | None = None) -> list[TrainPack]:
    """GRPO: pack the trainable groups (``skipped is None``), several per pack up to ``max_tokens``.

    A group that fits is never split (its shared prefix is computed once); a larger one is split
    (:func:`build_packs`); without ``max_tokens`` each group is its own pack. Pair weights
    (``loss_norm``, see :func:`build_pack`) carry ``1 / (number of trainable groups)``, except
    ``"token"``: every pair of the step weighs ``1 / (pairs in the step)``.
    """
    items = [PackItem(g.tree, g.advantages, group=i, harness=g.harness, task_id=g.key[1], skip=frozenset(g.masked),
                      behaviour=g.behaviour)
             for i, g in enumerate(groups) if g.skipped is None and g.tree is not None]
    if not items:
        return []
    scale = 1.0 / len(items)
    packs = build_packs(items, max_tokens, scale=scale, device=device, loss_norm=loss_norm,
                        norm_constant=norm_constant)
    if loss_norm == "token":  # one mean over every (token, episode) pair of the step
        pairs = sum(int(p.pair_weight.numel()) for p in packs)
        for p in packs:
            p.pair_weight = torch.full_like(p.pair_weight, 1.0 / max(1, pairs))
            p.token_weight = torch.zeros_like(p.token_weight).index_add_(0, p.pair_token, p.pair_weight)
    return packs


def build_packs(items: Sequence[PackItem], max_tokens: int | None, *, scale: float = 1.0,
                device: str | torch.device | None = None, loss_norm: str = "episode",
                norm_constant: float | None = None) -> list[TrainPack]:
    """:func:`build_pack` s of at most ``max_tokens`` tokens each (:func:`trainers.batch.pack_split.plan_packs`):
    items in order, small trees together, a larger tree split into parts with the pairs and weights of
    its unsplit pack (module docstring); without ``max_tokens`` one pack per item, whole."""
    return [build_pack([dataclasses.replace(items[p.source], part=p) for p in b], scale=scale, device=device,
                       loss_norm=loss_norm, norm_constant=norm_constant)
            for b in plan_packs([it.tree for it in items], max_tokens)]


def episode_packs(episodes: Sequence[EpisodePair], max_tokens: int | None = None,
                  device: str | torch.device | None = None) -> list[TrainPack]:
    """SFT: the packs of one tree over ``episodes`` (:func:`episodes_tree`, advantage 1 each), split to fit
    ``max_tokens``; their pairs are those of the one unsplit pack (``1 / (B · N_e)`` per token)."""
    return build_packs([PackItem(episodes_tree(episodes), [1.0] * len(episodes))], max_tokens, device=device)


def _rollout_item(tree: CallTree, group: int, part: TreePart | None = None) -> PackItem:
    return PackItem(tree, [0.0] * tree.meta.episode_count(), group=group, harness=tree.meta.harness,
                    task_id=tree.meta.task_id, part=part)


def rollout_pack(trees: Sequence[CallTree], device: str | torch.device | None = None) -> TrainPack:
    """PPO: one pack of ``trees`` whose advantages come per token (:mod:`trainers.ppo.targets`): every
    episode's own trainable tokens are pairs of weight 1 and advantage 0, so ``token_weight[t]``
    counts the episodes that own token ``t``."""
    return build_pack([_rollout_item(t, i) for i, t in enumerate(trees)], device=device, loss_norm="token")


def rollout_packs(trees: Sequence[CallTree], max_tokens: int | None = None,
                  device: str | torch.device | None = None) -> list[TrainPack]:
    """PPO: :func:`rollout_pack` s of at most ``max_tokens`` tokens each, order kept; a larger tree is split
    (:func:`build_packs`); an episode's ``group`` is its tree's index in ``trees``."""
    return build_packs([_rollout_item(t, i) for i, t in enumerate(trees)], max_tokens, device=device,
                       loss_norm="token")
