"""What the RL loops share about ranks: policy set-up before and after sharding, rank 0's rollout services.

Invariants of :func:`setup_policy` (the order matters): under N ranks a policy it builds itself starts sharded
without ever being whole on a rank's device (:func:`trainers.scale.meta_init.sharded_start`: meta skeleton,
shard, rank 0 broadcasts the weights; the reference is sharded too). Otherwise (one process, a given policy, or
``shard=False``): the KL reference and rank 0's serving copy are
taken from the plain (unsharded) module, before ``fully_shard`` and before any checkpoint is loaded — the
reference is the weights the run started from, and the serving engine is built without a collective; then
the module is sharded (:func:`trainers.scale.fsdp.shard_policy`); the caller builds its optimiser after.
Ranks other than 0 get a :class:`~trainers.scale.weight_sync.GatherOnlySync`: ``push`` is called on every rank.
:func:`rollout_services` starts the runtime (and the Ray fleet) on rank 0 only; other ranks get ``None``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clawgym_env.errors import ConfigError, PolicyError
from clawgym_env.grading.judge import Judge
from trainers.policy import PolicyConfig, TrainablePolicy
from trainers.rollouts.generation import GenerationConfig, open_generation
from trainers.rollouts.sync import RolloutConfig, rollout_fleet
from trainers.scale.fsdp import DistConfig, DistInfo, init_distributed, local_device, shard_policy
from trainers.scale.meta_init import sharded_start
from trainers.scale.weight_sync import GatherOnlySync, InProcessSync


def check_context(max_context_tokens: int, max_pack_tokens: int | None) -> None:
    """One call may fill ``max_context_tokens``: a pack limit below it could not hold such a call's tree."""
    if max_context_tokens <= 0:
        raise ConfigError(f"max_context_tokens must be positive, got {max_context_tokens}")
    if max_pack_tokens is not None and max_pack_tokens < max_context_tokens:
        raise ConfigError(f"max_pack_tokens ({max_pack_tokens}) is smaller than max_context_tokens "
                          f"({max_context_tokens}); raise max_pack_tokens or lower max_context_tokens")


@dataclasses.dataclass
class RankSetup:
    """A loop's policy after :func:`setup_policy`, with this rank's place and weight sync."""

    info: DistInfo
    policy: TrainablePolicy
    sync: Any
    """this rank's weight sync: rank 0's :class:`InProcessSync` (or, inside :func:`generation_services`, the
    sync of ``scale.generation:``: vLLM engines), a gather-only sync on the other ranks; ``push`` on every rank"""

    @property
    def serving(self) -> Any:
        """Rank 0's serving policy (the rollouts sample from it); an error on other ranks."""
        serving = getattr(self.sync, "serving", None)
        if serving is None:
            raise PolicyError("only rank 0 serves the policy")
        return serving


def setup_policy(config: PolicyConfig, dist: DistConfig, policy: TrainablePolicy | None = None, *,
                 reference: bool = False, name: str = "trainee", shard: bool = True,
                 serve_in_process: bool = True) -> RankSetup:
    """Join the process group, build (or take) the policy on this rank's device, take the KL reference
    (``reference``) and rank 0's serving copy, then shard (module docstring; ``shard=False``: the caller
    shards later with :func:`trainers.scale.fsdp.shard_policy`, e.g. after copying a critic from the policy)."""
    info = init_distributed(dist.backend, dist.timeout_s)
    if policy is None and shard and info.distributed:  # never the whole model on a rank's device
        start = sharded_start(dataclasses.replace(config, device=local_device(config.device, info)), dist, info,
                              reference=reference, serve_in_process=info.is_main and serve_in_process)
        meta_sync: InProcessSync | GatherOnlySync = GatherOnlySync()
        if start.host_copy is not None:
            meta_sync = InProcessSync.for_policy(start.host_copy, name=name)
        return RankSetup(info, start.policy, meta_sync)
    if policy is None:
        policy = TrainablePolicy(dataclasses.replace(config, device=local_device(config.device, info)))
    if reference:
        policy.freeze_reference()
    sync: InProcessSync | GatherOnlySync = InProcessSync.for_policy(policy, name=name) \
        if info.is_main and serve_in_process else GatherOnlySync()
    if shard:
        shard_policy(policy, dist)
    return RankSetup(info, policy, sync)


@contextlib.contextmanager
def rollout_services(setup: RankSetup, *, rollout: RolloutConfig, sandbox: str, out_dir: Path, judge: Judge | None,
                     max_context_tokens: int) -> Iterator[tuple[Any, Any]]:
    """``(runtime, fleet or None)`` on rank 0 (its proxy limited to ``max_context_tokens``), ``(None, None)``
    on the other ranks."""
    if not setup.info.is_main:
        yield None, None
        return
    from clawgym_env.envs.runtime import Runtime

    if rollout.sandbox_pool and sandbox != "docker":
        raise ValueError(f"rollout.sandbox_pool={rollout.sandbox_pool} keeps warm Docker containers, but sandbox is "
                         f"{sandbox!r} (bwrap has no pool): set sandbox: docker, or rollout.sandbox_pool: 0")
    with Runtime(setup.serving, sandbox=sandbox, out_dir=out_dir, judge=judge, sandbox_pool=rollout.sandbox_pool,
                 max_context_tokens=max_context_tokens) as rt, \
            rollout_fleet(rollout, setup.serving, sandbox=sandbox, out_dir=out_dir, judge=judge) as fleet:
        yield rt, fleet


@contextlib.contextmanager
def generation_services(setup: RankSetup, config: GenerationConfig, out_dir: Path, *,
                        max_context_tokens: int, version: int = 0) -> Iterator[Any]:
    """Serve the policy per ``scale.generation:`` for the run (every rank enters; see
    :func:`trainers.rollouts.generation.open_generation`): ``setup.sync`` becomes its sync while inside (vLLM engines
    are stopped on exit, also on error); with ``backend: transformers`` rank 0's in-process copy is kept.
    ``version`` > 0 (a resumed run): the policy's weights are served under it before anything samples."""
    own = setup.sync if isinstance(setup.sync, InProcessSync) else None
    before = setup.sync
    with open_generation(config, setup.policy, out_dir, max_context_tokens=max_context_tokens,
                         in_process=own) as gen:
        setup.sync = gen
        try:
            if version:
                gen.push(setup.policy, version)
            yield gen
        finally:
            setup.sync = before
