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

Bounded packs (:mod:`trainers.batch.pack_split`). A pack holds whole trees or
:class:`~trainers.batch.pack_split.TreePart` s of trees split to fit ``max_tokens``; ``parts[k]`` says which
(``trees[k]`` is always the whole tree, ``node_ids`` are its node ids, and only the part's nodes are packed:
:meth:`PackedTree.has_node`).
``owned[i]`` is True where the pack owns token ``i``; a token it does not own is context, recomputed
because the paths through it continue in this pack, and trained in the pack that owns it. Every
per-token result a trainer or report counts (:func:`scorable_mask`, hence :func:`trainable_mask`)
is restricted to owned tokens, so each token of a split tree is counted exactly once over its packs.

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
from clawgym_env.errors import ConfigError
from trainers.batch.pack_split import TreePart, tree_tokens, whole_part

__all__ = ["MASK_FORMS", "PackedTree", "TreePart", "bin_by_tokens", "inexact_nodes", "inexact_token_mask",
           "pack_batch", "pack_trees", "scorable_mask", "trainable_flags", "trainable_mask", "tree_tokens"]

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
    owned: torch.Tensor              # [T] bool, tokens this pack trains on (False: context of a split tree)
    parts: list[TreePart] = dataclasses.field(default_factory=list, repr=False)  # per packed tree
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
    def recomputed_tokens(self) -> int:
        """Tokens packed only as context for a split tree's paths (owned by another pack)."""
        return self.num_tokens - int(self.owned.sum())

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
        raise ConfigError(f"unknown mask form {form!r}; use one of {MASK_FORMS}")

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

    def has_node(self, tree_index: int, node_id: int) -> bool:
        """True when node ``node_id`` of packed tree ``tree_index`` is in this pack (a part may hold only some)."""
        return self._packed_node(tree_index, node_id, required=False) >= 0

    def _packed_node(self, tree_index: int, node_id: int, required: bool = True) -> int:
        if self._node_index is None:
            self._node_index = {(t, n): k for k, (t, n) in enumerate(zip(self.node_tree.tolist(),
                                                                         self.node_ids.tolist()))}
        k = self._node_index.get((int(tree_index), int(node_id)))
        if k is None and required:
            raise ConfigError(f"node {node_id} of packed tree {tree_index} is not in this pack")
        return -1 if k is None else k

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
        raise ConfigError(f"tree has {len(tree.nodes)} nodes but only {len(order)} are reachable from its roots; "
                          "rebuild it (CallTree.validate names the broken invariant)")
    return order


def pack_trees(trees: CallTree | TreePart | Sequence[CallTree | TreePart],
               device: str | torch.device | None = None) -> PackedTree:
    """Pack one tree, or several (e.g. a GRPO group), or parts of split trees, into one :class:`PackedTree`.

    Trees never attend to each other; each keeps its own positions starting at 0. A
    :class:`~trainers.batch.pack_split.TreePart` packs only its nodes (whole root-to-leaf paths) and owns
    only its ``owned`` nodes' tokens; a plain tree is packed whole and owns every token.
    """
    items = [trees] if isinstance(trees, (CallTree, TreePart)) else list(trees)
    if not items:
        raise ConfigError("pack_trees needs at least one tree")
    parts = [it if isinstance(it, TreePart) else whole_part(it) for it in items]
    ids: list[int] = []
    pos: list[int] = []
    pred: list[int] = []
    sampled: list[bool] = []
    lps: list[float] = []
    known: list[bool] = []
    owned: list[bool] = []
    token_node: list[int] = []
    offsets: list[int] = []
    parents: list[int] = []
    node_tree: list[int] = []
    node_ids: list[int] = []
    leaf_nodes: list[int] = []
    path_leaves: list[tuple[int, int]] = []
    ranges: list[tuple[int, int]] = []
    for ti, part in enumerate(parts):
        tree = part.tree
        start = len(ids)
        local: dict[int, int] = {}  # tree node id -> packed node index
        depth: dict[int, int] = {}
        for nid in _preorder(tree):
            if nid not in part.nodes:
                continue
            node = tree.nodes[nid]
            if not node.tokens or not (len(node.tokens) == len(node.sampled) == len(node.logprobs)):
                raise ConfigError(f"node {nid} of tree {ti} has an empty segment or per-token lists of unequal "
                                  "length; the tree is malformed")
            p = node.parent
            if p is not None and p not in local:
                raise ConfigError(f"part {part.index} of tree {ti} holds node {nid} but not its parent {p}; a part "
                                  "must hold whole root-to-leaf paths (trainers.batch.pack_split.split_tree)")
            pk = local[p] if p is not None else -1
            d = depth[p] + len(tree.nodes[p].tokens) if p is not None else 0
            k = len(offsets)
            local[nid], depth[nid] = k, d
            offsets.append(len(ids))
            parents.append(pk)
            node_tree.append(ti)
            node_ids.append(nid)
            first_pred = offsets[pk + 1] - 1 if pk >= 0 else -1  # parent's last token (parent is complete)
            mine = nid in part.owned
            for j, tok in enumerate(node.tokens):
                pred.append(first_pred if j == 0 else len(ids) - 1)
                ids.append(int(tok))
                pos.append(d + j)
                sampled.append(bool(node.sampled[j]))
                lp = node.logprobs[j]
                known.append(bool(node.sampled[j]) and lp is not None)
                lps.append(float(lp) if lp is not None and known[-1] else 0.0)
                owned.append(mine)
                token_node.append(k)
            if not any(c in part.nodes for c in node.children):
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
        paths=paths, path_leaves=path_leaves, tree_ranges=ranges,
        owned=torch.tensor(owned, dtype=torch.bool, device=device), parts=parts, trees=[p.tree for p in parts])


