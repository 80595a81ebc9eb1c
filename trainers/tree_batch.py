"""Episodes → call trees → THE training batch of every trainer: :class:`TrainPack`, built by :func:`build_pack`.

GRPO: :func:`make_groups` buckets rollouts by ``(suite, task_id, harness)``, drops infrastructure
failures (never scored 0), cleans every rollout (:mod:`trainers.tree_clean`: untrained call kinds, dead
retries, rollouts over ``max_leaves`` dropped from their group, all counted in ``Group.clean``), computes
GRPO advantages over the rollouts that remain and skips groups whose rewards are all equal;
:func:`pack_groups` packs each group's :class:`~clawgym_env.capture.tree.CallTree` (shared prefixes
once) into :class:`TrainPack` s. SFT: :func:`episodes_tree` + :func:`build_pack` with advantage 1.
PPO: :func:`rollout_packs` (pairs of weight 1; its per-token advantages, values and returns are
computed per update in :mod:`trainers.ppo_targets` on top of the same pack).

The unit of the loss is a **pair** ``(token t, episode e)``: a sampled token shared by several
episodes (an identical prefix they all sampled) appears once in the pack but in one pair per
episode, each with its own advantage, because a clipped surrogate is not linear in the advantage.
Pair weights follow :func:`trainers.advantages.episode_token_weights` — each episode's loss is the
mean over its own distinct trainable tokens, the group the mean over its ``G`` episodes — divided
by the number of groups in the step, so a loss ``Σ pair_weight · term`` is the mean over groups
whatever the packing, and an episode that splits into many calls or branches weighs no more than a
one-call episode.

Token exactness: a call recorded as not token-exact (a turn of its history was re-rendered from
text, or the ids were re-encoded from an upstream's text) has prompt ids the policy may never have
produced and, for a passthrough, meaningless logprobs. A sampled token is **trainable** only when
at least one token-exact call passes through its node; tokens that lie only on inexact calls are
masked (counted in ``masked_inexact_tokens``) and excluded from ``N_e``. Trainable tokens also need
a predecessor and a recorded rollout logprob: :func:`trainers.packing.trainable_mask` (the one rule),
and an episode's pairs are its *own* tokens only (:func:`trainers.advantages.episode_own_tokens`).

Invariants of a :class:`TrainPack` (``T`` packed tokens, ``P`` pairs):

* ``pair_token`` indexes ``trainable`` tokens only; ``pair_weight > 0``;
* ``token_weight[t] == Σ pair_weight over the pairs of t`` (0 on untrainable tokens);
* GRPO (``loss_norm="episode"``): over all packs of one step, ``Σ pair_weight == (episodes with
  trainable tokens) / (G · groups)`` summed per group, so at most 1; PPO's packs (:func:`rollout_pack`)
  have ``pair_weight == 1`` and ``pair_adv == 0`` (its weights and advantages are per token);
* ``pair_episode`` indexes ``episodes`` (one :class:`PackEpisode` per episode of the pack: group,
  harness, task, episode_id, reward, advantage, trainable token count);
* ``trainable`` is :func:`trainers.packing.trainable_mask` of ``packed`` minus the tokens owned only
  by episodes masked out (``PackItem.skip``).

Bounded packs: :func:`pack_groups` and :func:`rollout_packs` lay trees into packs of at most
``max_tokens`` tokens (:func:`trainers.pack_split.plan_packs`), splitting a larger tree into parts.
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
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from clawgym_env.capture.records import CallRecord, EpisodeRecord
from clawgym_env.capture.tree import CallTree
from clawgym_env.capture.tree_meta import EpisodeSummary, TreeMeta
from clawgym_env.errors import PolicyError
from trainers.advantages import episode_own_tokens, group_advantages, is_constant, node_episodes
from trainers.pack_split import TreePart, plan_packs
from trainers.packing import PackedTree, pack_trees, scorable_mask, trainable_flags, trainable_mask
from trainers.tree_clean import CleanConfig, CleanStats, clean_rollouts

EpisodePair = tuple[EpisodeRecord, list[CallRecord]]


def as_episode(item: Any) -> EpisodePair:
    """An ``EpisodeResult``, a ``(record, calls)`` pair or a dict with both → ``(record, calls)``."""
    if isinstance(item, tuple) and len(item) == 2:
        return item[0], list(item[1])
    if hasattr(item, "record") and hasattr(item, "calls"):
        return item.record, list(item.calls)
    if isinstance(item, dict) and "episode" in item and "calls" in item:  # an env step's info
        return (EpisodeRecord.model_validate(item["episode"]),
                [c if isinstance(c, CallRecord) else CallRecord.model_validate(c) for c in item["calls"]])
    raise PolicyError(f"cannot read an episode from {type(item).__name__}; pass EpisodeResult or (record, calls)")


def group_key(record: EpisodeRecord) -> tuple[str, str, str]:
    """The key a rollout is grouped by: ``(suite or '-', task_id, harness)``."""
    return (record.suite or "-", record.task_id, record.harness)


@dataclasses.dataclass
class Group:
    """The kept episodes of one (suite, task, harness); ``skipped`` says why it does not train.

    ``episodes`` are the rollouts as collected (records and all their calls: a rebuild cleans them again);
    ``rewards``/``advantages`` are aligned with them; ``tree`` is built from their CLEANED calls."""

    key: tuple[str, str, str]
    episodes: list[EpisodePair]
    rewards: list[float]
    advantages: list[float]
    infra_excluded: int = 0
    skipped: str | None = None
    """why the group does not train: ``constant_reward``, ``all_infra``, ``no_tokens``, ``all_overlong``,
    ``max_leaves`` (fewer than 2 rollouts left after the ``max_leaves`` drops), ``all_stale`` (async)"""
    tree: CallTree | None = None
    overlong: list[int] = dataclasses.field(default_factory=list)
    """Positions of the episodes with a call cut at ``max_tokens`` (finish reason ``length``)."""
    masked: set[int] = dataclasses.field(default_factory=set)
    """Positions of the episodes that get no training pairs (``overlong="mask"``)."""
    dropped: list[EpisodePair] = dataclasses.field(default_factory=list)
    """rollouts dropped from the group for ``clean.max_leaves`` (as collected; not in ``episodes``)"""
    clean: CleanStats = dataclasses.field(default_factory=CleanStats)
    """what cleaning removed from the group's rollouts (:mod:`trainers.tree_clean`)"""

    @property
    def harness(self) -> str:
        """The harness of the group's episodes."""
        return self.key[2]


