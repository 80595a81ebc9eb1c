"""Call trees: one radix tree over token ids built from an episode's (or a group's) captured calls.

Every captured call contributes one sequence, ``prompt_token_ids`` (context) followed by
``output_token_ids`` (sampled, with ``output_logprobs``). The tree stores each distinct token prefix
exactly once, so context shared between calls (the next turn's prompt repeats the last one and its
output; a subagent repeats the system prompt; a GRPO group repeats the task) is never duplicated.

Invariants of a :class:`CallTree` built here (checked by :meth:`CallTree.validate`):
  * ``nodes[i].id == i``; a node's parent has a smaller id (parents come before children: the ids
    are a depth-first preorder); ``roots`` are the nodes whose ``parent`` is None, in id order.
  * every segment is non-empty and ``len(tokens) == len(sampled) == len(logprobs)``;
    ``logprobs[j] is None`` exactly when ``sampled[j]`` is False.
  * siblings (and roots) start with different tokens: the tree is a compressed trie, so the number
    of tree tokens equals :func:`expected_tree_tokens` of the calls' sequences.
  * for every call ``c`` with a non-empty sequence, ``sequence(call_leaf[c])[0]`` is exactly that
    call's prompt + output ids, and ``c`` is in ``calls`` of every node on that path and no other.
  * a token sampled by any call at a position is ``sampled=True`` there with the logprob of the first
    call that sampled it, even where later calls received it as context; a later call that sampled
    the same token with a different logprob counts as a conflict in :meth:`CallTree.stats`.
  * ``node.depth`` is the number of tokens on the path before the node; ``meta.prompt_lengths[c]``
    is call ``c``'s prompt length, so call ``c`` sampled token ``j`` of a node on its path exactly
    when ``node.depth + j >= prompt_lengths[c]`` (which calls *own* a sampled token).

``meta`` is a :class:`~clawgym_env.capture.tree_meta.TreeMeta` (episodes, rewards, statuses,
versions, harness, inexact calls, prompt lengths). This module imports neither torch nor a tokenizer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Sequence

from clawgym_env.capture.records import CallRecord, EpisodeRecord
from clawgym_env.capture.tree_meta import EpisodeSummary, GroupInfo, TreeMeta
from clawgym_env.errors import ClawGymError
from clawgym_env.jsontypes import JSONObject

LOGPROB_TOL = 1e-6  # two samples of one token whose logprobs differ by more are a conflict


@dataclasses.dataclass
class TreeNode:
    """One segment of the tree; see the module docstring for the invariants."""

    id: int
    parent: int | None
    tokens: list[int]
    sampled: list[bool]
    logprobs: list[float | None]
    calls: list[int]
    children: list[int]
    depth: int = 0


@dataclasses.dataclass
class TreeStats:
    """Size and shape of a tree; ``compression_ratio == captured_tokens / tree_tokens``.

    ``retries``: calls identical (prompt and output ids) to an earlier call of the same episode;
    ``duplicates``: identical to a call of another episode of the group; both add no tree tokens.
    ``unique_calls == num_calls - retries - duplicates - empty_calls``.
    """

    captured_tokens: int
    tree_tokens: int
    compression_ratio: float
    num_calls: int
    unique_calls: int
    retries: int
    duplicates: int
    empty_calls: int
    nodes: int
    roots: int
    leaves: int
    branches: int
    max_depth_tokens: int
    max_depth_nodes: int
    sampled_tokens: int
    logprob_conflicts: int
    token_exact_share: float
    episodes: int

    def as_dict(self) -> JSONObject:
        """The statistics as a JSON-ready mapping."""
        return dataclasses.asdict(self)


def expected_tree_tokens(sequences: Iterable[Sequence[int]]) -> int:
    """Size of the minimal trie over ``sequences``: the number of distinct non-empty prefixes.

    Computed independently of the builder: in lexicographic order, each sequence adds exactly the
    prefixes longer than its longest common prefix with its predecessor.
    """
    total, prev = 0, None
    for seq in sorted({tuple(s) for s in sequences}):
        lcp = 0
        if prev is not None:
            n = min(len(prev), len(seq))
            while lcp < n and prev[lcp] == seq[lcp]:
                lcp += 1
        total += len(seq) - lcp
        prev = seq
    return total


class _Seg:
    """A mutable node while building (ids are assigned once, in preorder, at the end)."""

    __slots__ = ("tokens", "sampled", "logprobs", "calls", "ends", "children", "index")

    def __init__(self, tokens: list[int], sampled: list[bool], logprobs: list[float | None]) -> None:
        self.tokens: list[int] = tokens
        self.sampled: list[bool] = sampled
        self.logprobs: list[float | None] = logprobs
        self.calls: list[int] = []
        self.ends: list[int] = []  # calls whose sequence ends here
        self.children: list[_Seg] = []
        self.index: dict[int, _Seg] = {}  # first token -> child

    def split(self, k: int) -> None:
        """Keep ``tokens[:k]`` here and move the rest (with the children) into one new child."""
        tail = _Seg(self.tokens[k:], self.sampled[k:], self.logprobs[k:])
        tail.calls, tail.ends, self.ends = list(self.calls), self.ends, []
        tail.children, tail.index = self.children, self.index
        del self.tokens[k:], self.sampled[k:], self.logprobs[k:]
        self.children, self.index = [tail], {tail.tokens[0]: tail}


def _common(a: list[int], b: list[int], start: int) -> int:
    """Length of the common prefix of ``a`` and ``b[start:]``."""
    n = min(len(a), len(b) - start)
    if a[:n] == b[start:start + n]:
        return n
    k = 0
    while a[k] == b[start + k]:
        k += 1
    return k


class _Builder:
    def __init__(self) -> None:
        self.top = _Seg([], [], [])  # virtual parent of the roots
        self.conflicts = 0

    def insert(self, call: int, tokens: list[int], n_prompt: int, out_logprobs: list[float]) -> None:
        node, pos = self.top, 0
        while pos < len(tokens):
            child = node.index.get(tokens[pos])
            if child is None:
                n = len(tokens) - pos
                sampled = [pos + j >= n_prompt for j in range(n)]
                lps = [out_logprobs[pos + j - n_prompt] if s else None for j, s in enumerate(sampled)]
                child = _Seg(tokens[pos:], sampled, lps)
                node.children.append(child)
                node.index[tokens[pos]] = child
                k = n
            else:
                k = _common(child.tokens, tokens, pos)
                if k < len(child.tokens):
                    child.split(k)
                for j in range(max(0, n_prompt - pos), k):  # only this call's sampled tokens can change flags
                    lp, first_lp = out_logprobs[pos + j - n_prompt], child.logprobs[j]
                    if not child.sampled[j] or first_lp is None:  # sampled flags and logprobs go together
                        child.sampled[j], child.logprobs[j] = True, lp
                    elif abs(first_lp - lp) > LOGPROB_TOL:
                        self.conflicts += 1
            child.calls.append(call)
            node, pos = child, pos + k
        if node is not self.top:
            node.ends.append(call)

    def finish(self) -> tuple[list[TreeNode], list[int], dict[int, int]]:
        nodes: list[TreeNode] = []
        call_leaf: dict[int, int] = {}
        stack: list[tuple[_Seg, int | None, int]] = [(s, None, 0) for s in reversed(self.top.children)]
        while stack:
            seg, parent, depth = stack.pop()
            nid = len(nodes)
            call_leaf.update((c, nid) for c in seg.ends)
            nodes.append(TreeNode(nid, parent, seg.tokens, seg.sampled, seg.logprobs, seg.calls, [], depth))
            if parent is not None:
                nodes[parent].children.append(nid)
            stack.extend((c, nid, depth + len(seg.tokens)) for c in reversed(seg.children))
        roots = [n.id for n in nodes if n.parent is None]
        return nodes, roots, dict(sorted(call_leaf.items()))


@dataclasses.dataclass
class CallTree:
    """A radix tree over the token ids of captured calls (see the module docstring)."""

    nodes: list[TreeNode]
    roots: list[int]
    meta: TreeMeta
    call_leaf: dict[int, int]

    # ---- navigation -------------------------------------------------------------------------------
    def leaves(self) -> list[int]:
        """Ids of the nodes without children, in id order."""
        return [n.id for n in self.nodes if not n.children]

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root down to ``node_id`` (inclusive)."""
        out = []
        cur: int | None = node_id
        while cur is not None:
            out.append(cur)
            cur = self.nodes[cur].parent
        return out[::-1]

    def sequence(self, node_id: int) -> tuple[list[int], list[bool], list[float | None]]:
        """Tokens, sampled flags and logprobs along the path from the root to the end of ``node_id``."""
        toks: list[int] = []
        flags: list[bool] = []
        lps: list[float | None] = []
        for nid in self.path(node_id):
            n = self.nodes[nid]
            toks += n.tokens
            flags += n.sampled
            lps += n.logprobs
        return toks, flags, lps

    def call_sequence(self, call: int) -> tuple[list[int], list[bool], list[float | None]]:
        """The sequence of call ``call`` (its prompt + output, with the tree's merged flags)."""
        return self.sequence(self.call_leaf[call])

    # ---- building ---------------------------------------------------------------------------------
    @classmethod
    def from_calls(cls, calls: list[CallRecord], meta: TreeMeta | None = None) -> CallTree:
        """Build the tree of ``calls``; call ``i`` of the tree is ``calls[i]``.

        The fields set in ``meta`` override the ones derived from the calls (episode ids, policy, versions).
        """
        b = _Builder()
        seen: dict[tuple[tuple[int, ...], tuple[int, ...]], str] = {}  # sequence -> first episode id
        retries = duplicates = empty = 0
        for i, c in enumerate(calls):
            if len(c.output_logprobs) != len(c.output_token_ids):
                raise ClawGymError(f"call {i} (episode {c.episode_id}, call_index {c.call_index}) has "
                                   f"{len(c.output_token_ids)} output ids but {len(c.output_logprobs)} "
                                   "logprobs; the record is corrupt, recapture it")
            key = (tuple(c.prompt_token_ids), tuple(c.output_token_ids))
            if not key[0] and not key[1]:
                empty += 1
            elif key in seen:
                if seen[key] == c.episode_id:
                    retries += 1
                else:
                    duplicates += 1
            seen.setdefault(key, c.episode_id)
            b.insert(i, list(c.prompt_token_ids) + list(c.output_token_ids), len(c.prompt_token_ids),
                     list(c.output_logprobs))
        nodes, roots, call_leaf = b.finish()
        exact = [c.token_exact for c in calls]
        versions = sorted({c.policy_version for c in calls})
        episode_ids = list(dict.fromkeys(c.episode_id for c in calls))
        derived: JSONObject = {
            "tree_id": _tree_id(episode_ids, calls),
            "episode_ids": episode_ids,
            "policy": next((c.policy_name for c in calls if c.policy_name), None),
            "policy_version": versions[0] if len(versions) == 1 else None,
            "policy_versions": versions,
            "num_calls": len(calls),
            "token_exact_share": (sum(exact) / len(exact)) if exact else 1.0,
            "inexact_calls": [i for i, e in enumerate(exact) if not e],
            "prompt_lengths": [len(c.prompt_token_ids) for c in calls],
            "call_origin": [[c.episode_id, c.call_index] for c in calls],
            "call_kinds": [c.kind for c in calls],
            "discarded_calls": [i for i, c in enumerate(calls) if c.discarded_by is not None],
            "build": {"retries": retries, "duplicates": duplicates, "empty_calls": empty,
                      "logprob_conflicts": b.conflicts},
        }
        if meta is not None:
            derived.update(meta.model_dump(exclude_unset=True))
        return cls(nodes, roots, TreeMeta.model_validate(derived), call_leaf)

    @classmethod
    def from_episodes(cls, episodes: list[tuple[EpisodeRecord, list[CallRecord]]]) -> CallTree:
        """One tree over a GRPO group: episodes of one (task, harness), calls numbered in episode order.

        ``meta.episodes[e].calls`` lists the tree call indices of episode ``e``;
        ``meta.call_episode[i]`` is the episode position of call ``i``.
        """
        if not episodes:
            raise ClawGymError("from_episodes needs at least one (EpisodeRecord, calls) pair")
        keys = {(rec.suite, rec.task_id, rec.harness) for rec, _ in episodes}
        if len(keys) > 1:
            raise ClawGymError("a call tree groups episodes of one (suite, task, harness), got "
                               f"{sorted(map(str, keys))}; "
                               "build one tree per group")
        flat: list[CallRecord] = []
        summary: list[EpisodeSummary] = []
        call_episode: list[int] = []
        for e, (rec, calls) in enumerate(episodes):
            start = len(flat)
            flat.extend(calls)
            call_episode.extend([e] * len(calls))
            summary.append(EpisodeSummary(episode_id=rec.episode_id, reward=rec.reward, status=rec.status,
                                          num_calls=len(calls), policy_version=rec.policy_version,
                                          calls=list(range(start, len(flat)))))
        first = episodes[0][0]
        rewards = [rec.reward for rec, _ in episodes]
        statuses = {str(rec.status) for rec, _ in episodes}
        versions = sorted({rec.policy_version for rec, _ in episodes} | {c.policy_version for c in flat})
        ids = [rec.episode_id for rec, _ in episodes]
        meta = TreeMeta(
            task_id=first.task_id, suite=first.suite, harness=first.harness, policy=first.policy,
            episode_ids=ids, tree_id=_tree_id(ids, flat),
            policy_version=versions[0] if len(versions) == 1 else None, policy_versions=versions,
            reward=sum(rewards) / len(rewards),
            status=statuses.pop() if len(statuses) == 1 else "mixed",
            episodes=summary, call_episode=call_episode,
            group=GroupInfo(size=len(episodes), key=f"{first.suite or '-'}/{first.task_id}@{first.harness}",
                            rewards=rewards))
        return cls.from_calls(flat, meta)

    # ---- checks and statistics --------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`ClawGymError` naming the first broken invariant (see the module docstring)."""
        def bad(msg: str) -> ClawGymError:
            return ClawGymError(f"malformed call tree {self.meta.tree_id or '?'}: {msg}")

        for i, n in enumerate(self.nodes):
            if n.id != i:
                raise bad(f"node at index {i} has id {n.id}")
            if not n.tokens or not (len(n.tokens) == len(n.sampled) == len(n.logprobs)):
                raise bad(f"node {i} has an empty segment or per-token lists of unequal length")
            if any((lp is None) == s for s, lp in zip(n.sampled, n.logprobs)):
                raise bad(f"node {i} has a sampled token without a logprob or a context token with one")
            if n.parent is not None and not (0 <= n.parent < i and i in self.nodes[n.parent].children):
                raise bad(f"node {i} has parent {n.parent}, which is not an earlier node listing it")
            expect = 0 if n.parent is None else self.nodes[n.parent].depth + len(self.nodes[n.parent].tokens)
            if n.depth != expect:
                raise bad(f"node {i} has depth {n.depth}, expected {expect}")
            firsts = [self.nodes[c].tokens[0] for c in n.children]
            if len(set(firsts)) != len(firsts) or any(self.nodes[c].parent != i for c in n.children):
                raise bad(f"children of node {i} share a first token or name another parent")
        if self.roots != [n.id for n in self.nodes if n.parent is None]:
            raise bad("roots are not the parentless nodes in id order")
        if len({self.nodes[r].tokens[0] for r in self.roots}) != len(self.roots):
            raise bad("two roots start with the same token")
        for c, leaf in self.call_leaf.items():
            if not 0 <= leaf < len(self.nodes) or any(c not in self.nodes[p].calls for p in self.path(leaf)):
                raise bad(f"call {c} does not pass through every node on the path to its leaf {leaf}")

    def stats(self) -> TreeStats:
        """Size and shape of the tree (:class:`TreeStats`), with the build counts of ``meta``."""
        build = self.meta.build
        num_calls = self.meta.calls_in(len(self.call_leaf))
        retries, empty, dups = build.retries, build.empty_calls, build.duplicates
        captured = sum(self.nodes[leaf].depth + len(self.nodes[leaf].tokens) for leaf in self.call_leaf.values())
        tree_tokens = sum(len(n.tokens) for n in self.nodes)
        node_depth = [0] * len(self.nodes)
        for n in self.nodes:  # parents come first
            node_depth[n.id] = 1 if n.parent is None else node_depth[n.parent] + 1
        return TreeStats(
            captured_tokens=captured, tree_tokens=tree_tokens,
            compression_ratio=(captured / tree_tokens) if tree_tokens else 1.0,
            num_calls=num_calls, unique_calls=num_calls - retries - dups - empty, retries=retries,
            duplicates=dups, empty_calls=empty,
            nodes=len(self.nodes), roots=len(self.roots), leaves=len(self.leaves()),
            branches=sum(len(n.children) >= 2 for n in self.nodes),
            max_depth_tokens=max((n.depth + len(n.tokens) for n in self.nodes), default=0),
            max_depth_nodes=max(node_depth, default=0),
            sampled_tokens=sum(sum(n.sampled) for n in self.nodes),
            logprob_conflicts=build.logprob_conflicts,
            token_exact_share=float(self.meta.token_exact_share),
            episodes=len(self.meta.episode_ids))


def _tree_id(episode_ids: list[str], calls: list[CallRecord]) -> str:
    """A deterministic id from the episodes and the calls' token counts."""
    h = hashlib.sha1(json.dumps([episode_ids, [[len(c.prompt_token_ids), len(c.output_token_ids)]
                                              for c in calls]]).encode())
    return "tree-" + h.hexdigest()[:16]
