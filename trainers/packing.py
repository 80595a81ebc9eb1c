"""Tree packing: one or more call trees flattened into ONE packed sequence for a single forward pass.

A call tree (:class:`clawgym_env.capture.tree.CallTree`: ``nodes`` with
``parent``/``tokens``/``sampled``/``logprobs``/``children``, ``roots``, ``call_leaf``, ``meta``) stores every
distinct token prefix once. Packing lays its nodes out depth-first (preorder from each root, children
in the tree's order; several trees one after the other) and gives each token:

* ``position_ids[i]``: the token's position in its own root-to-node path (what it had in the call's
  own sequence), so rotary embeddings see exactly what a per-call forward would;
* a tree attention mask: token ``i`` attends to every token of its node's ancestors and to the tokens
  of its own node up to and including itself, nothing else (no attention across siblings or trees);
* ``predecessor[i]``: the packed index of the token whose logits predict token ``i`` — the previous
  token of its node, or the last token of the parent node for a node's first token; ``-1`` for the
  first token of a root (no prediction, so never a training target).

Invariants of :class:`PackedTree` (``T`` tokens, ``N`` nodes over all packed trees):

* with the mask and positions above, the logprob of token ``i`` gathered from the logits at
  ``predecessor[i]`` equals its logprob in an ordinary causal forward over any root-to-leaf path
  through it (it depends on its path prefix only);
* ``node_offsets`` (``N + 1``) are the start of each packed node, ``node_offsets[-1] == T``; nodes are
  numbered in packed order, so ``node_parent[n] < n`` and every attended index is ``<= i``;
* ``paths[k]`` lists, in order, the packed indices of root-to-leaf path ``k`` (leaf ``path_leaves[k]``
  as ``(tree index, node id)``), and ``path_counts[i]`` is the number of those paths through token
  ``i``: a per-path loss that counts a shared token once per path equals a packed loss weighted by
  ``path_counts``;
* ``rollout_logprobs[i]`` is the captured logprob where ``logprob_known[i]`` (a sampled token with a
  recorded logprob), 0.0 elsewhere; ``target_mask`` = sampled tokens that have a predecessor.

The trainable-token rule (:func:`trainable_mask`) lives here, once, for every trainer: a
:func:`scorable_mask` token (sampled, with a predecessor and a recorded rollout logprob) that lies on
at least one token-exact call (:func:`inexact_token_mask` marks the others).

Packing needs torch; the tree itself does not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from clawgym_env.capture.tree import CallTree
from clawgym_env.errors import PolicyError

MASK_FORMS = ("bool", "additive", "block")


@dataclasses.dataclass
class PackedTree:
    """Flat tensors of one packed sequence (see the module invariants). All tensors are 1-D and on one device."""

    input_ids: torch.Tensor          # [T] long
    position_ids: torch.Tensor       # [T] long, position in the token's own path
    predecessor: torch.Tensor        # [T] long, -1 for a root's first token
    sampled: torch.Tensor            # [T] bool
    rollout_logprobs: torch.Tensor   # [T] float32, 0.0 where unknown
    logprob_known: torch.Tensor      # [T] bool
    path_counts: torch.Tensor        # [T] float32, leaf paths through the token
    token_node: torch.Tensor         # [T] long, packed node index of each token
    node_offsets: torch.Tensor       # [N + 1] long
    node_parent: torch.Tensor        # [N] long, packed index of the parent node, -1 for roots
    node_tree: torch.Tensor          # [N] long, index of the tree the node came from
    node_ids: torch.Tensor           # [N] long, the node's id inside its tree
    paths: list[torch.Tensor]        # per root-to-leaf path: packed token indices in order
    path_leaves: list[tuple[int, int]]  # per path: (tree index, leaf node id)
    tree_ranges: list[tuple[int, int]]  # per packed tree: [start, end) token range
    trees: list[CallTree] = dataclasses.field(default_factory=list, repr=False)
    _ancestors: torch.Tensor | None = dataclasses.field(default=None, repr=False)
    _node_index: dict[tuple[int, int], int] | None = dataclasses.field(default=None, repr=False)

    # ---- sizes and masks ------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        """T, the packed tokens."""
        return int(self.input_ids.shape[0])

    @property
    def num_nodes(self) -> int:
        """N, the packed nodes over all trees."""
        return int(self.node_parent.shape[0])

    @property
    def is_chain(self) -> bool:
        """True when the pack is a single root-to-leaf path: the tree mask is then plain causal."""
        return len(self.paths) == 1 and len(self.tree_ranges) == 1 and int(self.paths[0].numel()) == self.num_tokens

    @property
    def target_mask(self) -> torch.Tensor:
        """Sampled tokens that can be scored (they have a predecessor)."""
        return self.sampled & (self.predecessor >= 0)

    def node_ancestors(self) -> torch.Tensor:
        """[N, N] bool: ``a[n, m]`` is True when packed node ``m`` is ``n`` or one of its ancestors."""
        if self._ancestors is None:
            n = self.num_nodes
            anc = torch.zeros((n, n), dtype=torch.bool)
            parent = self.node_parent.tolist()
            for i in range(n):  # parents come first
                if parent[i] >= 0:
                    anc[i] = anc[parent[i]]
                anc[i, i] = True
            self._ancestors = anc.to(self.input_ids.device)
        return self._ancestors

    def dense_mask(self) -> torch.Tensor:
        """[T, T] bool tree mask: True where query ``i`` may attend to key ``j``. Costs T² bytes."""
        node = self.token_node
        return self.node_ancestors()[node][:, node].tril_()  # same node or ancestor, and j <= i

    def attention_mask(self, form: str = "bool", dtype: torch.dtype = torch.float32):
        """The mask in the form a transformers model takes as a custom ``attention_mask``.

        ``"bool"``: [1, 1, T, T] bool (``sdpa`` only — ``eager`` would ADD the booleans and silently
        attend everywhere); ``"additive"``: [1, 1, T, T] of 0 / ``finfo(dtype).min`` (``eager`` and
        ``sdpa``; 4-byte fp32 or 2-byte bf16 per entry); ``"block"``: a FlexAttention ``BlockMask``
        (``flex_attention``; never materialises T² entries, only block tables).
        """
        if form == "bool":
            return self.dense_mask()[None, None]
        if form == "additive":
            m = self.dense_mask().logical_not_()
            out = torch.zeros(m.shape, dtype=dtype, device=m.device)
            return out.masked_fill_(m, torch.finfo(dtype).min)[None, None]
        if form == "block":
            return self.block_mask()
        raise PolicyError(f"unknown mask form {form!r}; use one of {MASK_FORMS}")

    def block_mask(self, block_size: int = 128):
        """A FlexAttention ``BlockMask`` of the tree mask (for ``attn_implementation="flex_attention"``)."""
        from torch.nn.attention.flex_attention import create_block_mask

        node, anc = self.token_node, self.node_ancestors()

        def tree_mask(b, h, q, k):
            return anc[node[q], node[k]] & (k <= q)

        t = self.num_tokens
        return create_block_mask(tree_mask, 1, None, t, t, device=str(node.device), BLOCK_SIZE=block_size)

    # ---- indexing helpers -----------------------------------------------------------------------
    def node_slice(self, tree_index: int, node_id: int) -> slice:
        """Packed token range of node ``node_id`` of packed tree ``tree_index``."""
        n = self._packed_node(tree_index, node_id)
        return slice(int(self.node_offsets[n]), int(self.node_offsets[n + 1]))

    def path_indices(self, tree_index: int, node_id: int) -> torch.Tensor:
        """Packed indices of the root-to-``node_id`` sequence of tree ``tree_index`` (in order)."""
        n = self._packed_node(tree_index, node_id)
        chain = []
        while n >= 0:
            chain.append(n)
            n = int(self.node_parent[n])
        offs = self.node_offsets
        parts = [torch.arange(int(offs[m]), int(offs[m + 1]), device=offs.device) for m in reversed(chain)]
        return torch.cat(parts)

    def call_indices(self, tree_index: int, call: int) -> torch.Tensor:
        """Packed indices of call ``call``'s prompt + output (path to ``tree.call_leaf[call]``)."""
        return self.path_indices(tree_index, self.trees[tree_index].call_leaf[call])

    def _packed_node(self, tree_index: int, node_id: int) -> int:
        if self._node_index is None:
            self._node_index = {(t, n): k for k, (t, n) in enumerate(zip(self.node_tree.tolist(),
                                                                         self.node_ids.tolist()))}
        k = self._node_index.get((int(tree_index), int(node_id)))
        if k is None:
            raise PolicyError(f"node {node_id} of packed tree {tree_index} is not in this pack")
        return k

    def to(self, device) -> PackedTree:
        """A copy with every tensor on ``device``."""
        moved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k, v in moved.items():
            if isinstance(v, torch.Tensor):
                moved[k] = v.to(device)
        moved["paths"] = [p.to(device) for p in self.paths]
        return PackedTree(**moved)