OVERLONG_MODES = ("keep", "mask", "penalty")
LOSS_NORMS = ("episode", "token", "constant")


def is_overlong(calls: Sequence[CallRecord]) -> bool:
    """True when a call of the episode stopped because it reached its token limit."""
    return any(c.finish_reason == "length" for c in calls)


def make_groups(results: Iterable[Any], *, normalize_std: bool = True, overlong: str = "keep",
                overlong_penalty: float = 0.0, clean: CleanConfig | None = None) -> list[Group]:
    """Bucket rollouts into groups (first-seen order), drop infra failures, clean, score advantages, build trees.

    ``clean`` (:class:`~trainers.tree_clean.CleanConfig`; None: train every call as captured) removes the calls
    not trained (kinds, dead retries) and drops rollouts over ``max_leaves`` from their group before the
    advantages; a group left with fewer than 2 rollouts by those drops is skipped as ``max_leaves``.
    Overlong episodes (a kept call cut at ``max_tokens``): ``"keep"`` trains them as they are;
    ``"penalty"`` subtracts ``overlong_penalty`` from their reward before the advantages (the record
    keeps its reward); ``"mask"`` keeps them in the group's baseline but gives them no training pairs,
    so a cut-off answer is neither reinforced nor punished for being cut.
    """
    if overlong not in OVERLONG_MODES:
        raise PolicyError(f"overlong must be one of {OVERLONG_MODES}, got {overlong!r}")
    buckets: dict[tuple[str, str, str], list[EpisodePair]] = {}
    infra: dict[tuple[str, str, str], int] = defaultdict(int)
    for item in results:
        rec, calls = as_episode(item)
        key = group_key(rec)
        buckets.setdefault(key, [])
        if rec.is_infra_failure:
            infra[key] += 1
            continue
        buckets[key].append((rec, calls))
    groups = []
    for key, collected in buckets.items():
        keep, cleaned, stats = clean_rollouts(collected, clean)
        eps = [collected[i] for i in keep]
        kept = set(keep)
        trained = [(rec, calls) for (rec, _), calls in zip(eps, cleaned)]
        cut = [i for i, (_, calls) in enumerate(trained) if is_overlong(calls)]
        rewards = [float(r.reward) - (overlong_penalty if overlong == "penalty" and i in cut else 0.0)
                   for i, (r, _) in enumerate(eps)]
        g = Group(key, eps, rewards, [0.0] * len(eps), infra_excluded=infra[key], overlong=cut,
                  masked=set(cut) if overlong == "mask" else set(),
                  dropped=[e for i, e in enumerate(collected) if i not in kept], clean=stats)
        if not collected:
            g.skipped = "all_infra"
        elif g.dropped and len(eps) < 2:
            g.skipped = "max_leaves"
        elif len(g.masked) == len(eps):
            g.skipped = "all_overlong"
        elif is_constant(rewards):
            g.skipped = "constant_reward"
        elif not any(calls for _, calls in trained):
            g.skipped = "no_tokens"
        else:
            g.advantages = group_advantages(rewards, normalize_std=normalize_std)
            g.tree = CallTree.from_episodes(trained)
        groups.append(g)
    return groups


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
    """the part of ``tree`` this item packs when the tree was split (:mod:`trainers.pack_split`); None: whole"""


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
        raise PolicyError(f"loss_norm must be one of {LOSS_NORMS}, got {loss_norm!r}")
    if loss_norm == "constant" and not (norm_constant and norm_constant > 0):
        raise PolicyError("loss_norm='constant' needs a positive norm_constant (e.g. the max tokens per episode)")
    packed = pack_trees([it.part or it.tree for it in items], device=device)
    rule = trainable_mask(packed)
    masked = int(scorable_mask(packed).sum()) - int(rule.sum())  # scorable, but only on inexact calls
    expected = [False] * packed.num_tokens  # the rule rebuilt from trainable_flags, checked against ``rule``
    p_tok: list[int] = []
    p_ep: list[int] = []
    p_w: list[float] = []
    p_adv: list[float] = []
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
                    raise PolicyError(f"tree {tree.meta.tree_id} has episode {e} but only {len(advs)} advantages")
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
        for nid in sorted(part.owned):  # pairs on the tokens this pack owns
            start, ok = packed.node_slice(ti, nid).start, flags[nid]
            expected[start:start + len(ok)] = ok
            for e in members[nid]:
                if not counts[e] or e in item.skip:
                    continue
                idx = [start + j for j, (f, o) in enumerate(zip(ok, own[nid][e])) if f and o]
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
    if rule.tolist() != expected:
        raise PolicyError("the packed trainable rule and packing.trainable_flags disagree; they must be one rule")
    dev = rule.device
    pair_token = torch.tensor(p_tok, dtype=torch.long, device=dev)
    pair_weight = torch.tensor(p_w, dtype=torch.float32, device=dev)
    return TrainPack(packed=packed, trainable=torch.zeros_like(rule).index_fill_(0, pair_token, True),
                     token_weight=torch.zeros(packed.num_tokens, dtype=torch.float32,
                                              device=dev).index_add_(0, pair_token, pair_weight),
                     pair_token=pair_token, pair_episode=torch.tensor(p_ep, dtype=torch.long, device=dev),
                     pair_weight=pair_weight, pair_adv=torch.tensor(p_adv, dtype=torch.float32, device=dev),
                     episodes=episodes, masked_inexact_tokens=masked)


