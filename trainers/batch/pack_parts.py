"""Working with a step's packs when some hold parts of split trees (:mod:`trainers.batch.pack_split`).

A tree larger than ``max_pack_tokens`` is trained through several packs, each owning some of its
tokens (``PackedTree.owned``). What is per token (logprobs, values, losses) stays per pack; what
needs the whole tree or the whole step lives here:

* :func:`gae_over_packs` — GAE runs along every root-to-leaf path of a tree and combines shared
  tokens over all of them, so it needs the values of all of a tree's parts: it gathers them (each
  node from the pack that owns it), runs :func:`trainers.batch.advantages.tree_gae` once per tree and
  scatters advantages and returns back onto every pack (owned and context tokens alike). For packs
  of whole trees it equals :func:`trainers.ppo.targets.gae_targets` pack by pack.
* :func:`pack_units` — the runs of consecutive packs that share a split tree. A minibatch must take
  a unit whole: its packs' losses only add up to the unsplit tree's when they meet one optimiser
  step with one denominator.
* :func:`pack_stats` — counts for the metrics (``packs_split``, ``subpacks``, ``recomputed_tokens``).
* :func:`scatter_node_values` — per-node lists of a pack's trees onto its tokens.

Invariants: every function here reads packs, never changes them; values are gathered from the pack
that owns a node, so the result does not depend on which copy of a recomputed token is read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from clawgym_env.capture.tree import CallTree
from clawgym_env.errors import ConfigError
from trainers.batch.advantages import leaf_rewards, tree_gae
from trainers.batch.packing import PackedTree
from trainers.batch.tree_batch import TrainPack


def _packed(pack: PackedTree | TrainPack) -> PackedTree:
    return pack.packed if isinstance(pack, TrainPack) else pack


@dataclasses.dataclass(frozen=True)
class PackStats:
    """Bounded-pack counts of one step's packs (:func:`pack_stats`)."""

    packs: int
    """packs (forwards) of the step"""
    packs_split: int
    """trees larger than ``max_pack_tokens``, split into parts"""
    subpacks: int
    """parts those trees were split into (0 when none was split)"""
    recomputed_tokens: int
    """context tokens packed again in a later part of their tree (computed more than once)"""
    pack_tokens_max: int
    """tokens of the largest pack (at most ``max_pack_tokens``)"""

    def as_metrics(self) -> dict[str, int]:
        """The counts as metrics-row entries."""
        return dataclasses.asdict(self)


def pack_stats(packs: Sequence[PackedTree | TrainPack]) -> PackStats:
    """Counts of splitting over ``packs`` (see :class:`PackStats`)."""
    parts = [part for p in packs for part in _packed(p).parts]
    return PackStats(packs=len(packs), packs_split=sum(1 for q in parts if q.count > 1 and q.index == 0),
                     subpacks=sum(1 for q in parts if q.count > 1),
                     recomputed_tokens=sum(_packed(p).recomputed_tokens for p in packs),
                     pack_tokens_max=max((_packed(p).num_tokens for p in packs), default=0))


def pack_units(packs: Sequence[PackedTree | TrainPack]) -> list[list[int]]:
    """Indices of ``packs`` (in order) grouped into runs that share a split tree: ``[[0], [1, 2, 3], [4]]``.

    Packs come from :func:`trainers.batch.pack_split.plan_packs` in order, so a split tree's parts are in
    consecutive packs: pack ``k + 1`` joins pack ``k``'s unit when its first part continues the tree
    of pack ``k``'s last part.
    """
    units: list[list[int]] = []
    prev = None
    for k, p in enumerate(packs):
        parts = _packed(p).parts
        head = parts[0] if parts else None
        joins = (prev is not None and head is not None and head.tree is prev.tree and head.source == prev.source
                 and head.index == prev.index + 1)
        if units and joins:
            units[-1].append(k)
        else:
            units.append([k])
        prev = parts[-1] if parts else None
    return units


def _tree_key(pack_index: int, tree_index: int, pack: PackedTree) -> tuple[int, int, int]:
    part = pack.parts[tree_index]
    if part.count == 1:  # a whole tree: its own GAE, even if the same tree object is packed twice
        return (0, pack_index, tree_index)
    return (1, id(part.tree), part.source)


