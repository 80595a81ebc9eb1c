"""Per-(token, episode) behaviour logprobs: what each episode's own sampler recorded for a token it shares.

A call tree stores one logprob per token: that of the FIRST call that sampled it (see
:mod:`clawgym_env.capture.tree`). When episodes of a group sampled an identical prefix, they share its
nodes; under async rollouts they may have sampled it at different policy versions, with different
logprobs. The importance weight of a (token, episode) pair must use the logprob of the policy that
sampled the token *for that episode*, or another episode's TIS weight on the token uses the wrong
policy version.

:func:`episode_behaviour` keeps, next to the tree, the pairs whose own sampler differs from the
tree's: a sparse table ``(node id, offset, episode) -> Behaviour(logprob, version)``. A pair absent
from the table had the node's logprob (the common case: one sampler, or identical samples).

Invariants (``table = episode_behaviour(tree, calls)``, ``calls`` the tree's calls in its order):

* a key ``(n, j, e)`` is a token ``j`` of node ``n`` that episode ``e`` owns (one of its calls sampled
  it, :func:`trainers.batch.advantages.episode_own_tokens`); its value is what ``e``'s FIRST call that
  sampled it recorded (logprob and ``policy_version``);
* a key is present only when that (logprob, version) differs from the tree's first sampler's;
* the table is keyed by the tree's node ids, so it holds for every part of a split tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from clawgym_env.errors import ConfigError

if TYPE_CHECKING:
    from clawgym_env.capture.records import CallRecord
    from clawgym_env.capture.tree import CallTree

__all__ = ["Behaviour", "BehaviourTable", "episode_behaviour"]


class Behaviour(NamedTuple):
    """The logprob an episode's own sampler recorded for a token, and the policy version that sampled it."""

    logprob: float
    version: int


BehaviourTable = dict[tuple[int, int, int], Behaviour]
"""``(node id, token offset in the node, episode position) -> Behaviour`` where it differs from the tree's."""


def episode_behaviour(tree: CallTree, calls: Sequence[CallRecord]) -> BehaviourTable:
    """The pairs of ``tree`` whose own sampler's logprob or version differs from the tree's first sampler's
    (module docstring); ``calls[i]`` is call ``i`` of the tree (``CallTree.from_episodes``' flat order)."""
    meta = tree.meta
    if meta.call_episode is None or meta.prompt_lengths is None:
        return {}  # one episode (or an older tree): nothing to tell apart
    if len(calls) != len(meta.prompt_lengths):
        raise ConfigError(f"tree {meta.tree_id} has {len(meta.prompt_lengths)} calls but {len(calls)} were given")
    lengths = meta.prompt_lengths
    table: BehaviourTable = {}
    for node in tree.nodes:
        end = node.depth + len(node.tokens)
        first: dict[int, int] = {}  # offset -> the first call that sampled it
        own: dict[tuple[int, int], int] = {}  # (offset, episode) -> that episode's first call that sampled it
        for c in node.calls:
            lo = max(0, lengths[c] - node.depth)
            if node.depth + lo >= end:
                continue  # the whole node is context of this call
            e = meta.episode_of(c)
            for j in range(lo, len(node.tokens)):
                first.setdefault(j, c)
                own.setdefault((j, e), c)
        for (j, e), c in own.items():
            c0 = first[j]
            if c == c0:
                continue
            lp = float(calls[c].output_logprobs[node.depth + j - lengths[c]])
            ref = float(calls[c0].output_logprobs[node.depth + j - lengths[c0]])
            version = int(calls[c].policy_version)
            if lp != ref or version != int(calls[c0].policy_version):
                table[(node.id, j, e)] = Behaviour(lp, version)
    return table
