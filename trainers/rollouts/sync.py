"""Rollouts for trainers: groups of episodes through one or several harnesses, and held-out evaluation.

:func:`collect_groups` runs ``group_size`` episodes of each (task, harness) job concurrently against
one :class:`~clawgym_env.envs.runtime.Runtime` (one policy behind one proxy); :func:`harness_plan` splits
a step's groups between harnesses by their configured ratios; :func:`evaluate` measures a pass rate.

Invariants: results come back in job order, ``group_size`` consecutive results per job; an episode
that raises instead of returning a record (a programming or proxy error outside the episode
runner's own handling) becomes an ``infra_error`` record naming its failure boundary
(:func:`clawgym_env.envs.runtime.failed_episode`), so one failed rollout never ends a training run; only
task outcomes are trained or scored: records with ``is_infra_failure`` (``infra_error`` and
``reward_invalid``) are excluded from :func:`evaluate`'s rates and counted; a harness whose pinned
package is not installed is left out of the plan with a warning (``mini`` needs no install).

On a Ray cluster (:class:`RolloutConfig` ``backend="ray"``), :class:`RolloutFleet` serves the
trainer's in-process policy over HTTP (:func:`clawgym_env.policy.remote.serve_policy`, on the node
address Ray reports, behind a fresh secret token) and starts one
:class:`~clawgym_env.fleet.RayFleet` whose workers build ``remote:http://IP:PORT``; :func:`run_jobs`
then sends a step's episodes to the fleet instead of threads, with the same results in the same
order, all harnesses of a step in one batch (their episodes overlap on the nodes, each holding its
harness's declared resources); :func:`fleet_metrics` gives the fleet's counts for the metrics file.
Every call's ``policy_version`` is the served policy's at sampling time, i.e. the trainer's
version when the step's rollouts ran.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from clawgym_env.envs.runtime import failed_episode
from clawgym_env.episodes.run import EpisodeResult
from clawgym_env.errors import HarnessError
from clawgym_env.grading.judge import Judge
from clawgym_env.harness import HarnessAdapter
from clawgym_env.jsontypes import JSONObject
from clawgym_env.plugins import harnesses, make_harness
from clawgym_env.policy.base import PolicyBackend, SamplingOverrides
from clawgym_env.task import Task

if TYPE_CHECKING:
    from clawgym_env.fleet import RayFleet
    from clawgym_env.policy.remote import PolicyServer

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RolloutConfig:
    """Where a trainer's rollouts run: this process's threads, or a Ray cluster's rollout workers."""

    backend: Literal["threads", "ray"] = "threads"
    """``threads``: episodes run in this process (``concurrency`` at once); ``ray``: on one rollout worker per Ray
    node, each with its own sandboxes and serving proxy, sampling from the trainer's policy over HTTP (token ids,
    token-exact; set ``CLAWGYM_REMOTE_POLICY_TOKEN`` yourself only to reach the policy from elsewhere). Held-out
    evaluation stays on threads"""
    ray_address: str | None = None
    """Ray cluster to join with ``backend: ray`` (``auto``: the running one, as ``ray start`` made it; ``None``: the
    one this process is connected to, else a local one started for the run)"""
    max_episodes_per_node: int = 4
    """with ``backend: ray``, the most episodes one node runs at once (also bounded by its CPUs, one each)"""
    max_attempts: int = 3
    """with ``backend: ray``, tries per episode: one ending in an infrastructure failure (a killed worker, a sandbox
    that cannot start, a hung harness) is tried again on another node up to this many times; it never trains"""
    sandbox_pool: int = 0
    """with ``sandbox: docker``, warm containers kept ahead per sandbox shape so that an episode's sandbox starts
    without waiting for the engine: in this process (``threads``) or in each node's rollout worker (``ray``); 0: every
    sandbox starts cold (bwrap needs none)"""

    def __post_init__(self) -> None:
        if self.backend not in ("threads", "ray"):
            raise ValueError(f"rollout.backend must be 'threads' or 'ray', not {self.backend!r}")
        if self.max_episodes_per_node < 1 or self.max_attempts < 1:
            raise ValueError("rollout.max_episodes_per_node and rollout.max_attempts must be >= 1")
        if self.sandbox_pool < 0:
            raise ValueError("rollout.sandbox_pool must be >= 0 (0: every sandbox starts cold)")


def harness_available(name: str, adapter: HarnessAdapter | None = None) -> tuple[bool, str]:
    """(usable, reason): a harness with a pinned npm package must have it installed (where ``adapter``, the run's
    own, looks for it: its harness cache; default: a plain one of ``name``)."""

    key = name.replace("_", "-").lower()
    if adapter is None and key not in harnesses:
        return False, f"unknown harness {name!r}"
    why = (adapter or make_harness(key)).missing()
    return why is None, why or ""


