"""Bounded packs: which trees, or which parts of a tree, go into which pack (pure Python: no torch).

A pack is one forward, so its size is what bounds the trainer's activation memory. Trees are laid
into packs of at most ``max_tokens`` tokens in order (:func:`plan_packs`); a tree larger than the
limit is split (:func:`split_tree`) into :class:`TreePart` s that each fit.

Splitting a tree. The tree's leaves are taken in preorder and their root-to-leaf paths are added
greedily to the current part while the part's size (the tokens of the union of its paths, every
node once) stays within the limit; the path that does not fit starts the next part. So a part is a
union of complete root-to-leaf paths: with every node it holds all of that node's ancestors, and a
shared prefix appears in every part whose paths run through it. Each node is **owned** by exactly
one part, the first that holds it; a part's other nodes are context there, recomputed.

Invariants (``parts = split_tree(tree, n)``):

* ``part.tokens <= n`` for every part; a part holds whole root-to-leaf paths (ancestor-closed);
* the parts' ``owned`` sets partition the tree's nodes; ``owned <= nodes``;
* every token's logprob (and value) depends only on its path prefix, which every part holding the
  token carries in full, so it is the same in every part: a loss that counts each token only in the
  part that owns it, summed over the parts, equals the loss of the whole tree in one pack;
* a tree that fits is never split (one part, ``count == 1``); a root-to-leaf path longer than ``n``
  cannot be split this way and raises a :class:`~clawgym_env.errors.ConfigError` that names the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from clawgym_env.capture.tree import CallTree
from clawgym_env.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TreePart:
    """A pack's share of one tree: the union of some root-to-leaf paths, and the nodes it owns."""

    tree: CallTree
    """the whole tree this part belongs to (shared by all its parts)"""
    nodes: frozenset[int]
    """node ids in this part: whole root-to-leaf paths, so with every node all of its ancestors"""
    owned: frozenset[int]
    """the nodes whose tokens this part trains on (loss weights, pairs, value targets); the others are context"""
    tokens: int
    """tokens of the part in a pack (its nodes' segments, each once)"""
    index: int = 0
    """0-based number of this part among its tree's parts (preorder of their first leaves)"""
    count: int = 1
    """how many parts the tree was split into (1: the whole tree)"""
    source: int = 0
    """index of the tree in the sequence given to :func:`plan_packs`"""

    @property
    def is_whole(self) -> bool:
        """True when the part is the whole tree (not split)."""
        return self.count == 1

    @property
    def owned_tokens(self) -> int:
        """Tokens of the nodes this part owns."""
        return sum(len(self.tree.nodes[n].tokens) for n in self.owned)

    @property
    def context_tokens(self) -> int:
        """Tokens this part recomputes as context only (owned by an earlier part)."""
        return self.tokens - self.owned_tokens


def tree_tokens(tree: CallTree) -> int:
    """Number of tokens ``tree`` occupies in a pack (the sum of its segment lengths)."""
    return sum(len(n.tokens) for n in tree.nodes)


def whole_part(tree: CallTree, source: int = 0) -> TreePart:
    """The whole tree as one part that owns every node."""
    every = frozenset(range(len(tree.nodes)))
    return TreePart(tree, every, every, tree_tokens(tree), source=source)


def _preorder_leaves(tree: CallTree) -> list[int]:
    out: list[int] = []
    stack = list(reversed(tree.roots))
    while stack:
        nid = stack.pop()
        children = tree.nodes[nid].children
        if not children:
            out.append(nid)
        stack.extend(reversed(children))
    return out


def split_tree(tree: CallTree, max_tokens: int, source: int = 0) -> list[TreePart]:
    """``tree`` as parts of at most ``max_tokens`` tokens each (see the module docstring); one part when it fits."""
    if max_tokens <= 0:
        raise ConfigError(f"max_pack_tokens must be positive, got {max_tokens}")
    total = tree_tokens(tree)
    if total <= max_tokens:
        return [whole_part(tree, source)]
    sizes = [len(n.tokens) for n in tree.nodes]
    groups: list[set[int]] = []
    current: set[int] = set()
    size = 0
    for leaf in _preorder_leaves(tree):
        path = tree.path(leaf)
        length = sum(sizes[n] for n in path)
        if length > max_tokens:
            raise ConfigError(
                f"a root-to-leaf path of tree {tree.meta.tree_id or '?'} has {length} tokens, more than "
                f"max_pack_tokens={max_tokens}, so it cannot be split into packs that fit; raise max_pack_tokens "
                "to at least max_context_tokens (the proxy's cap on one call's context)")
        new = [n for n in path if n not in current]
        add = sum(sizes[n] for n in new)
        if current and size + add > max_tokens:
            groups.append(current)
            current, size = set(path), length
        else:
            current.update(new)
            size += add
    groups.append(current)
    seen: set[int] = set()
    parts = []
    for i, nodes in enumerate(groups):
        owned = frozenset(nodes - seen)
        seen |= nodes
        parts.append(TreePart(tree, frozenset(nodes), owned, sum(sizes[n] for n in nodes), index=i,
                              count=len(groups), source=source))
    if len(seen) != len(tree.nodes):
        raise ConfigError(f"tree {tree.meta.tree_id or '?'} has nodes on no root-to-leaf path; rebuild it "
                          "(CallTree.validate names the broken invariant)")
    return parts


def plan_packs(trees: Sequence[CallTree], max_tokens: int | None) -> list[list[TreePart]]:
    """The parts of ``trees`` in consecutive packs of at most ``max_tokens`` tokens each, order kept.

    Without ``max_tokens`` every tree is a pack of its own, whole. Otherwise a tree that fits is one
    part, a larger one is split (:func:`split_tree`), and parts fill packs in order: a part joins the
    current pack while the pack stays within the limit (small trees are packed together as before).
    The parts of one split tree land in consecutive packs, never two in one pack.
    """
    if max_tokens is None:
        return [[whole_part(t, k)] for k, t in enumerate(trees)]
    if max_tokens <= 0:
        raise ConfigError(f"max_pack_tokens must be positive, got {max_tokens}")
    bins: list[list[TreePart]] = []
    size = 0
    for k, tree in enumerate(trees):
        for part in split_tree(tree, max_tokens, source=k):
            if bins and size + part.tokens <= max_tokens:
                bins[-1].append(part)
                size += part.tokens
            else:
                bins.append([part])
                size = part.tokens
    return bins
