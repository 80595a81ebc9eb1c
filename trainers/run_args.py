"""The settings every training algorithm shares, in one place: the run, the tasks, the model, the optimiser.

An algorithm's ``Args`` subclasses :class:`RunArgs` (SFT) or :class:`RLArgs` (GRPO, PPO) and adds only its own
fields; a subclass may restate a shared field to change its default (its docstring stays the shared one).
Sections group what a first run never needs to set:

* ``eval:`` (:class:`EvalArgs`) the in-loop held-out evaluation;
* ``log:`` (:class:`~trainers.loggers.args.LogArgs`) experiment trackers (TensorBoard, Weights & Biases, plugins),
  curves, progress display;
* ``scale:`` (:class:`ScaleArgs`) every scale-out knob: the Ray rollout fleet, FSDP ranks, vLLM serving and
  weight sync, rollouts ahead of training. The quickstart and the small configs never show it.

Invariant: a key that moved into a section (``generation`` → ``scale.generation``, ``eval_every`` →
``eval.every``) is refused with a :class:`~clawgym_env.errors.ConfigError` naming its new place
(``MOVED_KEYS``, read by :func:`trainers.config_doc.validate`), never silently ignored.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from clawgym_env.harness import HarnessAdapter
from clawgym_env.jsontypes import JSONObject
from trainers.batch.clean import CleanConfig
from trainers.loggers.args import LogArgs
from trainers.policy import PolicyConfig
from trainers.rollouts.ahead import AsyncConfig
from trainers.rollouts.generation import GenerationConfig
from trainers.rollouts.sync import RolloutConfig
from trainers.scale.fsdp import DistConfig

__all__ = ["LOG_MOVED", "RL_MOVED", "EvalArgs", "LogArgs", "RLArgs", "RunArgs", "ScaleArgs"]


@dataclasses.dataclass
class EvalArgs:
    """In-loop evaluation on a held-out suite (``eval.*``); off unless ``suite`` and ``every`` are set."""

    suite: str | None = None
    """held-out suite evaluated in the loop, named as ``suite`` is (``None``: no in-loop evaluation)"""
    every: int = 0
    """evaluate every this many steps and after the last one (0: never)"""
    samples: int = 1
    """episodes per held-out task and harness"""
    harness: str | None = None
    """harness of the in-loop evaluation; ``None``: every harness of ``harnesses`` (metrics per harness)"""


@dataclasses.dataclass
class ScaleArgs:
    """Scale-out (``scale.*``): where rollouts run and are sampled, how training spreads over ranks. The defaults
    are one process: rollouts on its threads, sampled by an in-process copy of the policy, synchronous."""

    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """where the rollouts run: this process's threads or a Ray cluster (see the ``scale.rollout.*`` fields)"""
    dist: DistConfig = dataclasses.field(default_factory=DistConfig)
    """data parallelism under ``torchrun --nproc-per-node N`` (see the ``scale.dist.*`` fields)"""
    generation: GenerationConfig = dataclasses.field(default_factory=GenerationConfig)
    """where the rollouts are sampled: an in-process copy of the policy (``transformers``, default) or vLLM
    engines synced after every update (``vllm``; see the ``scale.generation.*`` fields)"""
    async_: AsyncConfig = dataclasses.field(default_factory=AsyncConfig)
    """``scale.async:`` in a config: ``max_staleness`` > 0 collects the next steps' rollouts while this one trains,
    off-policy by at most that many versions (see the ``scale.async.*`` fields)"""


LOG_MOVED = {"tensorboard": "log.tensorboard", "plot": "log.plot", "progress": "log.progress"}
"""Top-level keys of earlier configs that now live in ``log:``."""
RL_MOVED = {**LOG_MOVED, "rollout": "scale.rollout", "dist": "scale.dist", "generation": "scale.generation",
            "async": "scale.async", "async_": "scale.async", "eval_suite": "eval.suite", "eval_every": "eval.every",
            "eval_samples": "eval.samples", "eval_harness": "eval.harness"}
"""Top-level keys of earlier RL configs and where they live now."""