def harness_plan(ratios: dict[str, float], groups: int, *,
                 adapters: Mapping[str, HarnessAdapter] | None = None) -> dict[str, int]:
    """Split ``groups`` groups between the available harnesses in proportion to ``ratios``.

    Largest-remainder rounding, ties broken by name (deterministic). Unavailable harnesses are
    dropped with a warning; at least one must remain. ``adapters`` (the run's own, by name) are asked whether
    their harness is installed.
    """
    usable = {}
    for name, ratio in ratios.items():
        if ratio <= 0:
            continue
        ok, why = harness_available(name, (adapters or {}).get(name))
        if ok:
            usable[name] = float(ratio)
        else:
            log.warning("harness %s left out of the mix: %s", name, why)
    if not usable:
        raise HarnessError(f"no usable harness among {sorted(ratios)}; install one (`clawgym harness install NAME`) "
                           "or use mini")
    total = sum(usable.values())
    exact = {h: groups * r / total for h, r in usable.items()}
    plan = {h: int(v) for h, v in exact.items()}
    order = sorted(usable, key=lambda h: (-round(exact[h] - plan[h], 9), h))
    for h in order[: groups - sum(plan.values())]:
        plan[h] += 1
    return {h: n for h, n in plan.items() if n > 0}


def _failed(task: Task, harness: str, policy: str, exc: BaseException) -> EpisodeResult:
    return failed_episode(task, harness, policy, exc)


def judge_for(tasks: Sequence[Task]) -> Any:
    """The environment-configured LLM judge when any of ``tasks`` is graded by one, built now so that a
    missing configuration fails before the first rollout (naming the ``CLAWGYM_JUDGE_*`` variables)
    instead of turning every judged episode into ``reward_invalid``; ``None`` when no task needs one."""
    from clawgym_env.grading.grade import needs_judge

    if not any(needs_judge(t) for t in tasks):
        return None
    from tasks.graders import env_judge

    return env_judge()


class RolloutFleet:
    """A trainer's rollouts on Ray: its policy served over HTTP, one fleet of rollout workers (module doc).

    Start it once per run (a context manager), then :meth:`run` each step's jobs. Invariants: the
    served object is the trainer's own serving policy, so a weight sync is seen by the next call; the
    token is fresh per run and reaches the workers only through the fleet's environment; :meth:`close`
    stops the workers, the server and the Ray connection this object opened (not one it found open).
    """

    def __init__(self, config: RolloutConfig, policy: PolicyBackend, *, sandbox: str = "bwrap",
                 out_dir: str | Path | None = None, judge: Judge | None = None) -> None:
        self.config = config
        self.policy = policy
        self.sandbox = sandbox
        self.out_dir = str(Path(out_dir).resolve()) if out_dir else None
        self.judge = judge
        self.server: PolicyServer | None = None
        self.fleet: RayFleet | None = None
        self._started_ray = False

    def start(self) -> RolloutFleet:
        """Join Ray, serve the policy on this node's address, start the workers (idempotent)."""
        if self.fleet is not None:
            return self
        from clawgym_env.fleet import FleetConfig, RayFleet
        from clawgym_env.fleet.scheduler import import_ray
        from clawgym_env.policy.remote import TOKEN_ENV, serve_policy

        ray = import_ray()
        try:
            if not ray.is_initialized():
                ray.init(address=self.config.ray_address, ignore_reinit_error=True)
                self._started_ray = True
            self.server = serve_policy(self.policy, host=ray.util.get_node_ip_address())
            fleet = FleetConfig(policy=f"remote:{self.server.url}", address=self.config.ray_address,
                                sandbox=self.sandbox, sandbox_pool=self.config.sandbox_pool, out_dir=self.out_dir,
                                judge=self.judge, max_episodes_per_node=self.config.max_episodes_per_node,
                                max_attempts=self.config.max_attempts, env={TOKEN_ENV: self.server.token})
            self.fleet = RayFleet(fleet).start()
        except BaseException:
            self.close()
            raise
        log.info("rollouts on Ray: %d worker(s), policy served at %s", len(self.fleet.workers), self.server.url)
        return self

    def run(self, jobs: Sequence[tuple[Task, str]], adapters: Mapping[str, Any], *, group_size: int = 1,
            sampling: SamplingOverrides | None = None, policy_version: int | None = None,
            progress: Callable[[EpisodeResult], None] | None = None, keep_workspace: bool = False,
            grade: bool = True, judge: Judge | None = None) -> list[EpisodeResult]:
        """:func:`run_jobs` on the fleet: ``group_size`` episodes per job, results in job order, every
        harness in one fleet batch so that their episodes overlap (the keywords go to ``run_episode`` on the
        workers; ``judge`` None: this fleet's)."""
        fleet = self.start().fleet
        assert fleet is not None

        def done(_: int, result: EpisodeResult) -> None:
            if progress is not None:
                progress(result)

        return fleet.run_mixed([(t, s, adapters[h]) for t, h in jobs for s in range(group_size)], on_result=done,
                               sampling=sampling, policy_version=policy_version, keep_workspace=keep_workspace,
                               grade=grade, judge=judge)

    def metrics(self) -> dict[str, float | int]:
        """The fleet's counts of its current (or last) batch as flat metrics (:func:`fleet_metrics`)."""
        return fleet_metrics(self)

    def close(self) -> None:
        """Stop the workers, the policy server, and Ray if this object started it; idempotent."""
        if self.fleet is not None:
            self.fleet.close()
            self.fleet = None
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._started_ray:
            from clawgym_env.fleet.scheduler import import_ray

            import_ray().shutdown()
            self._started_ray = False

    def __enter__(self) -> RolloutFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def fleet_metrics(fleet: RolloutFleet | RayFleet | None) -> dict[str, float | int]:
    """Flat metrics of a rollout fleet's current (or last) batch for a trainer's metrics file: ``fleet/running``,
    ``fleet/done``, ``fleet/queue_depth``, ``fleet/infra_failed``, ``fleet/calls_per_s``, ...,
    ``fleet/node/<node>/done``, ``fleet/harness/<harness>/infra_failed`` (empty for ``None``: threads)."""
    from clawgym_env.fleet.stats import fleet_metrics as metrics_of

    return metrics_of(fleet) if fleet is not None else {}