def _preorder(tree: CallTree) -> list[int]:
    order: list[int] = []
    stack = list(reversed(tree.roots))
    while stack:
        nid = stack.pop()
        order.append(nid)
        stack.extend(reversed(tree.nodes[nid].children))
    if len(order) != len(tree.nodes):
        raise PolicyError(f"tree has {len(tree.nodes)} nodes but only {len(order)} are reachable from its roots; "
                          "rebuild it (CallTree.validate names the broken invariant)")
    return order


def pack_trees(trees: CallTree | Sequence[CallTree], device: str | torch.device | None = None) -> PackedTree:
    """Pack one tree, or several (e.g. a GRPO group), into one :class:`PackedTree`.

    Trees never attend to each other; each keeps its own positions starting at 0.
    """
    trees = [trees] if isinstance(trees, CallTree) else list(trees)
    if not trees:
        raise PolicyError("pack_trees needs at least one tree")
    ids: list[int] = []
    pos: list[int] = []
    pred: list[int] = []
    sampled: list[bool] = []
    lps: list[float] = []
    known: list[bool] = []
    token_node: list[int] = []
    offsets: list[int] = []
    parents: list[int] = []
    node_tree: list[int] = []
    node_ids: list[int] = []
    leaf_nodes: list[int] = []
    path_leaves: list[tuple[int, int]] = []
    ranges: list[tuple[int, int]] = []
    for ti, tree in enumerate(trees):
        start = len(ids)
        local: dict[int, int] = {}  # tree node id -> packed node index
        depth: dict[int, int] = {}
        for nid in _preorder(tree):
            node = tree.nodes[nid]
            if not node.tokens or not (len(node.tokens) == len(node.sampled) == len(node.logprobs)):
                raise PolicyError(f"node {nid} of tree {ti} has an empty segment or per-token lists of unequal "
                                  "length; the tree is malformed")
            p = node.parent
            pk = local[p] if p is not None else -1
            d = depth[p] + len(tree.nodes[p].tokens) if p is not None else 0
            k = len(offsets)
            local[nid], depth[nid] = k, d
            offsets.append(len(ids))
            parents.append(pk)
            node_tree.append(ti)
            node_ids.append(nid)
            first_pred = offsets[pk + 1] - 1 if pk >= 0 else -1  # parent's last token (parent is complete)
            for j, tok in enumerate(node.tokens):
                pred.append(first_pred if j == 0 else len(ids) - 1)
                ids.append(int(tok))
                pos.append(d + j)
                sampled.append(bool(node.sampled[j]))
                lp = node.logprobs[j]
                known.append(bool(node.sampled[j]) and lp is not None)
                lps.append(float(lp) if lp is not None and known[-1] else 0.0)
                token_node.append(k)
            if not node.children:
                leaf_nodes.append(k)
                path_leaves.append((ti, nid))
        ranges.append((start, len(ids)))
    offsets.append(len(ids))
    n_nodes = len(parents)
    leaves_below = [0] * n_nodes
    for k in leaf_nodes:
        leaves_below[k] = 1
    for k in reversed(range(n_nodes)):  # children come after parents
        if parents[k] >= 0:
            leaves_below[parents[k]] += leaves_below[k]
    tok_node = torch.tensor(token_node, dtype=torch.long, device=device)
    offs = torch.tensor(offsets, dtype=torch.long, device=device)
    paths = []
    for leaf in leaf_nodes:
        chain = []
        n = leaf
        while n >= 0:
            chain.append(n)
            n = parents[n]
        paths.append(torch.cat([torch.arange(offsets[m], offsets[m + 1], device=device) for m in reversed(chain)]))
    return PackedTree(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        position_ids=torch.tensor(pos, dtype=torch.long, device=device),
        predecessor=torch.tensor(pred, dtype=torch.long, device=device),
        sampled=torch.tensor(sampled, dtype=torch.bool, device=device),
        rollout_logprobs=torch.tensor(lps, dtype=torch.float32, device=device),
        logprob_known=torch.tensor(known, dtype=torch.bool, device=device),
        path_counts=torch.tensor(leaves_below, dtype=torch.float32, device=device)[tok_node],
        token_node=tok_node, node_offsets=offs,
        node_parent=torch.tensor(parents, dtype=torch.long, device=device),
        node_tree=torch.tensor(node_tree, dtype=torch.long, device=device),
        node_ids=torch.tensor(node_ids, dtype=torch.long, device=device),
        paths=paths, path_leaves=path_leaves, tree_ranges=ranges, trees=trees)


