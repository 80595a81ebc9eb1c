"""Lossless serialisation of :class:`~clawgym_env.capture.tree.CallTree`: JSONL, flat records, parquet.

Two layouts, both readable without this package.

**Tree JSONL** (:func:`to_jsonl` / :func:`read_jsonl`): one JSON object per line, one tree per line::

    {"format": "clawgym.call_tree", "version": 1,
     "meta": {...},                      # see below
     "roots": [0, ...],                  # parentless node ids, ascending
     "call_leaf": [[call, node], ...],   # the node where call `call`'s sequence ends
     "nodes": [{"id", "parent", "depth", "tokens", "sampled", "logprobs", "calls", "children"}, ...]}

**Node records** (:func:`to_records`, :func:`write_records_jsonl`, :func:`write_parquet`): one flat row
per node, loadable with ``datasets.load_dataset("json" | "parquet", data_files=PATH)``. Columns:

=================  ==================  ===========================================================
column             type                meaning
=================  ==================  ===========================================================
tree_id            string              the tree this node belongs to (rows of a tree are contiguous)
node_id            int64               index of the node in its tree; parents have smaller ids
parent_id          int64 or null       null for a root
depth              int64               tokens on the path before this node
tokens             list<int64>         the node's token ids (non-empty)
sampled            list<bool>          per token: sampled by the policy (True) or context (False)
logprobs           list<double>        per token: rollout logprob of a sampled token, 0.0 for context
calls              list<int64>         tree call indices whose prompt+output passes through the node
children           list<int64>         child node ids in order
leaf_of            list<int64>         tree call indices whose sequence ends at this node
roots              list<int64>         the tree's root ids (same on every row of a tree)
task_id, suite,    string or null      from the tree's meta
harness, policy,
status
reward             double or null      the episode reward (mean over a group's episodes)
policy_version     int64 or null       the policy version when all calls share one
num_calls          int64               calls in the tree (retries included)
meta_json          string              the tree's whole meta (TreeMeta) as JSON (lossless)
=================  ==================  ===========================================================

Context logprobs are written as 0.0, not null, so the columns hold no nulls (mask with ``sampled``;
:func:`from_records` restores None). This also keeps pyarrow's JSON reader, which mis-reads lists
whose first entries are null followed by numbers, on its exact path.

A call's training sequence is the concatenation of ``tokens`` (and ``sampled``/``logprobs``) along
``parent_id`` links from the root to its leaf node. ``meta`` (a
:class:`~clawgym_env.capture.tree_meta.TreeMeta`, written as a mapping of its fields) holds
``tree_id``, ``episode_ids``, ``policy``, ``policy_version(s)``, ``num_calls``, ``token_exact_share``,
``inexact_calls``, ``prompt_lengths`` (per tree call), ``call_origin`` (``[episode_id, call_index]``
per tree call), ``build`` (retries, cross-episode duplicates, empty calls, logprob conflicts) and,
for trees built from episodes, ``task_id``, ``suite``, ``harness``, ``reward``, ``status``,
``episodes`` (per-episode reward/status/calls), ``call_episode`` and ``group``. Files written
before ``TreeMeta`` (a plain mapping with some of
these keys missing) still read: every field has a default.

Invariant: ``read_jsonl(to_jsonl(ts)) == ts`` and ``from_records(to_records(t)) == [t]`` (also after a
parquet or ``datasets`` round trip); readers validate every tree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from clawgym_env.capture.tree import CallTree, TreeNode
from clawgym_env.capture.tree_meta import TreeMeta
from clawgym_env.errors import ClawGymError
from clawgym_env.jsontypes import JSONObject

if TYPE_CHECKING:
    import pyarrow as pa

FORMAT = "clawgym.call_tree"
VERSION = 1
META_COLUMNS = ("task_id", "suite", "harness", "policy", "status", "reward", "policy_version", "num_calls")
_NODE_KEYS = ("id", "parent", "depth", "tokens", "sampled", "logprobs", "calls", "children")


def tree_to_dict(tree: CallTree) -> JSONObject:
    """One tree JSONL object (layout in the module docstring)."""
    return {"format": FORMAT, "version": VERSION, "meta": tree.meta.model_dump(mode="json"),
            "roots": list(tree.roots),
            "call_leaf": [[c, n] for c, n in sorted(tree.call_leaf.items())],
            "nodes": [{k: getattr(n, k) for k in _NODE_KEYS} for n in tree.nodes]}


def tree_from_dict(obj: JSONObject) -> CallTree:
    """The tree of one tree JSONL object, validated (a plain-mapping ``meta`` of an older file reads too)."""
    if obj.get("format") != FORMAT:
        raise ClawGymError(f"not a call tree (format {obj.get('format')!r}, expected {FORMAT!r})")
    if obj.get("version") != VERSION:
        raise ClawGymError(f"call tree version {obj.get('version')} is not supported (this reader: {VERSION})")
    nodes = [TreeNode(**{k: n[k] for k in _NODE_KEYS}) for n in obj["nodes"]]
    tree = CallTree(nodes, list(obj["roots"]), TreeMeta.model_validate(obj["meta"]),
                    {int(c): int(n) for c, n in obj["call_leaf"]})
    tree.validate()
    return tree


def to_jsonl(trees: Iterable[CallTree], path: str | Path) -> Path:
    """Write one tree per line (overwrites ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for t in trees:
            fh.write(json.dumps(tree_to_dict(t), separators=(",", ":")) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[CallTree]:
    """Every tree of a tree JSONL file, validated; a bad line is an error naming its line number."""
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(tree_from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
                raise ClawGymError(f"{path}:{lineno}: not a call tree line ({exc})") from exc
    return out


def to_records(tree: CallTree) -> list[JSONObject]:
    """One flat row per node (columns in the module docstring)."""
    tid = str(tree.meta.tree_id or "tree")
    leaf_of: dict[int, list[int]] = {}
    for c, n in sorted(tree.call_leaf.items()):
        leaf_of.setdefault(n, []).append(c)
    common = {k: getattr(tree.meta, k) for k in META_COLUMNS}
    common["num_calls"] = tree.meta.calls_in(len(tree.call_leaf))
    meta_json = tree.meta.model_dump_json()
    return [{"tree_id": tid, "node_id": n.id, "parent_id": n.parent, "depth": n.depth, "tokens": n.tokens,
             "sampled": n.sampled, "logprobs": [lp if s else 0.0 for s, lp in zip(n.sampled, n.logprobs)],
             "calls": n.calls, "children": n.children,
             "leaf_of": leaf_of.get(n.id, []), "roots": list(tree.roots), **common, "meta_json": meta_json}
            for n in tree.nodes]


def from_records(rows: Iterable[JSONObject]) -> list[CallTree]:
    """Rebuild trees from node rows (from :func:`to_records`, a parquet file or a ``datasets`` table)."""
    by_tree: dict[str, list[JSONObject]] = {}
    for r in rows:
        by_tree.setdefault(r["tree_id"], []).append(r)
    out = []
    for tid, rs in by_tree.items():
        rs.sort(key=lambda r: r["node_id"])
        nodes, call_leaf = [], {}
        for r in rs:
            nodes.append(TreeNode(int(r["node_id"]), None if r["parent_id"] is None else int(r["parent_id"]),
                                  [int(t) for t in r["tokens"]], [bool(s) for s in r["sampled"]],
                                  [float(lp) if s else None for s, lp in zip(r["sampled"], r["logprobs"])],
                                  [int(c) for c in r["calls"]], [int(c) for c in r["children"]], int(r["depth"])))
            call_leaf.update({int(c): int(r["node_id"]) for c in r["leaf_of"]})
        meta = TreeMeta.model_validate_json(rs[0]["meta_json"])
        tree = CallTree(nodes, [int(x) for x in rs[0]["roots"]], meta, dict(sorted(call_leaf.items())))
        if (tree.meta.tree_id or tid) != tid:
            raise ClawGymError(f"rows of tree {tid} carry meta for tree {tree.meta.tree_id}")
        tree.validate()
        out.append(tree)
    return out


def write_records_jsonl(trees: Iterable[CallTree], path: str | Path) -> Path:
    """Node records as JSON lines (``load_dataset("json", data_files=path)``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for t in trees:
            for row in to_records(t):
                fh.write(json.dumps(row, separators=(",", ":")) + "\n")
    return path


def _pyarrow() -> tuple[ModuleType, ModuleType]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ClawGymError("parquet needs pyarrow: pip install pyarrow (or the dev extras)") from exc
    return pa, pq


def arrow_schema() -> pa.Schema:
    """The node-record schema as a ``pyarrow.Schema``."""
    pa, _ = _pyarrow()
    ints = pa.list_(pa.int64())
    return pa.schema([
        ("tree_id", pa.string()), ("node_id", pa.int64()), ("parent_id", pa.int64()), ("depth", pa.int64()),
        ("tokens", ints), ("sampled", pa.list_(pa.bool_())), ("logprobs", pa.list_(pa.float64())),
        ("calls", ints), ("children", ints), ("leaf_of", ints), ("roots", ints),
        ("task_id", pa.string()), ("suite", pa.string()), ("harness", pa.string()), ("policy", pa.string()),
        ("status", pa.string()), ("reward", pa.float64()), ("policy_version", pa.int64()),
        ("num_calls", pa.int64()), ("meta_json", pa.string())])


def write_parquet(trees: Iterable[CallTree], path: str | Path) -> Path:
    """Node records as one parquet file (``load_dataset("parquet", data_files=path)``)."""
    pa, pq = _pyarrow()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r for t in trees for r in to_records(t)]
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), path)
    return path


def read_parquet(path: str | Path) -> list[CallTree]:
    """Trees from a node-record parquet file (:func:`write_parquet`)."""
    _, pq = _pyarrow()
    return from_records(pq.read_table(path).to_pylist())
