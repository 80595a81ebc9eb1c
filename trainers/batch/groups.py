"""Rollouts → GRPO groups: :func:`make_groups` (the first half of :mod:`trainers.batch.tree_batch`'s batch).

:func:`make_groups` buckets rollouts by ``(suite, task_id, harness)`` (:func:`group_key`, first-seen
order), drops infrastructure failures (never scored 0: counted in ``Group.infra_excluded``), cleans every
rollout (:mod:`trainers.batch.clean`: untrained call kinds, dead retries, rollouts over ``max_leaves``
dropped from their group, all counted in ``Group.clean``), computes GRPO advantages over the rollouts
that remain and skips groups whose rewards are all equal; :func:`trainers.batch.tree_batch.pack_groups` then
packs each trained group's :class:`~clawgym_env.capture.tree.CallTree`.

Invariants of a :class:`Group` as :func:`make_groups` builds it: ``episodes``, ``rewards`` and
``advantages`` are aligned; ``tree`` is set exactly when ``skipped`` is None, and is built from the
CLEANED calls of ``episodes``; ``behaviour`` is :func:`~trainers.batch.behaviour.episode_behaviour` of that
tree (per-(token, episode) behaviour logprobs where episodes sampled a shared token differently); ``masked``
is a subset of ``overlong``; ``dropped`` and ``episodes`` partition the group's non-infra rollouts.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from clawgym_env.capture.records import CallRecord, EpisodeRecord
from clawgym_env.capture.tree import CallTree
from clawgym_env.episodes.run import EpisodeResult
from clawgym_env.errors import ConfigError
from trainers.batch.advantages import group_advantages, is_constant
from trainers.batch.behaviour import BehaviourTable, episode_behaviour
from trainers.batch.clean import CleanConfig, CleanStats, clean_rollouts

EpisodePair = tuple[EpisodeRecord, list[CallRecord]]
"""An episode as the trainers take it: its record and its calls. The engine's
:class:`~clawgym_env.episodes.run.EpisodeResult` is this pair, named (it unpacks as one)."""


def as_episode(item: EpisodeResult | EpisodePair) -> EpisodeResult:
    """The one episode shape into the trainers: an ``EpisodeResult`` (or the plain ``(record, calls)`` pair it
    names) → an ``EpisodeResult`` with its own list of calls.

    Anything else is a ``TypeError`` naming the conversion: a gym step's ``info`` goes through
    ``EpisodeResult.from_info(info)``, a record alone through ``EpisodeResult(record, calls)``."""
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], EpisodeRecord) \
            and isinstance(item[1], (list, tuple)):
        return EpisodeResult(item[0], list(item[1]))
    if isinstance(item, Mapping) and "episode" in item and "calls" in item:
        raise TypeError("an env step's info is not an episode: convert it with EpisodeResult.from_info(info) "
                        "(clawgym_env.EpisodeResult) before handing it to the trainers")
    if isinstance(item, EpisodeRecord):
        raise TypeError(f"episode {item.episode_id}: a record alone has no calls to train on; pass "
                        "EpisodeResult(record, calls) (its calls: clawgym_env.capture.records.read_calls("
                        "record.calls_path))")
    raise TypeError(f"cannot read an episode from {type(item).__name__}: pass an EpisodeResult "
                    "(clawgym_env.EpisodeResult; an env step's info converts with EpisodeResult.from_info(info))")


def group_key(record: EpisodeRecord) -> tuple[str, str, str]:
    """The key a rollout is grouped by: ``(suite or '-', task_id, harness)``."""
    return (record.suite or "-", record.task_id, record.harness)


@dataclasses.dataclass
class Group:
    """The kept episodes of one (suite, task, harness); ``skipped`` says why it does not train.

    ``episodes`` are the rollouts as collected (records and all their calls: a rebuild cleans them again);
    ``rewards``/``advantages`` are aligned with them; ``tree`` is built from their CLEANED calls."""

    key: tuple[str, str, str]
    episodes: list[EpisodePair]
    rewards: list[float]
    advantages: list[float]
    infra_excluded: int = 0
    skipped: str | None = None
    """why the group does not train: ``constant_reward``, ``all_infra``, ``no_tokens``, ``all_overlong``,
    ``max_leaves`` (fewer than 2 rollouts left after the ``max_leaves`` drops), ``all_stale`` (async)"""
    tree: CallTree | None = None
    overlong: list[int] = dataclasses.field(default_factory=list)
    """Positions of the episodes with a call cut at ``max_tokens`` (finish reason ``length``)."""
    masked: set[int] = dataclasses.field(default_factory=set)
    """Positions of the episodes that get no training pairs (``overlong="mask"``)."""
    dropped: list[EpisodePair] = dataclasses.field(default_factory=list)
    """rollouts dropped from the group for ``clean.max_leaves`` (as collected; not in ``episodes``)"""
    clean: CleanStats = dataclasses.field(default_factory=CleanStats)
    """what cleaning removed from the group's rollouts (:mod:`trainers.batch.clean`)"""
    behaviour: BehaviourTable = dataclasses.field(default_factory=dict)
    """each episode's own behaviour logprob and version where it differs from ``tree``'s first sampler's on a
    shared token (:mod:`trainers.batch.behaviour`; empty when no two samplers disagree)"""

    @property
    def harness(self) -> str:
        """The harness of the group's episodes."""
        return self.key[2]