def tree_tokens(tree: CallTree) -> int:
    """Number of tokens ``tree`` occupies in a pack (the sum of its segment lengths)."""
    return sum(len(n.tokens) for n in tree.nodes)


def pack_batch(trees: Sequence[CallTree], max_tokens: int | None = None,
               device: str | torch.device | None = None) -> list[PackedTree]:
    """Pack ``trees`` into a list of packs of at most ``max_tokens`` tokens each, keeping their order.

    Trees are never split: a tree larger than ``max_tokens`` gets a pack of its own. Without
    ``max_tokens`` every tree is one pack. Returns ``[]`` for no trees.
    """
    trees = list(trees)
    return [pack_trees([trees[k] for k in b], device) for b in bin_by_tokens(trees, max_tokens)]


def bin_by_tokens(trees: Sequence[CallTree], max_tokens: int | None) -> list[list[int]]:
    """Indices of ``trees`` in consecutive bins of at most ``max_tokens`` tree tokens each, order kept.

    A tree is never split: a tree larger than ``max_tokens`` gets a bin of its own. Without
    ``max_tokens`` every tree is one bin. The one packing policy of every trainer.
    """
    if max_tokens is None:
        return [[k] for k in range(len(trees))]
    if max_tokens <= 0:
        raise PolicyError(f"max_tokens must be positive, got {max_tokens}")
    bins: list[list[int]] = []
    size = 0
    for k, t in enumerate(trees):
        n = tree_tokens(t)
        if bins and size + n <= max_tokens:
            bins[-1].append(k)
            size += n
        else:
            bins.append([k])
            size = n
    return bins