def pack_groups(groups: Sequence[Group], *, max_tokens: int | None = None,
                device: str | torch.device | None = None, loss_norm: str = "episode",
                norm_constant: float | None = None) -> list[TrainPack]:
    """GRPO: pack the trainable groups (``skipped is None``), several per pack up to ``max_tokens``.

    A group that fits is never split (its shared prefix is computed once); a larger one is split
    (:func:`build_packs`); without ``max_tokens`` each group is its own pack. Pair weights
    (``loss_norm``, see :func:`build_pack`) carry ``1 / (number of trainable groups)``, except
    ``"token"``: every pair of the step weighs ``1 / (pairs in the step)``.
    """
    items = [PackItem(g.tree, g.advantages, group=i, harness=g.harness, task_id=g.key[1], skip=frozenset(g.masked))
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
    """:func:`build_pack` s of at most ``max_tokens`` tokens each (:func:`trainers.pack_split.plan_packs`):
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
    """PPO: one pack of ``trees`` whose advantages come per token (:mod:`trainers.ppo_targets`): every
    episode's own trainable tokens are pairs of weight 1 and advantage 0, so ``token_weight[t]``
    counts the episodes that own token ``t``."""
    return build_pack([_rollout_item(t, i) for i, t in enumerate(trees)], device=device, loss_norm="token")


def rollout_packs(trees: Sequence[CallTree], max_tokens: int | None = None,
                  device: str | torch.device | None = None) -> list[TrainPack]:
    """PPO: :func:`rollout_pack` s of at most ``max_tokens`` tokens each, order kept; a larger tree is split
    (:func:`build_packs`); an episode's ``group`` is its tree's index in ``trees``."""
    return build_packs([_rollout_item(t, i) for i, t in enumerate(trees)], max_tokens, device=device,
                       loss_norm="token")


def group_summary(groups: Sequence[Group]) -> dict[str, int]:
    """Counts for metrics: groups trained/skipped and why, infra failures excluded, and what cleaning removed
    (``clean/...``: :meth:`trainers.tree_clean.CleanStats.as_metrics`, summed over the groups)."""
    out: dict[str, int] = {"groups": len(groups), "groups_trained": sum(g.skipped is None for g in groups)}
    for reason in ("constant_reward", "all_infra", "no_tokens", "all_overlong", "max_leaves", "all_stale"):
        out[f"groups_skipped_{reason}"] = sum(g.skipped == reason for g in groups)
    out["episodes_infra_excluded"] = sum(g.infra_excluded for g in groups)
    out["episodes_overlong"] = sum(len(g.overlong) for g in groups)
    out["episodes_overlong_masked"] = sum(len(g.masked) for g in groups)
    out.update(CleanStats.total([g.clean for g in groups]).as_metrics())
    return out
