"""What a fleet is asked to do: its configuration, one requested episode, one attempt at it.

:class:`FleetConfig` is the whole configuration of a rollout fleet (plain data, picklable, sent to
every worker); :class:`EpisodeJob` is one requested episode (a task and its sample number),
:class:`Attempt` one try of it on one worker, :class:`AttemptRecord` what is kept of a try that
ended in an infrastructure failure.

Invariants: a job's ``index`` is its position in the caller's batch, so results come back in
the caller's order; ``attempt`` counts from 1 and never exceeds ``FleetConfig.max_attempts``;
every limit is checked at construction (an invalid value names the field and the fix); an
episode's needs are its harness's declared :class:`~clawgym_env.harness.EpisodeResources` unless
``episode_cpus`` / ``episode_memory_mb`` override them for every harness.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypedDict

from clawgym_env.grading.judge import Judge
from clawgym_env.harness import EpisodeResources, HarnessAdapter
from clawgym_env.policy.base import SamplingOverrides
from clawgym_env.task import Task

RETRIABLE_BOUNDARIES: tuple[str, ...] = ("sandbox", "harness", "proxy", "policy", "internal")
"""Failure boundaries of an ``infra_error`` worth trying again on another node (a broken task
folder, boundary ``task``, fails the same way everywhere; a grader's ``reward_invalid`` is not an
``infra_error`` and is never retried)."""


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """Who a rollout worker is: handed to ``FleetConfig.worker_setup`` and shown in progress."""

    index: int
    """Position of the worker in the fleet (0-based, stable across restarts of its process)."""
    node_id: str
    """The Ray node id the worker is pinned to."""
    node: str
    """A short label for the node (``<host>:<first 6 hex of the node id>``)."""
    pid: int = 0
    """The worker process's id (changes when Ray restarts the worker)."""
    capacity: int = 1
    """The most episodes the worker runs at once (the per-node cap)."""
    cpus: float = 0.0
    """CPUs of the node the worker's episodes may use together (the sum of their declared needs)."""
    memory_mb: int = 0
    """Memory of the node (MiB) the worker's episodes may use together (the sum of their declared needs)."""


