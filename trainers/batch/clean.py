"""Tree cleaning: which captured calls of an episode a trainer trains on (run before any advantage).

A harness makes more calls than its agent's own turns, and some of its calls are thrown away. Every
:class:`~clawgym_env.capture.records.CallRecord` says what it was (``kind``: ``main``, ``side``, ``subagent``,
``compaction``; ``discarded_by``: a later call retried it (re-sent its exact prompt, or what the harness's adapter
declares a retry, e.g. OpenClaw's interrupted-turn note), so the harness discarded its answer; both set at the
end of the episode by :mod:`clawgym_env.capture.call_kinds`). This pass, configured by
:class:`CleanConfig` (the ``clean:`` block of the GRPO, PPO and SFT configs), keeps per episode:

1. the calls whose kind is in ``train_kinds`` (default: the main agent only, as the paper trains);
2. minus the dead retries (``discarded_by`` set) when ``drop_discarded``;

and, per rollout, drops a whole rollout whose cleaned tree has more than ``max_leaves`` leaves (runaway
branching): it leaves its group before the advantages, so the group's baseline is over the rollouts that remain
(:func:`trainers.batch.tree_batch.make_groups`), and a group left with fewer than two rollouts is skipped
(``groups_skipped_max_leaves``).

Invariants:
  * every removed call is counted once, under the first reason that applies, in this order: its kind, then
    dead retry; a dropped rollout is counted once (``dropped_rollouts_max_leaves``) with its cleaned calls and
    sampled tokens; nothing is removed silently;
  * the token counts are of *training* tokens, not of records: a sampled token (a position in the episode's
    own call tree) is removed when every call of the episode that sampled it was removed; it is attributed to
    the reason of the earliest such call. A removed call whose answer a kept call sampled too (an identical
    retry) removes no token. ``kept_tokens`` is the sampled-token count of the cleaned tree;
  * removing a call removes its sampled tokens from training even where a kept call later received them as
    context: the trees are built from the kept calls only, so those tokens are context there, and the "own
    tokens" rule (:func:`trainers.batch.advantages.episode_own_tokens`) never makes a received token an action;
  * records written before calls were classified (every call ``main``, none discarded) are kept whole: with
    ``max_leaves`` unset or not exceeded, the cleaned episodes, their trees and the packs are exactly those of
    an uncleaned run;
  * cleaning is a pure function of the records: the records are not modified, calls keep their order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from clawgym_env.capture.records import CALL_KINDS, CallRecord, EpisodeRecord
from clawgym_env.capture.tree import CallTree
from clawgym_env.errors import ConfigError

__all__ = ["CleanConfig", "CleanStats", "EpisodeClean", "clean_episode", "clean_rollouts"]

DISCARDED = "discarded"
"""The reason of a call removed as a dead retry (the other reasons are the kinds)."""


@dataclasses.dataclass
class CleanConfig:
    """Which calls of an episode are trained (``clean.*``); see :mod:`trainers.batch.clean`."""

    train_kinds: tuple[str, ...] = ("main",)
    """call kinds trained on (``main``, ``side``, ``subagent``, ``compaction``); the paper trains the main agent
    only. Calls of other kinds are removed before the trees are built (their sampled tokens are never actions,
    also where a kept call received them as context); counted per kind in ``clean/<kind>_calls|tokens``"""
    drop_discarded: bool = True
    """remove dead retries: calls a later call of the episode retried (``discarded_by``: the harness discarded
    the answer); counted in ``clean/discarded_calls|tokens``"""
    max_leaves: int | None = 64
    """a rollout whose cleaned call tree has more leaves than this (runaway branching) is dropped from its group
    before the advantages (counted in ``clean/dropped_rollouts_max_leaves``; a group left with fewer than 2
    rollouts is skipped); ``None``: no limit"""

    def __post_init__(self) -> None:
        self.train_kinds = tuple(self.train_kinds)
        unknown = [k for k in self.train_kinds if k not in CALL_KINDS]
        if unknown or not self.train_kinds:
            raise ConfigError(f"clean.train_kinds must be a non-empty list of {list(CALL_KINDS)}, got "
                              f"{list(self.train_kinds)}")
        if self.max_leaves is not None and self.max_leaves < 1:
            raise ConfigError(f"clean.max_leaves must be >= 1 or null (no limit), got {self.max_leaves}")


@dataclasses.dataclass
class CleanStats:
    """What cleaning removed and kept; sums over episodes and groups with ``+``."""

    removed_calls: dict[str, int] = dataclasses.field(default_factory=dict)
    """calls removed, by reason: a kind (not in ``train_kinds``) or ``"discarded"``"""
    removed_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    """sampled tokens that left training, by reason (module invariants)"""
    dropped_rollouts: int = 0
    """rollouts dropped for ``max_leaves``"""
    dropped_calls: int = 0
    """cleaned calls of those rollouts"""
    dropped_tokens: int = 0
    """sampled tokens of those rollouts' cleaned trees"""
    kept_calls: int = 0
    """calls kept in the rollouts that were not dropped"""
    kept_tokens: int = 0
    """sampled tokens of the cleaned trees of the rollouts that were not dropped"""

    def __add__(self, other: CleanStats) -> CleanStats:
        def merged(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
            return {k: a.get(k, 0) + b.get(k, 0) for k in dict.fromkeys([*a, *b])}

        return CleanStats(merged(self.removed_calls, other.removed_calls),
                          merged(self.removed_tokens, other.removed_tokens),
                          self.dropped_rollouts + other.dropped_rollouts, self.dropped_calls + other.dropped_calls,
                          self.dropped_tokens + other.dropped_tokens, self.kept_calls + other.kept_calls,
                          self.kept_tokens + other.kept_tokens)

    @classmethod
    def total(cls, stats: Sequence[CleanStats]) -> CleanStats:
        """The sum of ``stats`` (an empty sum is all zeros)."""
        out = cls()
        for s in stats:
            out = out + s
        return out

    def as_metrics(self, prefix: str = "clean/") -> dict[str, int]:
        """Flat metrics with a fixed set of keys: ``<kind>_calls``/``<kind>_tokens`` for every kind,
        ``discarded_calls``/``discarded_tokens``, ``dropped_rollouts_max_leaves`` (with its calls and tokens) and
        ``kept_calls``/``kept_tokens``."""
        out: dict[str, int] = {}
        for reason in (*CALL_KINDS, DISCARDED):
            out[f"{prefix}{reason}_calls"] = self.removed_calls.get(reason, 0)
            out[f"{prefix}{reason}_tokens"] = self.removed_tokens.get(reason, 0)
        out.update({f"{prefix}dropped_rollouts_max_leaves": self.dropped_rollouts,
                    f"{prefix}dropped_calls_max_leaves": self.dropped_calls,
                    f"{prefix}dropped_tokens_max_leaves": self.dropped_tokens,
                    f"{prefix}kept_calls": self.kept_calls, f"{prefix}kept_tokens": self.kept_tokens})
        return out


@dataclasses.dataclass
class EpisodeClean:
    """One episode after cleaning (before the ``max_leaves`` decision, which :func:`clean_rollouts` takes)."""

    calls: list[CallRecord]
    """the calls to train on, in their order"""
    stats: CleanStats
    """what was removed and kept (``dropped_*`` are 0 here)"""
    leaves: int
    """leaves of the cleaned call tree"""
    over_max_leaves: bool
    """the cleaned tree has more than ``max_leaves`` leaves: the rollout is to be dropped"""


def removal_reason(call: CallRecord, config: CleanConfig) -> str | None:
    """Why ``call`` is not trained (its kind, or ``"discarded"``), or None when it is kept."""
    if call.kind not in config.train_kinds:
        return call.kind
    if config.drop_discarded and call.discarded_by is not None:
        return DISCARDED
    return None


def clean_episode(calls: Sequence[CallRecord], config: CleanConfig) -> EpisodeClean:
    """The calls of one episode to train on, with what was removed (module invariants)."""
    calls = list(calls)
    reasons = [removal_reason(c, config) for c in calls]
    kept = [c for c, r in zip(calls, reasons) if r is None]
    removed_calls: dict[str, int] = {}
    for r in reasons:
        if r is not None:
            removed_calls[r] = removed_calls.get(r, 0) + 1
    if not calls:
        return EpisodeClean([], CleanStats(), 0, False)
    tree = CallTree.from_calls(calls)
    lengths = tree.meta.prompt_lengths or [len(c.prompt_token_ids) for c in calls]
    removed_tokens: dict[str, int] = {}
    kept_tokens = 0
    is_kept_node = [False] * len(tree.nodes)
    for node in tree.nodes:
        kept_here = [lengths[c] for c in node.calls if reasons[c] is None]
        is_kept_node[node.id] = bool(kept_here)
        first_kept = min(kept_here, default=None)
        gone = sorted(c for c in node.calls if reasons[c] is not None)
        for j, sampled in enumerate(node.sampled):
            if not sampled:
                continue
            pos = node.depth + j
            if first_kept is not None and first_kept <= pos:
                kept_tokens += 1
                continue
            who = next((c for c in gone if lengths[c] <= pos), None)
            if who is not None:  # always found: a sampled token has a sampler, and no kept call sampled it
                reason = reasons[who] or ""
                removed_tokens[reason] = removed_tokens.get(reason, 0) + 1
    leaves = sum(1 for n in tree.nodes if is_kept_node[n.id] and not any(is_kept_node[k] for k in n.children))
    over = config.max_leaves is not None and leaves > config.max_leaves
    stats = CleanStats(removed_calls, removed_tokens, kept_calls=len(kept), kept_tokens=kept_tokens)
    return EpisodeClean(kept, stats, leaves, over)


def clean_rollouts(episodes: Sequence[tuple[EpisodeRecord, Sequence[CallRecord]]], config: CleanConfig | None
                   ) -> tuple[list[int], list[list[CallRecord]], CleanStats]:
    """Clean every rollout of ``episodes``; returns (positions kept, their cleaned calls, stats).

    A rollout over ``max_leaves`` is left out of the positions (and counted as dropped, its kept calls and
    tokens moved from ``kept_*`` to ``dropped_*``). ``config=None``: nothing is cleaned or dropped and the
    stats are empty (the trainers always pass their ``clean`` block).
    """
    if config is None:
        return list(range(len(episodes))), [list(calls) for _, calls in episodes], CleanStats()
    keep: list[int] = []
    cleaned: list[list[CallRecord]] = []
    total = CleanStats()
    for i, (_, calls) in enumerate(episodes):
        ep = clean_episode(calls, config)
        st = ep.stats
        if ep.over_max_leaves:
            st = dataclasses.replace(st, dropped_rollouts=1, dropped_calls=st.kept_calls,
                                     dropped_tokens=st.kept_tokens, kept_calls=0, kept_tokens=0)
        else:
            keep.append(i)
            cleaned.append(ep.calls)
        total = total + st
    return keep, cleaned, total