def rollout_fleet(config: RolloutConfig, policy: PolicyBackend, *, sandbox: str = "bwrap",
                  out_dir: str | Path | None = None,
                  judge: Judge | None = None) -> AbstractContextManager[RolloutFleet | None]:
    """A started :class:`RolloutFleet` for ``backend: ray`` (the keywords are its own), ``None`` for threads."""
    if config.backend != "ray":
        return contextlib.nullcontext()
    return RolloutFleet(config, policy, sandbox=sandbox, out_dir=out_dir, judge=judge)


def run_jobs(runtime, jobs: Sequence[tuple[Task, str]], *, group_size: int = 1,
             sampling: SamplingOverrides | Mapping[str, Any] | None = None,
             policy_version: int | None = None, concurrency: int = 4, progress: Any = None,
             adapters: dict[str, HarnessAdapter] | None = None, judge: Judge | None = None,
             fleet: RolloutFleet | None = None) -> list[EpisodeResult]:
    """Run ``group_size`` episodes of each ``(task, harness)`` job; results in job order.

    ``progress``: an optional callable ``progress(result)`` called as each episode finishes.
    ``judge``: the LLM judge for tasks graded by one (None: the runtime's, else the environment's).
    ``fleet``: run the episodes on this Ray fleet instead of ``concurrency`` threads (the same results).
    """
    adapters = dict(adapters or {})
    sampling = SamplingOverrides.of(sampling)
    for _, h in jobs:
        if h not in adapters:
            adapters[h] = make_harness(h)
    if fleet is not None:
        return fleet.run(jobs, adapters, group_size=group_size, sampling=sampling, policy_version=policy_version,
                         progress=progress, judge=judge)
    extra = {"judge": judge} if judge is not None else {}  # a runtime without a judge keyword still works
    flat = [(t, h) for t, h in jobs for _ in range(group_size)]
    out: list[EpisodeResult | None] = [None] * len(flat)
    policy_name = getattr(runtime.policy, "name", "policy")
    with cf.ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futs = {pool.submit(runtime.run, t, adapters[h], sampling=sampling,
                            policy_version=policy_version, **extra): i for i, (t, h) in enumerate(flat)}
        for fut in cf.as_completed(futs):
            i = futs[fut]
            try:
                out[i] = fut.result()
            except Exception as exc:  # noqa: BLE001 - a failed rollout is a record, not a crash
                log.warning("episode of %s through %s raised: %s", flat[i][0].id, flat[i][1], exc)
                out[i] = _failed(flat[i][0], flat[i][1], policy_name, exc)
            if progress is not None:
                progress(out[i])
    return [r for r in out if r is not None]


def evaluate(runtime, tasks: Sequence[Task], harness: str = "mini", *, samples: int = 1,
             sampling: SamplingOverrides | Mapping[str, Any] | None = None, concurrency: int = 4,
             pass_threshold: float = 1.0,
             progress: Any = None, adapter: HarnessAdapter | None = None) -> JSONObject:
    """Pass rate of the runtime's policy on ``tasks`` (``samples`` episodes each).

    Returns ``{"episodes", "passed", "pass_rate", "reward_mean", "infra_failures", "results"}``;
    infrastructure failures are excluded from ``episodes`` and the rates, and counted. ``adapter``: the run's own
    adapter of ``harness`` (its options and harness cache); default a plain one.
    """
    results = run_jobs(runtime, [(t, harness) for t in tasks], group_size=samples, sampling=sampling,
                       concurrency=concurrency, progress=progress,
                       adapters={harness: adapter} if adapter is not None else None)
    scored = [r.record for r in results if r.record.is_task_outcome]
    passed = sum(r.reward >= pass_threshold for r in scored)
    return {"episodes": len(scored), "passed": passed, "pass_rate": passed / len(scored) if scored else None,
            "reward_mean": sum(r.reward for r in scored) / len(scored) if scored else None,
            "infra_failures": len(results) - len(scored), "results": results}
