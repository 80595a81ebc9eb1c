"""A runtime: one policy behind one serving proxy, shared by any number of concurrent episodes.

``Runtime`` is the unit that several envs (or a rollout pool) share, so that N episodes run at once
against a single policy: each episode gets its own proxy base URL, sandbox and workspace; the
proxy serialises nothing but the policy's own ``generate`` (which is thread safe).

Invariant of :class:`RolloutPool`: every job ends with exactly one result, in job order; an
episode that raises (a bug, or an error outside the episode runner's own handling) becomes an
``infra_error`` record naming the boundary (:func:`failed_episode`), never a lost batch.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from clawgym_env.capture.records import EpisodeRecord
from clawgym_env.episodes.run import EpisodeResult, run_episode
from clawgym_env.failures import exception_failure
from clawgym_env.fleet.config import EpisodeOptions, episode_options
from clawgym_env.grading.judge import Judge
from clawgym_env.harness import HarnessAdapter
from clawgym_env.policy import PolicyBackend
from clawgym_env.policy.base import SamplingOverrides
from clawgym_env.task import Task

if TYPE_CHECKING:
    from clawgym_env.fleet import FleetConfig, FleetProgress, RayFleet
    from clawgym_env.proxy.server import ProxyServer
    from clawgym_env.sandbox.docker.pool import DockerPool


log = logging.getLogger(__name__)


def failed_episode(task: Task, harness: str, policy: str, exc: BaseException) -> EpisodeResult:
    """The one record of an episode whose run raised ``exc`` (classified by
    :func:`~clawgym_env.failures.exception_failure`; never a task outcome)."""
    verdict = exception_failure(exc)
    rec = EpisodeRecord(episode_id=uuid.uuid4().hex[:16], task_id=task.id, suite=task.suite, harness=harness,
                        policy=policy, status=verdict.status, failure_boundary=verdict.boundary, error=verdict.error)
    return EpisodeResult(rec, [])


class Runtime:
    """Owns a started :class:`~clawgym_env.proxy.server.ProxyServer` around ``policy``.

    ``policy`` is a :class:`PolicyBackend` or a spec string for :func:`clawgym_env.policy.make_policy`
    (``"scripted:expert"``, ``"transformers:DIR"``, ...). Start/stop are idempotent; use as a
    context manager, or let :meth:`close` run at interpreter exit. A policy built here from a spec belongs to
    the runtime: :meth:`close` closes it (and a later episode builds it again); a policy object given to the
    constructor belongs to the caller and is never closed here.
    """

    def __init__(self, policy: PolicyBackend | str, *, sandbox: str = "bwrap", out_dir: str | Path | None = None,
                 max_context_tokens: int | None = None, judge: Judge | None = None, sandbox_pool: int = 0) -> None:
        from clawgym_env.policy import make_policy

        if sandbox_pool < 0 or (sandbox_pool and sandbox != "docker"):
            raise ValueError(f"sandbox_pool={sandbox_pool}: a pool of warm sandboxes is for sandbox='docker' only "
                             f"(not {sandbox!r}: a bwrap sandbox starts in milliseconds); use sandbox='docker' or "
                             "leave the pool at 0")

        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.policy_spec: str | None = policy if isinstance(policy, str) else None
        """The spec string the policy was built from (``None`` for a policy object): what a Ray
        rollout worker builds its own copy from."""
        self.policy.tokenizer  # noqa: B018 - load it now, not first inside concurrent episodes
        self.sandbox = sandbox
        self.out_dir = Path(out_dir) if out_dir else None
        self.judge = judge
        """LLM judge for tasks graded by one (None: the environment-configured judge)."""
        self._max_context = max_context_tokens
        self.sandbox_pool = sandbox_pool
        """Warm Docker containers kept ahead per sandbox shape (:class:`~clawgym_env.sandbox.docker.pool.DockerPool`,
        made on the first episode, closed with the runtime); 0: every sandbox starts cold."""
        self._pool: DockerPool | None = None
        self._proxy: ProxyServer | None = None
        self._policy_closed = False  # the policy built from policy_spec was closed by close()
        self._lock = threading.Lock()

    @property
    def proxy(self) -> ProxyServer:
        """The runtime's serving proxy, started on first use (one for every episode of this runtime)."""
        with self._lock:
            if self._proxy is None:
                from clawgym_env.proxy.server import ProxyServer

                if self._policy_closed and self.policy_spec is not None:  # closed by close(): build it again
                    from clawgym_env.policy import make_policy

                    self.policy, self._policy_closed = make_policy(self.policy_spec), False

                proxy = (ProxyServer(self.policy, max_context_tokens=self._max_context) if self._max_context
                         else ProxyServer(self.policy))
                proxy.start()
                self._proxy = proxy
            return self._proxy

    def run(self, task: Task, adapter: HarnessAdapter, *, sandbox: str | None = None,
            sampling: SamplingOverrides | Mapping[str, object] | None = None, policy_version: int | None = None,
            out_dir: str | Path | None = None, keep_workspace: bool = False, episode_id: str | None = None,
            grade: bool = True, trace_network: bool = False, judge: Judge | None = None) -> EpisodeResult:
        """One episode of ``task`` through ``adapter`` on this runtime's proxy (:func:`run_episode`, whose
        keywords these are); ``sandbox``, ``out_dir`` and ``judge`` None: the runtime's."""
        if sandbox is None and self.sandbox_pool:
            with self._lock:
                if self._pool is None:
                    from clawgym_env.sandbox.docker.pool import DockerPool

                    self._pool = DockerPool(self.sandbox_pool)
                sandbox = self._pool.name
        return run_episode(task, adapter, self.proxy, sandbox=self.sandbox if sandbox is None else sandbox,
                           sampling=sampling, policy_version=policy_version,
                           out_dir=self.out_dir if out_dir is None else out_dir, keep_workspace=keep_workspace,
                           episode_id=episode_id, grade=grade, trace_network=trace_network,
                           judge=self.judge if judge is None else judge)

    def close(self) -> None:
        """Stop the proxy if it was started (a later episode starts a new one), the sandbox pool and a policy
        built from a spec (a later episode builds it again); idempotent."""
        with self._lock:
            pool, self._pool = self._pool, None
            if self._proxy is not None:
                self._proxy.stop()
                self._proxy = None
            if self.policy_spec is not None and not self._policy_closed:
                self._policy_closed = True
                try:
                    self.policy.close()
                except Exception as exc:  # noqa: BLE001 - closing must not hide the run's own outcome
                    log.warning("closing the policy %s failed: %s: %s", self.policy_spec, type(exc).__name__, exc)
        if pool is not None:
            pool.close()

    def __enter__(self) -> Runtime:
        self.proxy  # noqa: B018 - start eagerly inside the with
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RolloutPool:
    """Run many episodes concurrently against one runtime (each episode is its own sandbox).

    ``backend="threads"`` (default): a thread per episode in this process, ``concurrency`` at once,
    against ``runtime``'s proxy. ``backend="ray"``: a :class:`~clawgym_env.fleet.RayFleet` of rollout
    workers, one per Ray node, each with its own proxy and a copy of the policy built from
    ``runtime.policy_spec`` (``concurrency`` is then the per-node cap), or as configured by ``fleet``
    (a :class:`~clawgym_env.fleet.FleetConfig`, or a started :class:`~clawgym_env.fleet.RayFleet` to
    share; ``runtime`` may then be ``None``). Both give the same
    results: one :class:`EpisodeResult` per requested episode, in task order. The Ray workers stay up
    between :meth:`run` calls until :meth:`close` (or the ``with`` block's end).

    >>> with Runtime("scripted:expert") as rt:
    ...     results = RolloutPool(rt, concurrency=4).run(tasks, make_harness("mini"))
    """

    def __init__(self, runtime: Runtime | None, concurrency: int = 4, progress: bool = True, *,
                 backend: Literal["threads", "ray"] = "threads", fleet: FleetConfig | RayFleet | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if backend not in ("threads", "ray"):
            raise ValueError(f"backend must be 'threads' or 'ray', not {backend!r}")
        if backend == "threads" and runtime is None:
            raise ValueError("the threads backend needs a Runtime")
        if backend == "ray" and fleet is None:
            if runtime is None or runtime.policy_spec is None:
                raise ValueError("the ray backend builds the policy inside each worker from a spec string: create "
                                 "the Runtime from one (e.g. Runtime('vllm:http://HOST:PORT')) or pass "
                                 "fleet=FleetConfig(policy=...)")
            from clawgym_env.fleet import FleetConfig

            fleet = FleetConfig(policy=runtime.policy_spec, sandbox=runtime.sandbox,
                                out_dir=str(runtime.out_dir) if runtime.out_dir else None,
                                max_context_tokens=runtime._max_context, judge=runtime.judge,
                                max_episodes_per_node=concurrency, sandbox_pool=runtime.sandbox_pool)
        self.runtime = runtime
        self.concurrency = concurrency
        self.progress = progress
        self.backend = backend
        self.fleet_config: FleetConfig | None = None
        self.fleet: RayFleet | None = None
        """The Ray fleet (``backend="ray"``), started on the first :meth:`run` (or the one given)."""
        self._owns_fleet = True
        if fleet is not None:
            from clawgym_env.fleet import RayFleet

            if isinstance(fleet, RayFleet):
                self.fleet, self._owns_fleet = fleet, False
            else:
                self.fleet_config = fleet
        self.last_progress: FleetProgress | None = None
        """The Ray fleet's last progress snapshot (per-node and per-harness counts, episodes/s)."""

    def run(self, tasks: Sequence[Task] | Iterable[Task], adapter: HarnessAdapter, *, samples: int = 1,
            sampling: SamplingOverrides | Mapping[str, object] | None = None, policy_version: int | None = None,
            keep_workspace: bool = False, grade: bool = True, trace_network: bool = False,
            sandbox: str | None = None, out_dir: str | Path | None = None,
            judge: Judge | None = None) -> list[EpisodeResult]:
        """Run ``samples`` episodes of each task; results come back in task order. The keywords are
        :func:`run_episode`'s (``sandbox``, ``out_dir`` and ``judge`` None: the runtime's, or the fleet's)."""
        options = episode_options(sampling=sampling, policy_version=policy_version, keep_workspace=keep_workspace,
                                  grade=grade, trace_network=trace_network, sandbox=sandbox, out_dir=out_dir,
                                  judge=judge)
        if self.backend == "ray":
            return self._run_ray(tasks, adapter, samples=samples, options=options)
        assert self.runtime is not None
        jobs = [t for t in tasks for _ in range(samples)]
        results: list[EpisodeResult | None] = [None] * len(jobs)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(jobs), desc=f"{adapter.name} episodes", unit="ep")
        with cf.ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futs = {pool.submit(self.runtime.run, task, adapter, **options): i for i, task in enumerate(jobs)}
            for fut in cf.as_completed(futs):
                i = futs[fut]
                try:
                    result = fut.result()
                except Exception as exc:  # noqa: BLE001 - one failed rollout never sinks the batch
                    log.error("episode of %s raised", jobs[i].id, exc_info=exc)
                    result = failed_episode(jobs[i], adapter.name, getattr(self.runtime.policy, "name", "policy"), exc)
                results[i] = result
                if bar is not None:
                    rec = result.record
                    bar.set_postfix_str(f"{rec.task_id}: {rec.status} r={rec.reward:.2f}")
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [r for r in results if r is not None]  # all set: every future completed

    def _run_ray(self, tasks: Sequence[Task] | Iterable[Task], adapter: HarnessAdapter, *, samples: int,
                 options: EpisodeOptions) -> list[EpisodeResult]:
        from clawgym_env.fleet import RayFleet

        tasks = list(tasks)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(tasks) * samples, desc=f"{adapter.name} episodes (ray)", unit="ep")

        if self.fleet is None:
            assert self.fleet_config is not None
            self.fleet = RayFleet(self.fleet_config)
        before = self.fleet.progress

        def show(p: FleetProgress) -> None:
            self.last_progress = p
            if bar is not None:
                bar.update(p.done - bar.n)
                bar.set_postfix_str(p.line())
            if before is not None:
                before(p)

        self.fleet.progress = show
        try:
            return self.fleet.run(tasks, adapter, samples=samples, **options)
        finally:
            self.fleet.progress = before
            if bar is not None:
                bar.close()

    def close(self) -> None:
        """Stop the Ray fleet's workers if this pool started them (the threads backend holds nothing
        between runs; a fleet given to the pool is its owner's to close)."""
        if self.fleet is not None and self._owns_fleet:
            self.fleet.close()
            self.fleet = None

    def __enter__(self) -> RolloutPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
