"""Advantage functions over call trees (pure Python: no torch).

GRPO (rollout level). A group is the G episodes of one (task, harness). Each episode ``e`` gets one
advantage ``A_e = r_e - mean(r)`` (optionally divided by the group's std); every token that ``e``
sampled carries ``A_e``. Infrastructure failures are excluded before this (never scored 0), and a
group whose rewards are all equal carries no signal and is skipped (:func:`is_constant`).

Loss normalisation. So that an episode that splits into many calls or branches is not
over-weighted, each episode's loss is a mean over *its own* distinct sampled tokens, and the group
is a mean over episodes: a sampled token ``t`` has weight ``W[t, e] = 1 / (G * N_e)`` for every
episode ``e`` whose calls pass through it (``N_e`` = distinct sampled tokens of ``e``). A prefix
shared by several episodes is computed once and its gradient is the sum of those weights — the
same total as training every episode's tokens separately.

GAE on a branched tree (PPO with a critic). A path is root → leaf; its transitions are the sampled
tokens on it, in order (context tokens are the environment's moves and are not actions). Along a
path, with ``V_t`` the critic's value of the state before sampled token ``t``:
``delta_t = r_t + gamma * V_next - V_t`` where ``r_t`` is 0 except the path's last sampled token,
which gets the terminal reward of the episode(s) ending at that leaf, and ``V_next`` is 0 after the
last token; ``A_t = delta_t + gamma * lam * A_next``; ``return_t = A_t + V_t``. A token on a shared
node lies on several paths; its advantage and return are the **mean over the paths through it**
(each leaf counts once). With ``gamma = lam = 1`` (the default, as in the paper) every path of one
episode gives ``A_t = R - V_t``, so the combination only matters for other settings or for group
trees whose branches end in different rewards.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clawgym_env.capture.tree import CallTree


def is_constant(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """True when a group's rewards carry no learning signal."""
    return len(rewards) == 0 or max(rewards) - min(rewards) <= tol


def group_advantages(rewards: Sequence[float], *, normalize_std: bool = True, eps: float = 1e-6) -> list[float]:
    """``r - mean(r)``, divided by the (population) std when ``normalize_std``."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    adv = [r - mean for r in rewards]
    if normalize_std:
        std = math.sqrt(sum(a * a for a in adv) / len(adv))
        adv = [a / (std + eps) for a in adv]
    return adv


def node_episodes(tree: CallTree) -> list[list[int]]:
    """For each node, the positions of the episodes whose calls pass through it (sorted)."""
    meta = tree.meta
    if meta.call_episode is None:
        return [[0] for _ in tree.nodes]
    return [sorted({meta.episode_of(c) for c in node.calls}) for node in tree.nodes]


def episode_own_tokens(tree: CallTree) -> list[dict[int, list[bool]]]:
    """For each node, ``{episode: flags}``: which of the node's tokens that episode's own calls sampled.

    A token is an episode's action only where one of its calls sampled it; a token it received only as
    context (e.g. a turn identical to another episode's sample, spliced or prefilled into its prompt)
    is not. Trees without ``meta.prompt_lengths`` (older files) fall back to ``node.sampled``.
    This is THE "own tokens only" rule of every trainer (GRPO/SFT pairs, PPO loss weights).
    """
    members = node_episodes(tree)
    lengths = tree.meta.prompt_lengths
    out: list[dict[int, list[bool]]] = []
    for node, eps in zip(tree.nodes, members):
        if lengths is None:
            out.append({e: list(node.sampled) for e in eps})
            continue
        first: dict[int, int] = {}  # episode -> the shortest prompt among its calls through the node
        for c in node.calls:
            e = tree.meta.episode_of(c)
            first[e] = min(first.get(e, lengths[c]), lengths[c])
        out.append({e: [s and node.depth + j >= first[e] for j, s in enumerate(node.sampled)] for e in eps})
    return out


def episode_token_weights(tree: CallTree, num_episodes: int | None = None) -> list[dict[int, float]]:
    """Per node, ``{episode: weight}`` for its sampled tokens, ``weight = 1 / (G * N_e)``."""
    members = node_episodes(tree)
    episodes = num_episodes or (max((e for m in members for e in m), default=-1) + 1)
    sampled_per_episode: dict[int, int] = defaultdict(int)
    for node, eps in zip(tree.nodes, members):
        n = sum(node.sampled)
        for e in eps:
            sampled_per_episode[e] += n
    return [{e: 1.0 / (episodes * sampled_per_episode[e]) for e in eps if sampled_per_episode[e]}
            for eps in members]


def leaf_rewards(tree: CallTree, episode_rewards: Sequence[float]) -> dict[int, float]:
    """Terminal reward of each leaf: the mean reward of the episodes whose calls end in that leaf's path."""
    members = node_episodes(tree)
    return {leaf: sum(episode_rewards[e] for e in members[leaf]) / len(members[leaf]) for leaf in tree.leaves()}


def tree_gae(tree: CallTree, values: Sequence[Sequence[float | None]], rewards: dict[int, float], *,
             gamma: float = 1.0, lam: float = 1.0) -> tuple[list[list[float]], list[list[float]]]:
    """GAE over every root→leaf path, combined on shared nodes by the mean over paths.

    ``values[n][j]`` is the critic's value before token ``j`` of node ``n`` (read only where that
    token is sampled); ``rewards[leaf]`` is the terminal reward of the path ending at ``leaf``.
    Returns ``(advantages, returns)`` shaped like the nodes (0.0 on context tokens).
    """
    adv_sum = [[0.0] * len(n.tokens) for n in tree.nodes]
    ret_sum = [[0.0] * len(n.tokens) for n in tree.nodes]
    count = [[0] * len(n.tokens) for n in tree.nodes]
    for leaf in tree.leaves():
        steps = [(nid, j) for nid in tree.path(leaf) for j, s in enumerate(tree.nodes[nid].sampled) if s]
        next_value, next_adv = 0.0, 0.0
        for k in range(len(steps) - 1, -1, -1):
            nid, j = steps[k]
            value = values[nid][j]
            if value is None:
                raise ValueError(f"tree_gae: no value before sampled token {j} of node {nid}")
            v = float(value)
            reward = rewards[leaf] if k == len(steps) - 1 else 0.0
            delta = reward + gamma * next_value - v
            a = delta + gamma * lam * next_adv
            adv_sum[nid][j] += a
            ret_sum[nid][j] += a + v
            count[nid][j] += 1
            next_value, next_adv = v, a
    adv = [[s / c if c else 0.0 for s, c in zip(row_s, row_c)] for row_s, row_c in zip(adv_sum, count)]
    ret = [[s / c if c else 0.0 for s, c in zip(row_s, row_c)] for row_s, row_c in zip(ret_sum, count)]
    return adv, ret