def inexact_nodes(tree: CallTree) -> set[int]:
    """Nodes every call through which was recorded as not token-exact (``meta.inexact_calls``)."""
    bad = set(tree.meta.inexact_calls)
    if not bad:
        return set()
    return {n.id for n in tree.nodes if n.calls and all(c in bad for c in n.calls)}


def inexact_token_mask(pack: PackedTree) -> torch.Tensor:
    """[T] bool: tokens that lie only on calls recorded as not token-exact."""
    bad = torch.zeros(pack.num_tokens, dtype=torch.bool, device=pack.input_ids.device)
    for ti, tree in enumerate(pack.trees):
        for nid in inexact_nodes(tree):
            bad[pack.node_slice(ti, nid)] = True
    return bad


def scorable_mask(pack: PackedTree) -> torch.Tensor:
    """[T] bool: sampled tokens with a predecessor and a recorded rollout logprob (what can be scored
    against the rollout; the consistency report compares exactly these)."""
    return pack.target_mask & pack.logprob_known


def trainable_mask(pack: PackedTree) -> torch.Tensor:
    """THE trainable-token rule of every trainer: a :func:`scorable_mask` token on at least one
    token-exact call (an inexact call's prompt ids may be ids the policy never produced, and a
    passthrough's logprobs are meaningless)."""
    return scorable_mask(pack) & ~inexact_token_mask(pack)
