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
from pathlib import Path
from typing import Any, Iterable, Sequence

from clawgym_env.capture.records import EpisodeRecord
from clawgym_env.episode import EpisodeResult, run_episode
from clawgym_env.failures import exception_failure
from clawgym_env.policy import PolicyBackend
from clawgym_env.harness import HarnessAdapter
from clawgym_env.task import Task


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
    context manager, or let :meth:`close` run at interpreter exit.
    """

    def __init__(self, policy: PolicyBackend | str, *, sandbox: str = "bwrap", out_dir: str | Path | None = None,
                 max_context_tokens: int | None = None, judge: Any = None) -> None:
        from clawgym_env.policy import make_policy

        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.policy.tokenizer  # noqa: B018 - load it now, not first inside concurrent episodes
        self.sandbox = sandbox
        self.out_dir = Path(out_dir) if out_dir else None
        self.judge = judge
        """LLM judge for tasks graded by one (None: the environment-configured judge)."""
        self._max_context = max_context_tokens
        self._proxy = None
        self._lock = threading.Lock()

    @property
    def proxy(self):
        with self._lock:
            if self._proxy is None:
                from clawgym_env.proxy.server import ProxyServer

                kwargs = {"max_context_tokens": self._max_context} if self._max_context else {}
                proxy = ProxyServer(self.policy, **kwargs)
                proxy.start()
                self._proxy = proxy
            return self._proxy

    def run(self, task: Task, adapter: HarnessAdapter, **kwargs: Any) -> EpisodeResult:
        kwargs.setdefault("sandbox", self.sandbox)
        kwargs.setdefault("out_dir", self.out_dir)
        kwargs.setdefault("judge", self.judge)
        return run_episode(task, adapter, self.proxy, **kwargs)

    def close(self) -> None:
        with self._lock:
            if self._proxy is not None:
                self._proxy.stop()
                self._proxy = None

    def __enter__(self) -> "Runtime":
        self.proxy  # noqa: B018 - start eagerly inside the with
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RolloutPool:
    """Run many episodes concurrently against one runtime (threads; each episode is its own sandbox).

    >>> with Runtime("scripted:expert") as rt:
    ...     results = RolloutPool(rt, concurrency=4).run(tasks, make_harness("mini"))
    """

    def __init__(self, runtime: Runtime, concurrency: int = 4, progress: bool = True) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.runtime = runtime
        self.concurrency = concurrency
        self.progress = progress

    def run(self, tasks: Sequence[Task] | Iterable[Task], adapter: HarnessAdapter, *, samples: int = 1,
            **kwargs: Any) -> list[EpisodeResult]:
        """Run ``samples`` episodes of each task; results come back in task order."""
        jobs = [t for t in tasks for _ in range(samples)]
        results: list[EpisodeResult | None] = [None] * len(jobs)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(jobs), desc=f"{adapter.name} episodes", unit="ep")
        with cf.ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futs = {pool.submit(self.runtime.run, task, adapter, **kwargs): i for i, task in enumerate(jobs)}
            for fut in cf.as_completed(futs):
                i = futs[fut]
                try:
                    results[i] = fut.result()
                except Exception as exc:  # noqa: BLE001 - one failed rollout never sinks the batch
                    log.error("episode of %s raised", jobs[i].id, exc_info=exc)
                    results[i] = failed_episode(jobs[i], adapter.name, getattr(self.runtime.policy, "name", "policy"),
                                                exc)
                if bar is not None:
                    rec = results[futs[fut]].record
                    bar.set_postfix_str(f"{rec.task_id}: {rec.status} r={rec.reward:.2f}")
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [r for r in results if r is not None]  # all set: every future completed
