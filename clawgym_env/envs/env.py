"""The Gymnasium environment: one ``step`` is one whole sandboxed harness episode.

``reset(seed, options)`` picks a task — ``options={"task_id": "..."}`` or by seed from the suite —
and returns it as the observation. ``step(action)`` runs the harness on it against the policy
chosen at ``make`` time and returns the episode (captured calls with token ids, final message),
the reward in [0, 1], ``terminated=True`` (``truncated=True`` when the harness timed out) and an
``info`` with the status, sub-scores, timings and the full records. Spaces: :mod:`clawgym_env.spaces`.

The reward comes from the task's own grader inside the episode (:mod:`clawgym_env.grading.grade`):
``reward.sh``, ClawGym-Bench hybrid or JobBench judge — the same reward training and ``clawgym
eval`` see; ``judge=`` sets the LLM judge (default: the environment-configured one). An episode
with no valid reward has status ``reward_invalid``.

Several envs can share one :class:`~clawgym_env.envs.runtime.Runtime` (``runtime=``) to run episodes
concurrently against a single policy; see also :class:`~clawgym_env.envs.runtime.RolloutPool`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from clawgym_env import spaces as cg_spaces
from clawgym_env.envs.runtime import Runtime
from clawgym_env.episodes.run import EpisodeResult
from clawgym_env.errors import TaskError
from clawgym_env.grading.judge import Judge
from clawgym_env.plugins import load_suite, make_harness
from clawgym_env.policy import PolicyBackend
from clawgym_env.task import Suite, Task


class ClawGymEnv(gym.Env):
    """One ClawGym environment: a harness, a policy and a suite, chosen at construction.

    Invariants: ``step`` needs a ``reset`` before it (each task is stepped once); the env closes the
    :class:`~clawgym_env.envs.runtime.Runtime` only when it built it (not one passed as ``runtime=``)."""

    metadata = {"render_modes": []}

    def __init__(self, harness: str = "mini", policy: PolicyBackend | str = "scripted:expert",
                 suite: str | Suite = "builtin", *, runtime: Runtime | None = None, sandbox: str = "bwrap",
                 out_dir: str | Path | None = None,
                 harness_options: Mapping[str, object] | None = None, task_ids: list[str] | None = None,
                 judge: Judge | None = None) -> None:
        self.adapter = make_harness(harness, **(harness_options or {}))
        self.suite = suite if isinstance(suite, Suite) else load_suite(suite)
        tasks = list(self.suite.tasks)
        if task_ids:
            tasks = [self.suite.get(t) for t in task_ids]
        if not tasks:
            raise TaskError(f"suite {self.suite.name!r} has no loadable task")
        self.tasks = tasks
        self._owns_runtime = runtime is None
        self.runtime = runtime or Runtime(policy, sandbox=sandbox, out_dir=out_dir)
        self.judge = judge  # None: the runtime's judge, else the environment-configured one
        vocab = int(getattr(self.runtime.policy, "vocab_size", 0) or len(self.runtime.policy.tokenizer))
        self.observation_space = cg_spaces.observation_space(vocab)
        self.action_space = cg_spaces.action_space()
        self._task: Task | None = None
        self.last_result: EpisodeResult | None = None

    def _obs(self, task: Task, result: EpisodeResult | None = None) -> cg_spaces.Observation:
        calls: tuple[cg_spaces.CallObservation, ...] = ()
        status = final = ""
        if result is not None:
            calls = tuple(cg_spaces.CallObservation(
                prompt_token_ids=np.asarray(c.prompt_token_ids, dtype=np.int64),
                output_token_ids=np.asarray(c.output_token_ids, dtype=np.int64),
                output_logprobs=np.minimum(np.asarray(c.output_logprobs, dtype=np.float32), 0.0)) for c in result.calls)
            status, final = result.record.status, cg_spaces.clean_text(result.record.final_message)
        return {"task_id": cg_spaces.clean_text(task.full_id), "instruction": cg_spaces.clean_text(task.instruction),
                "status": status, "final_message": final, "calls": calls}

    # ``info`` stays dict[str, Any]: gymnasium's Env API types it so (reset and step override its methods)
    def reset(self, *, seed: int | None = None,
              options: Mapping[str, object] | None = None) -> tuple[cg_spaces.Observation, dict[str, Any]]:
        """Pick the next task (``options["task_id"]``, else by ``seed`` from the suite); returns its
        observation (no calls yet) and ``{"task": ...}``."""
        super().reset(seed=seed)
        options = options or {}
        if options.get("task_id"):
            tid = str(options["task_id"]).split("/")[-1]
            self._task = self.suite.get(tid)
        else:
            self._task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self.last_result = None
        return self._obs(self._task), {"task": self._task.model_dump(mode="json")}

    def step(self, action: cg_spaces.Action | None,
             ) -> tuple[cg_spaces.Observation, float, bool, bool, dict[str, Any]]:  # info: gymnasium's type
        """Run one whole episode on the current task with ``action``'s sampling overrides; returns
        ``(observation, reward, terminated, truncated, info)``, ``truncated`` when the harness timed out."""
        if self._task is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        sampling, version = cg_spaces.action_to_sampling(action)
        result = self.runtime.run(self._task, self.adapter, sampling=sampling, policy_version=version, judge=self.judge)
        self.last_result = result
        rec = result.record
        info = {"status": rec.status, "subscores": dict(rec.subscores), "timings": dict(rec.timings),
                "episode": rec.model_dump(mode="json"), "calls": [c.model_dump(mode="json") for c in result.calls],
                "is_infra_failure": rec.is_infra_failure}
        truncated = rec.status == "timeout"
        obs = self._obs(self._task, result)
        self._task = None
        return obs, float(rec.reward), not truncated, truncated, info

    def close(self) -> None:
        """Close the runtime if this env built it (its proxy and policy); idempotent."""
        if self._owns_runtime and getattr(self, "runtime", None) is not None:
            self.runtime.close()