def pack_batch(trees: Sequence[CallTree], max_tokens: int | None = None,
               device: str | torch.device | None = None) -> list[PackedTree]:
    """Pack whole ``trees`` into packs of at most ``max_tokens`` tree tokens each (:func:`bin_by_tokens`),
    order kept; a tree larger than ``max_tokens`` gets a pack of its own, unsplit (a scoring pass such as
    the consistency report reads each tree whole). Training packs come from
    :func:`trainers.batch.pack_split.plan_packs`, which splits such a tree. Returns ``[]`` for no trees.
    """
    trees = list(trees)
    return [pack_trees([trees[k] for k in b], device) for b in bin_by_tokens(trees, max_tokens)]


def bin_by_tokens(trees: Sequence[CallTree], max_tokens: int | None) -> list[list[int]]:
    """Indices of ``trees`` in consecutive bins of at most ``max_tokens`` tree tokens each, order kept.

    Whole trees only: a tree larger than ``max_tokens`` gets a bin of its own (for placing whole
    trees; training packs come from :func:`trainers.batch.pack_split.plan_packs`, which splits such a
    tree). Without ``max_tokens`` every tree is one bin.
    """
    if max_tokens is None:
        return [[k] for k in range(len(trees))]
    if max_tokens <= 0:
        raise ConfigError(f"max_tokens must be positive, got {max_tokens}")
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
            if pack.has_node(ti, nid):
                bad[pack.node_slice(ti, nid)] = True
    return bad


def scorable_mask(pack: PackedTree) -> torch.Tensor:
    """[T] bool: sampled tokens with a predecessor and a recorded rollout logprob that the pack owns
    (what can be scored against the rollout; the consistency report compares exactly these)."""
    return pack.target_mask & pack.logprob_known & pack.owned


def trainable_flags(tree: CallTree) -> list[list[bool]]:
    """Per node, per token of the WHOLE ``tree``: the :func:`trainable_mask` rule (ownership aside), without
    packing it — what a split tree's parts need to count an episode's trainable tokens over all parts.
    A sampled token with a recorded logprob and a predecessor (not a root's first token), not only on
    inexact calls. :func:`trainers.batch.tree_batch.build_pack` checks it against the packed rule."""
    bad = inexact_nodes(tree)
    return [[node.id not in bad and bool(s) and lp is not None and (node.parent is not None or j > 0)
             for j, (s, lp) in enumerate(zip(node.sampled, node.logprobs))] for node in tree.nodes]


def trainable_mask(pack: PackedTree) -> torch.Tensor:
    """THE trainable-token rule of every trainer: a :func:`scorable_mask` token on at least one
    token-exact call (an inexact call's prompt ids may be ids the policy never produced, and a
    passthrough's logprobs are meaningless)."""
    return scorable_mask(pack) & ~inexact_token_mask(pack)
