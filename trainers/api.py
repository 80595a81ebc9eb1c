"""The public algorithm API: everything a third-party training algorithm needs, from one module.

``clawgym train --config FILE`` reads the config's ``algo`` key, finds that name in the ``algorithms``
registry (:data:`clawgym_env.plugins.algorithms`; a package declares its own as an entry point) and runs
the module it names::

    [project.entry-points."clawgym.algorithms"]
    my-algo = "my_package.my_algo"          # a module exporting ``Args`` and ``train``

The contract of that module:

* ``Args`` is a **dataclass** whose fields are the config's keys (every key but ``algo``). ``clawgym train``
  validates the config against it before anything runs (unknown keys and wrong types are errors naming the
  key), so give every field a type and a default, and document each field with a string literal under it
  (``clawgym train --help-config my-algo`` prints them). Nested dataclasses (e.g. ``policy:`` of type
  :class:`PolicyConfig`) are nested mappings. Deriving from :class:`RunArgs` (or :class:`RLArgs` for a loop
  that rolls out) gives the shared fields: ``out_dir``, ``seed``, ``suite``, ``harnesses``, ``policy``,
  ``sandbox``, ``max_context_tokens``, ``log``, ... with their meaning fixed across algorithms. If ``Args``
  has a field ``resume``, ``clawgym train --no-resume`` sets it to False. A bad value found later (in
  ``__post_init__`` or in ``train``) is a :class:`ConfigError` naming the field: ``clawgym train`` prints it
  and exits 2.
* ``train(args)`` gets that validated ``Args`` instance and returns a :class:`TrainSummary`; ``clawgym
  train`` prints it. Before it is called, ``<args.out_dir>/config.json`` holds the resolved config.
  :func:`read_summary` reads a finished run's summary back (:class:`ExpertCounts` is the part an SFT-like
  algorithm that collects expert episodes fills in).

Invariants an algorithm keeps (the bundled ``grpo``, ``ppo`` and ``sft`` keep them, and the tools that read
a run rely on them):

* it writes its metrics through :class:`MetricsLogger` (``<out_dir>/metrics.jsonl``, one row per step) and
  returns ``TrainSummary(metrics=<that file>, last=<the last row>)``, also written with
  :meth:`TrainSummary.write` (``<out_dir>/summary.json``);
* an infrastructure failure (``EpisodeResult.record.is_infra_failure``) is never a 0 reward to train on:
  :func:`make_groups` excludes them;
* the rollout logprobs of a :class:`TrainPack` are what the serving policy sampled with; the trained
  model's are :func:`token_logprobs` of the same pack (one forward per call tree: shared prefixes once);
* after an optimiser update the serving policy gets the new weights under a higher version
  (:meth:`InProcessSync.push`), so every captured call names the weights that sampled it.

The pieces, in the order a loop uses them:

1. **Policy**: :class:`TrainablePolicy` (from a :class:`PolicyConfig`: ``"tiny"`` or a model folder) and
   :class:`InProcessSync` (``InProcessSync.for_policy(policy)``: an in-process serving copy whose
   ``serving`` is a policy backend, and ``push(policy, version)`` to update it).
2. **Rollouts**: :func:`load_suite`, :func:`draw_jobs` (a step's seeded (task, harness) draw),
   :class:`Runtime` (the serving proxy + sandboxes, around the serving policy) and :func:`run_jobs`
   (``group_size`` episodes per job → :class:`EpisodeResult` s: the record and the token-level calls;
   :data:`EpisodePair` is the plain ``(record, calls)`` tuple and :func:`as_episode` turns either into the
   other); :func:`make_harness` builds a harness adapter by name; :class:`SamplingOverrides` is the sampling
   of every call; :func:`judge_for` the LLM judge the tasks need.
3. **Groups of call trees with advantages**: :func:`make_groups` (bucket by (suite, task, harness), drop
   infrastructure failures, clean with :class:`CleanConfig`, GRPO advantages from :func:`group_advantages`,
   one :class:`CallTree` per group) → :class:`Group`; :func:`group_summary` counts them for metrics.
4. **Packs**: :func:`pack_groups` (or :func:`build_pack` over your own :class:`PackItem` s: a tree and an
   advantage per episode; :func:`build_packs` bounds each pack's tokens) → :class:`TrainPack`: the packed
   sequence (:class:`PackedTree`), its trainable tokens, the (token, episode) pairs with their weights and
   advantages (pair weights over a step sum to at most 1, so ``Σ pair_weight · term`` is a mean) and one
   :class:`PackEpisode` per episode. :func:`episodes_tree` makes one tree of episodes of different tasks
   (an SFT batch).
5. **Loss**: :func:`token_logprobs` of the trained model on ``pack.packed`` (gradients flow), against
   ``pack.pair_logprobs()`` (the behaviour logprobs) and ``pack.pair_adv``.
6. **Bookkeeping**: :class:`MetricsLogger` (rows are :data:`MetricsRow`), :func:`rollout_metrics`,
   :func:`save_checkpoint` / :func:`latest_checkpoint` / :func:`load_checkpoint`, :class:`TrainSummary`.

The names below are the same objects as in their home modules (``trainers.api.TrainPack is
trainers.batch.tree_batch.TrainPack``); this module adds none of its own, so it stays what the bundled
algorithms use. ``examples/clawgym_example_plugins`` holds a complete REINFORCE built on it alone.
"""

from __future__ import annotations

from clawgym_env.capture.tree import CallTree
from clawgym_env.envs.runtime import Runtime
from clawgym_env.episodes.run import EpisodeResult
from clawgym_env.errors import ConfigError
from clawgym_env.plugins import load_suite, make_harness
from clawgym_env.policy.base import SamplingOverrides
from trainers.batch.advantages import group_advantages
from trainers.batch.clean import CleanConfig
from trainers.batch.groups import EpisodePair
from trainers.batch.logprobs import token_logprobs
from trainers.batch.packing import PackedTree
from trainers.batch.tree_batch import (
    Group,
    PackEpisode,
    PackItem,
    TrainPack,
    as_episode,
    build_pack,
    build_packs,
    episodes_tree,
    group_summary,
    make_groups,
    pack_groups,
)
from trainers.metrics import MetricsLogger, MetricsRow, rollout_metrics
from trainers.policy import PolicyConfig, TrainablePolicy
from trainers.rollouts.draw import draw_jobs
from trainers.rollouts.sync import judge_for, run_jobs
from trainers.run_args import RLArgs, RunArgs
from trainers.scale.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from trainers.scale.weight_sync import InProcessSync
from trainers.summary import ExpertCounts, TrainSummary, read_summary

__all__ = [
    # the contract
    "ConfigError", "ExpertCounts", "RLArgs", "RunArgs", "TrainSummary", "read_summary",
    # policy
    "InProcessSync", "PolicyConfig", "TrainablePolicy",
    # rollouts
    "EpisodeResult", "Runtime", "SamplingOverrides", "draw_jobs", "judge_for", "load_suite", "make_harness",
    "run_jobs",
    # groups of call trees with advantages
    "CallTree", "CleanConfig", "EpisodePair", "Group", "as_episode", "group_advantages", "group_summary",
    "make_groups",
    # packs and logprobs
    "PackEpisode", "PackItem", "PackedTree", "TrainPack", "build_pack", "build_packs", "episodes_tree",
    "pack_groups", "token_logprobs",
    # bookkeeping
    "MetricsLogger", "MetricsRow", "latest_checkpoint", "load_checkpoint", "rollout_metrics", "save_checkpoint",
]