@dataclasses.dataclass
class RunArgs:
    """The fields every algorithm has: the run's folder and seed, the suite, the model and its optimiser."""

    MOVED_KEYS: ClassVar[dict[str, str]] = LOG_MOVED
    out_dir: str = "runs/train"
    """folder of the run: metrics.jsonl, checkpoints/, episodes/, config.json, summary.json"""
    seed: int = 0
    """seed of Python, NumPy and torch, and of every step's task draw (a resumed run draws what the uninterrupted one
    would)"""
    steps: int = 100
    """number of iterations (RL: each rollouts, then an update; SFT: optimiser steps)"""
    suite: str = "builtin"
    """train suite: a registered suite name (``builtin``, a plugin's; resolved by ``clawgym_env.plugins.load_suite``)
    or a folder of ClawGym task dirs"""
    sandbox: str = "bwrap"
    """sandbox backend of every episode: ``bwrap`` or ``docker``"""
    concurrency: int = 4
    """episodes run at once (one sandbox each) on threads (the ``threads`` rollout backend, and evaluation)"""
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    """the model to train (see the ``policy.*`` fields)"""
    learning_rate: float = 1e-5
    """AdamW learning rate of the policy"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradients are clipped to this global norm before each optimiser step"""
    clean: CleanConfig = dataclasses.field(default_factory=CleanConfig)
    """which calls of an episode are trained: call kinds, dead retries, ``max_leaves`` (see the ``clean.*`` fields;
    counted in the ``clean/...`` metrics)"""
    max_context_tokens: int = 32768
    """context limit of one model call at the serving proxy (prompt + sampled tokens); ``max_pack_tokens``, when
    set, must be at least this"""
    max_pack_tokens: int | None = 32768
    """at most this many tokens per packed forward: small trees share a pack, a larger tree is split into sub-packs
    (shared prefixes recomputed, every token's loss counted once: the same loss and gradients); at least
    ``max_context_tokens``; ``None``: no limit"""
    chunk_size: int = 1024
    """LM-head rows computed at once when scoring (memory vs speed with the 151k vocabulary)"""
    harness_options: dict[str, JSONObject] = dataclasses.field(default_factory=dict)
    """per harness name, its adapter's own options (constructor keywords), e.g. ``{openclaw: {api:
    openai-responses}}``; the name ``"*"``: every harness of the run (its own entry wins; ``clawgym train
    --harness-opt KEY=VALUE`` sets these); a key an adapter does not take is an error naming the ones it does"""
    harness_cache_dir: str | None = None
    """the harness cache every adapter that installs its harness finds it in (what ``clawgym harness install
    --cache-dir`` fills); ``None``: ``$CLAWGYM_CACHE/harnesses`` (``~/.cache/clawgym/harnesses``)"""

    def harness_names(self) -> list[str]:
        """The harnesses this run builds (an algorithm with harnesses overrides it); ``harness_options`` may name
        only these."""
        return []

    def harness_adapter(self, name: str) -> HarnessAdapter:
        """The adapter ``name`` built with its ``harness_options`` and, when it has a harness cache,
        ``harness_cache_dir`` (:func:`harness_adapters.options.build_harness`)."""
        from harness_adapters.options import build_harness, takes_cache_dir

        cache = self.harness_cache_dir if self.harness_cache_dir and takes_cache_dir(name) else None
        options = {**self.harness_options.get("*", {}), **self.harness_options.get(name, {})}
        return build_harness(name, options, cache_dir=cache)

    def harness_adapters(self) -> dict[str, HarnessAdapter]:
        """Every adapter of :meth:`harness_names`, built (and so checked) now: a bad option fails before training."""
        from clawgym_env.errors import ConfigError

        names = self.harness_names()
        stray = sorted(set(self.harness_options) - {*names, "*"})
        if stray:
            raise ConfigError(f"harness_options names {', '.join(stray)}, not a harness of this run "
                              f"({', '.join(names) or 'none'})")
        return {name: self.harness_adapter(name) for name in names}

    log: LogArgs = dataclasses.field(default_factory=LogArgs)
    """experiment trackers (TensorBoard, Weights & Biases, plugins), curves and progress display (see the ``log.*``
    fields)"""


@dataclasses.dataclass
class RLArgs(RunArgs):
    """The fields of every RL loop (GRPO, PPO): checkpoints and resuming, harnesses and sampling, the clipped
    policy-gradient update, in-loop evaluation and the scale-out section."""

    MOVED_KEYS: ClassVar[dict[str, str]] = RL_MOVED
    resume: bool = True
    """continue from ``out_dir``'s latest checkpoint when there is one"""
    save_every: int = 10
    """write a checkpoint every this many steps (and after the last one)"""
    keep_checkpoints: int = 2
    """keep only this many newest checkpoints"""
    harnesses: dict[str, float] = dataclasses.field(default_factory=lambda: {"mini": 1.0})
    """harnesses to roll out through, with ratios: each step's groups/tasks are split between them (mix-harness),
    e.g. ``{mini: 1, claude-code: 1}``"""
    temperature: float = 1.0
    """sampling temperature of the rollouts; the trainer scores tokens at the same temperature"""
    top_p: float = 1.0
    """nucleus sampling of the rollouts; keep 1.0: the trainer does not reproduce top-p truncation"""
    max_tokens: int = 1024
    """cap on the tokens one model call may sample (overrides the harness's own value)"""
    pass_threshold: float = 1.0
    """an episode whose reward reaches this counts as passed in the metrics"""
    update_epochs: int = 1
    """passes over one step's batch (> 1 moves the ratio away from 1, so clipping matters)"""
    minibatches: int = 1
    """optimiser steps per epoch: the step's packs are split into this many minibatches"""
    clip_eps: float = 0.2
    """PPO clip range: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]"""
    clip_eps_high: float | None = None
    """upper clip (DAPO's clip-higher); ``None``: ``clip_eps``"""
    is_clip: float = 2.0
    """cap of the truncated importance weight exp(logp_old - logp_rollout) against the serving policy's recorded
    logprobs"""
    kl_coef: float = 0.0
    """weight of the k3 KL penalty to the reference (the initial weights); 0: none and no reference kept"""
    eval: EvalArgs = dataclasses.field(default_factory=EvalArgs)
    """in-loop evaluation on a held-out suite (see the ``eval.*`` fields)"""
    scale: ScaleArgs = dataclasses.field(default_factory=ScaleArgs)
    """scale-out: Ray rollout fleet, FSDP ranks, vLLM serving and weight sync, rollouts ahead of training (see the
    ``scale.*`` fields); the defaults run everything in one process"""

    def harness_names(self) -> list[str]:
        """The harnesses of the mix (``harnesses``, ratio > 0) and of the in-loop evaluation."""
        names = [h for h, ratio in self.harnesses.items() if ratio > 0]
        if self.eval.harness and self.eval.harness not in names:
            names.append(self.eval.harness)
        return names

    @property
    def clip_high(self) -> float:
        """The upper clip range: ``clip_eps_high``, or ``clip_eps`` when unset."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    def sampling(self) -> dict[str, float | int]:
        """The rollouts' sampling parameters (temperature, top_p, max_tokens)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}