def gae_over_packs(packs: Sequence[PackedTree | TrainPack], values: Sequence[torch.Tensor], gamma: float,
                   lam: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per pack ``(advantages, returns)`` ([T] float32) of :func:`tree_gae` over every WHOLE tree of ``packs``.

    ``values[k]`` is pack ``k``'s [T] values (the critic's, read where a token is sampled; rewards
    from ``meta.episode_rewards()``). All parts of a split tree must be among ``packs``.
    """
    if len(values) != len(packs):
        raise ConfigError(f"{len(packs)} packs but {len(values)} value tensors")
    flat_packs = [_packed(p) for p in packs]
    trees: dict[tuple[int, int, int], CallTree] = {}
    rows: dict[tuple[int, int, int], list[list[float] | None]] = {}
    for k, (pack, v) in enumerate(zip(flat_packs, values)):
        if v.shape != (pack.num_tokens,):
            raise ConfigError(f"values of shape {tuple(v.shape)} do not fit pack {k} of {pack.num_tokens} tokens")
        flat = v.detach().double().cpu().tolist()
        offs = pack.node_offsets.tolist()
        for n, (ti, nid) in enumerate(zip(pack.node_tree.tolist(), pack.node_ids.tolist())):
            if nid not in pack.parts[ti].owned:
                continue
            key = _tree_key(k, ti, pack)
            tree = trees.setdefault(key, pack.trees[ti])
            per_node = rows.setdefault(key, [None] * len(tree.nodes))
            if per_node[nid] is not None:
                raise ConfigError(f"node {nid} of tree {tree.meta.tree_id or '?'} is owned by two packs; build "
                                  "the packs with trainers.batch.pack_split.plan_packs")
            per_node[nid] = flat[offs[n]:offs[n + 1]]
    results: dict[tuple[int, int, int], tuple[list[list[float]], list[list[float]]]] = {}
    for key, per_node in rows.items():
        tree = trees[key]
        missing = [nid for nid, r in enumerate(per_node) if r is None]
        if missing:
            raise ConfigError(f"tree {tree.meta.tree_id or '?'}: nodes {missing[:5]} are in none of the packs; pass "
                              "all packs of the step (every part of a split tree) together")
        full = [r or [] for r in per_node]
        results[key] = tree_gae(tree, full, leaf_rewards(tree, tree.meta.episode_rewards()), gamma=gamma, lam=lam)
    out = []
    for k, pack in enumerate(flat_packs):
        adv = [0.0] * pack.num_tokens
        ret = [0.0] * pack.num_tokens
        offs = pack.node_offsets.tolist()
        for n, (ti, nid) in enumerate(zip(pack.node_tree.tolist(), pack.node_ids.tolist())):
            a, r = results[_tree_key(k, ti, pack)]
            adv[offs[n]:offs[n + 1]] = a[nid]
            ret[offs[n]:offs[n + 1]] = r[nid]
        dev = pack.input_ids.device
        out.append((torch.tensor(adv, dtype=torch.float32, device=dev), torch.tensor(ret, dtype=torch.float32,
                                                                                    device=dev)))
    return out


def scatter_node_values(pack: TrainPack | PackedTree, values: Sequence[Sequence[Sequence[float]]]) -> torch.Tensor:
    """Per-tree, per-node token lists (e.g. :func:`trainers.batch.advantages.tree_gae` output, one entry per
    packed tree, every node of the whole tree) → a [T] float32 tensor aligned with the pack's tokens
    (nodes a split tree's part does not hold are skipped)."""
    packed = _packed(pack)
    if len(values) != len(packed.trees):
        raise ConfigError(f"{len(values)} value lists for a pack of {len(packed.trees)} trees")
    flat = [0.0] * packed.num_tokens
    for ti, per_node in enumerate(values):
        for nid, row in enumerate(per_node):
            if not packed.has_node(ti, nid):
                continue
            sl = packed.node_slice(ti, nid)
            if len(row) != sl.stop - sl.start:
                raise ConfigError(f"tree {ti} node {nid}: {len(row)} values for {sl.stop - sl.start} tokens")
            flat[sl] = [float(v) for v in row]
    return torch.tensor(flat, dtype=torch.float32, device=packed.input_ids.device)