OVERLONG_MODES = ("keep", "mask", "penalty")


def is_overlong(calls: Sequence[CallRecord]) -> bool:
    """True when a call of the episode stopped because it reached its token limit."""
    return any(c.finish_reason == "length" for c in calls)


def make_groups(results: Iterable[EpisodeResult | EpisodePair], *, normalize_std: bool = True, overlong: str = "keep",
                overlong_penalty: float = 0.0, clean: CleanConfig | None = None) -> list[Group]:
    """Bucket rollouts into groups (first-seen order), drop infra failures, clean, score advantages, build trees.

    ``clean`` (:class:`~trainers.batch.clean.CleanConfig`; None: train every call as captured) removes the calls
    not trained (kinds, dead retries) and drops rollouts over ``max_leaves`` from their group before the
    advantages; a group left with fewer than 2 rollouts by those drops is skipped as ``max_leaves``.
    Overlong episodes (a kept call cut at ``max_tokens``): ``"keep"`` trains them as they are;
    ``"penalty"`` subtracts ``overlong_penalty`` from their reward before the advantages (the record
    keeps its reward); ``"mask"`` keeps them in the group's baseline but gives them no training pairs,
    so a cut-off answer is neither reinforced nor punished for being cut.
    """
    if overlong not in OVERLONG_MODES:
        raise ConfigError(f"overlong must be one of {OVERLONG_MODES}, got {overlong!r}")
    buckets: dict[tuple[str, str, str], list[EpisodePair]] = {}
    infra: dict[tuple[str, str, str], int] = defaultdict(int)
    for item in results:
        rec, calls = as_episode(item)
        key = group_key(rec)
        buckets.setdefault(key, [])
        if rec.is_infra_failure:
            infra[key] += 1
            continue
        buckets[key].append((rec, calls))
    groups = []
    for key, collected in buckets.items():
        keep, cleaned, stats = clean_rollouts(collected, clean)
        eps = [collected[i] for i in keep]
        kept = set(keep)
        trained = [(rec, calls) for (rec, _), calls in zip(eps, cleaned)]
        cut = [i for i, (_, calls) in enumerate(trained) if is_overlong(calls)]
        rewards = [float(r.reward) - (overlong_penalty if overlong == "penalty" and i in cut else 0.0)
                   for i, (r, _) in enumerate(eps)]
        g = Group(key, eps, rewards, [0.0] * len(eps), infra_excluded=infra[key], overlong=cut,
                  masked=set(cut) if overlong == "mask" else set(),
                  dropped=[e for i, e in enumerate(collected) if i not in kept], clean=stats)
        if not collected:
            g.skipped = "all_infra"
        elif g.dropped and len(eps) < 2:
            g.skipped = "max_leaves"
        elif len(g.masked) == len(eps):
            g.skipped = "all_overlong"
        elif is_constant(rewards):
            g.skipped = "constant_reward"
        elif not any(calls for _, calls in trained):
            g.skipped = "no_tokens"
        else:
            g.advantages = group_advantages(rewards, normalize_std=normalize_std)
            g.tree = CallTree.from_episodes(trained)
            g.behaviour = episode_behaviour(g.tree, [c for _, calls in trained for c in calls])
        groups.append(g)
    return groups


def group_summary(groups: Sequence[Group]) -> dict[str, int]:
    """Counts for metrics: groups trained/skipped and why, infra failures excluded, and what cleaning removed
    (``clean/...``: :meth:`trainers.batch.clean.CleanStats.as_metrics`, summed over the groups)."""
    out: dict[str, int] = {"groups": len(groups), "groups_trained": sum(g.skipped is None for g in groups)}
    for reason in ("constant_reward", "all_infra", "no_tokens", "all_overlong", "max_leaves", "all_stale"):
        out[f"groups_skipped_{reason}"] = sum(g.skipped == reason for g in groups)
    out["episodes_infra_excluded"] = sum(g.infra_excluded for g in groups)
    out["episodes_overlong"] = sum(len(g.overlong) for g in groups)
    out["episodes_overlong_masked"] = sum(len(g.masked) for g in groups)
    out.update(CleanStats.total([g.clean for g in groups]).as_metrics())
    return out