@dataclasses.dataclass(frozen=True)
class FleetConfig:
    """A rollout fleet on Ray: one worker actor per node, each with its own serving proxy.

    ``policy`` is a spec string (:func:`clawgym_env.policy.make_policy`) built inside every worker:
    ``"scripted:expert"`` for tests, ``"vllm:http://HOST:PORT"`` for remote engines reached by
    token ids (token-exact capture is unchanged), ``"passthrough:openai:MODEL"``, ...
    """

    policy: str
    """Policy spec string, built inside each worker (the policy object itself never travels)."""
    address: str | None = None
    """Ray cluster address (``"auto"``: the running cluster; ``None``: a running one if this process
    is already connected, else a local one started for this process)."""
    sandbox: str = "bwrap"
    """Sandbox backend name used on every node (the per-run default of ``run_episode``)."""
    sandbox_pool: int = 0
    """Warm Docker containers each rollout worker keeps ahead per sandbox shape on its node
    (:class:`~clawgym_env.sandbox.docker.pool.DockerPool`; ``sandbox="docker"`` only; 0: every sandbox starts cold)."""
    out_dir: str | None = None
    """Folder for episode folders on each worker's node (the same path on every node; ``None``: temp)."""
    max_episodes_per_node: int = 4
    """Per-node cap: the most episodes one node's worker runs at once (whatever their needs)."""
    episode_cpus: float | None = None
    """CPUs one episode needs, for every harness (``None``: each harness's declared ``resources.cpus``); a node
    runs episodes only while the sum of their needs fits its CPUs."""
    episode_memory_mb: int | None = None
    """Memory (MiB) one episode needs, for every harness (``None``: each harness's declared
    ``resources.memory_mb``, e.g. 1792 for OpenClaw); a node runs episodes only while their sum fits its memory."""
    node_cpus: float | None = None
    """CPUs of each node the fleet's episodes may use (``None``: all the node's Ray CPUs); the worker reserves
    them in Ray, so lower it to leave room for other Ray work on the nodes."""
    node_memory_mb: int | None = None
    """Memory (MiB) of each node the fleet's episodes may use (``None``: the node's Ray ``memory`` resource);
    reserved in Ray like ``node_cpus``."""
    ship_tasks: bool = True
    """Send a task's folders with its episode; a worker whose node lacks them materialises the shipped copy
    once per node in ``ship_cache_dir`` (keyed by content hash). Off: every node needs the folders at the
    same path (a shared filesystem)."""
    ship_max_mb: float = 64.0
    """Largest task (its folders' files, in MiB) that is shipped; a larger one must be on every node."""
    ship_cache_dir: str | None = None
    """Folder on each node for shipped tasks (``None``: ``$CLAWGYM_CACHE/fleet-tasks``)."""
    ship_cache_max_mb: float = 2048.0
    """Size cap of a node's shipped-task cache: the least recently used entries are evicted to make room."""
    max_attempts: int = 3
    """Tries per episode: an attempt ending in a retriable ``infra_error`` is tried again on another
    node until this many attempts were made; the last attempt's record is the episode's."""
    retry_boundaries: tuple[str, ...] = RETRIABLE_BOUNDARIES
    """Failure boundaries of ``infra_error`` attempts that are retried (see :data:`RETRIABLE_BOUNDARIES`)."""
    episode_deadline_s: float | None = None
    """Seconds after which a dispatched episode with no result is abandoned as an infrastructure
    failure and retried (``None``: the task's ``timeout_s + reward_timeout_s`` plus ``deadline_grace_s``)."""
    deadline_grace_s: float = 120.0
    """Added to the task's own limits when ``episode_deadline_s`` is ``None``."""
    max_worker_restarts: int = 3
    """How often Ray restarts a worker whose process died before the node's worker is given up."""
    start_timeout_s: float = 300.0
    """Seconds a worker may take to start (policy and tokenizer load) or to answer a health probe."""
    max_context_tokens: int | None = None
    """The serving proxy's context limit in each worker (``None``: the proxy's default)."""
    judge: Judge | None = None
    """LLM judge object for graders that need one (picklable; ``None``: the environment-configured judge)."""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Environment variables set in every worker process (e.g. ``CLAWGYM_UPSTREAM_BASE_URL``)."""
    worker_setup: Callable[[WorkerInfo], None] | None = None
    """Picklable function run in each worker process at start (register plugins there: a runtime
    registration in the driver process does not reach the workers)."""
    install_harnesses: bool = True
    """Call ``adapter.install()`` once per harness in each worker before its first episode."""
    poll_s: float = 0.5
    """How often the scheduler wakes up to check deadlines and worker health without a result."""

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str]] = [
            (bool(self.policy) and isinstance(self.policy, str),
             "policy: give a policy spec string such as 'scripted:expert' or 'vllm:http://HOST:PORT'"),
            (self.max_episodes_per_node >= 1, "max_episodes_per_node: must be >= 1"),
            (self.sandbox_pool >= 0 and (self.sandbox_pool == 0 or self.sandbox == "docker"),
             "sandbox_pool: warm sandboxes are for sandbox='docker' only (a bwrap sandbox starts in milliseconds); "
             "set sandbox='docker' or leave sandbox_pool at 0"),
            (self.episode_cpus is None or self.episode_cpus > 0,
             "episode_cpus: must be > 0 or None (use a fraction such as 0.5 to pack more)"),
            (self.episode_memory_mb is None or self.episode_memory_mb > 0, "episode_memory_mb: must be > 0 or None"),
            (self.node_cpus is None or self.node_cpus > 0, "node_cpus: must be > 0 or None"),
            (self.node_memory_mb is None or self.node_memory_mb > 0, "node_memory_mb: must be > 0 or None"),
            (self.ship_max_mb > 0 and self.ship_cache_max_mb >= self.ship_max_mb,
             "ship_max_mb: must be > 0 and at most ship_cache_max_mb"),
            (self.max_attempts >= 1, "max_attempts: must be >= 1 (1 means never retry)"),
            (self.episode_deadline_s is None or self.episode_deadline_s > 0, "episode_deadline_s: must be > 0 or None"),
            (self.deadline_grace_s >= 0, "deadline_grace_s: must be >= 0"),
            (self.max_worker_restarts >= 0, "max_worker_restarts: must be >= 0"),
            (self.start_timeout_s > 0, "start_timeout_s: must be > 0"),
            (self.poll_s > 0, "poll_s: must be > 0"),
        ]
        bad = [why for ok, why in checks if not ok]
        if bad:
            raise ValueError("invalid FleetConfig: " + "; ".join(bad))

    def needs(self, adapter: HarnessAdapter | None = None) -> EpisodeResources:
        """What one episode of ``adapter`` needs on its node: its declared resources, with the fleet's overrides."""
        declared = getattr(adapter, "resources", None) or EpisodeResources()
        return EpisodeResources(cpus=self.episode_cpus if self.episode_cpus is not None else declared.cpus,
                                memory_mb=self.episode_memory_mb if self.episode_memory_mb is not None
                                else declared.memory_mb)

    def node_budget(self, resources: dict[str, float]) -> tuple[float, int]:
        """``(cpus, memory_mb)`` of a node (its Ray ``resources``) that the fleet's episodes may use together."""
        cpus = float(resources.get("CPU", 0.0))
        memory_mb = int(resources.get("memory", 0.0) // 2**20)
        if self.node_cpus is not None:
            cpus = min(cpus, self.node_cpus)
        if self.node_memory_mb is not None:
            memory_mb = min(memory_mb, self.node_memory_mb)
        return cpus, memory_mb

    def node_capacity(self, cpus: float, memory_bytes: float | None = None,
                      needs: EpisodeResources | None = None) -> int:
        """Episodes of ``needs`` (default: the overrides, else :class:`EpisodeResources` ()) that a node with
        ``cpus`` CPUs (and ``memory_bytes`` of memory, when known) runs at once, within the per-node cap."""
        needs = needs or self.needs()
        cap = min(self.max_episodes_per_node, math.floor(cpus / needs.cpus + 1e-9))
        if memory_bytes:
            cap = min(cap, math.floor(memory_bytes / (needs.memory_mb * 2**20) + 1e-9))
        return max(cap, 0)

    def deadline_for(self, task: Task) -> float:
        """Seconds a dispatched episode of ``task`` may take before it is abandoned and retried."""
        if self.episode_deadline_s is not None:
            return self.episode_deadline_s
        return task.limits.timeout_s + task.limits.reward_timeout_s + self.deadline_grace_s


class EpisodeOptions(TypedDict, total=False):
    """The keywords of :func:`~clawgym_env.episodes.run.run_episode` a batch passes to every episode of it
    (an absent key: ``run_episode``'s default, or the worker's ``sandbox``/``out_dir``/``judge``)."""

    sandbox: str
    sampling: SamplingOverrides | Mapping[str, object] | None
    policy_version: int | None
    out_dir: str | Path | None
    keep_workspace: bool
    grade: bool
    trace_network: bool
    judge: Judge | None


def episode_options(*, sampling: SamplingOverrides | Mapping[str, object] | None = None,
                    policy_version: int | None = None, keep_workspace: bool = False, grade: bool = True,
                    trace_network: bool = False, sandbox: str | None = None, out_dir: str | Path | None = None,
                    judge: Judge | None = None) -> EpisodeOptions:
    """The :class:`EpisodeOptions` of a batch; ``sandbox``, ``out_dir`` and ``judge`` are left out when None
    (the runner's own apply)."""
    options = EpisodeOptions(sampling=sampling, policy_version=policy_version, keep_workspace=keep_workspace,
                             grade=grade, trace_network=trace_network)
    if sandbox is not None:
        options["sandbox"] = sandbox
    if out_dir is not None:
        options["out_dir"] = out_dir
    if judge is not None:
        options["judge"] = judge
    return options


@dataclasses.dataclass(frozen=True)
class EpisodeJob:
    """One requested episode: ``task`` run for the ``sample``-th time through the batch's ``adapter``-th
    harness (named ``harness``, needing ``needs``); ``index`` in the batch."""

    index: int
    task: Task
    sample: int
    adapter: int = 0
    harness: str = "harness"
    needs: EpisodeResources = EpisodeResources()


@dataclasses.dataclass
class Attempt:
    """One try of a job on one worker (the scheduler's bookkeeping)."""

    job: EpisodeJob
    worker: int
    number: int
    started: float
    deadline: float
    avoid: frozenset[int] = frozenset()
    """Workers this job already failed on (a retry prefers the others)."""


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
    """A try that ended in an infrastructure failure (kept in the fleet's report, never a result
    unless it was the job's last try)."""

    index: int
    task_id: str
    sample: int
    attempt: int
    node: str
    boundary: str | None
    error: str | None
    retried: bool
