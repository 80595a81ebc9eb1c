"""What a call tree means: the typed metadata of :class:`~clawgym_env.capture.tree.CallTree`.

A tree's token structure (nodes, roots, call leaves) says nothing about the episodes behind it;
:class:`TreeMeta` does: which episodes and calls it holds, their rewards and statuses, the policy
versions that sampled them, the harness, which calls were not token-exact, and each call's prompt
length (which tokens a call *owns*). It travels with the tree in memory and on disk (the ``meta``
object of a tree JSONL line, the ``meta_json`` column of node records) and every reader uses its
attributes.

Invariants:
  * the JSON keys are the field names below, so a tree file stays readable without this package;
    a file written before this model existed (the same keys in a plain mapping, some missing)
    validates: every field has a default, and a missing one reads as "not recorded";
  * unknown keys are kept (``model_extra``) and written back: a round trip is lossless;
  * the model is frozen; a tree built from episodes has ``episodes[e].calls`` (tree call indices of
    episode ``e``) and ``call_episode[c]`` (episode position of call ``c``) describing the same
    partition; ``call_episode is None`` means the whole tree is one episode;
  * ``prompt_lengths is None`` only for older files: readers then fall back to the tree's sampled flags;
  * ``num_calls is None`` only for older files: :meth:`TreeMeta.calls_in` falls back to the tree's calls.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from clawgym_env.errors import ClawGymError


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class BuildCounts(_Frozen):
    """What the builder saw: calls identical to an earlier one (same episode: ``retries``, another
    episode: ``duplicates``), empty calls, and sampled tokens whose two logprobs disagreed."""

    retries: int = 0
    duplicates: int = 0
    empty_calls: int = 0
    logprob_conflicts: int = 0


class EpisodeSummary(_Frozen):
    """One episode of a tree, at its position ``e`` in ``TreeMeta.episodes``."""

    episode_id: str | None = None
    reward: float | None = None
    status: str | None = None
    num_calls: int | None = None
    policy_version: int | None = None
    task_id: str | None = None
    """set where the tree mixes tasks (an SFT batch)"""
    harness: str | None = None
    """set where the tree mixes tasks (an SFT batch)"""
    calls: list[int] = Field(default_factory=list)
    """tree call indices of this episode, in order"""


class GroupInfo(_Frozen):
    """A GRPO group: ``size`` episodes of one (suite, task, harness) ``key``, with their rewards."""

    size: int
    key: str
    rewards: list[float] = Field(default_factory=list)


class TreeMeta(_Frozen):
    """The meaning of one call tree (see the module invariants)."""

    tree_id: str | None = None
    """a deterministic id from the episode ids and the calls' token counts"""
    episode_ids: list[str] = Field(default_factory=list)
    """distinct episodes of the calls, in first-seen order"""
    policy: str | None = None
    policy_version: int | None = None
    """the policy version when every call shares one, else None"""
    policy_versions: list[int] = Field(default_factory=list)
    num_calls: int | None = None
    """calls in the tree, retries and empty calls included"""
    token_exact_share: float = 1.0
    inexact_calls: list[int] = Field(default_factory=list)
    """tree call indices recorded as not token-exact (their tokens are never trained on alone)"""
    prompt_lengths: list[int] | None = None
    """per tree call: its prompt length (call ``c`` owns the tokens at depth >= ``prompt_lengths[c]``)"""
    call_origin: list[tuple[str, int]] = Field(default_factory=list)
    """per tree call: ``(episode_id, call_index)`` of the captured call"""
    call_kinds: list[str] | None = None
    """per tree call: its ``CallRecord.kind`` (main, side, subagent, compaction); None in older files"""
    discarded_calls: list[int] = Field(default_factory=list)
    """tree call indices whose output the harness discarded and retried (``CallRecord.discarded_by`` set)"""
    build: BuildCounts = Field(default_factory=BuildCounts)
    task_id: str | None = None
    suite: str | None = None
    harness: str | None = None
    reward: float | None = None
    """the episode's reward; for a group, the mean of its episodes' rewards"""
    status: str | None = None
    """the episodes' common status, ``"mixed"`` when they differ"""
    episodes: list[EpisodeSummary] = Field(default_factory=list)
    call_episode: list[int] | None = None
    group: GroupInfo | None = None

    def calls_in(self, call_leaf_count: int) -> int:
        """``num_calls``, or (older files) the number of calls with a leaf."""
        return self.num_calls if self.num_calls is not None else call_leaf_count

    def episode_of(self, call: int) -> int:
        """The episode position of tree call ``call`` (0 when the tree is one episode)."""
        return 0 if self.call_episode is None else self.call_episode[call]

    def episode_count(self) -> int:
        """Episode positions of the tree: 1 without ``call_episode``, else as many as it names."""
        if self.call_episode is None:
            return 1
        return max(len(self.episodes), max(self.call_episode, default=-1) + 1)

    def episode_rewards(self) -> list[float]:
        """Reward per episode position; a tree without episode summaries is one episode with ``reward``."""
        if self.episodes:
            return [_reward(e.reward, e.episode_id) for e in self.episodes]
        return [float(self.reward or 0.0)]


def _reward(value: float | None, episode_id: str | None) -> float:
    if value is None:
        raise ClawGymError(f"episode {episode_id} of the tree has no recorded reward")
    return float(value)
