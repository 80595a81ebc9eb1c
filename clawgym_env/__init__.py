"""ClawGym: black-box RL of LLM agents through real agent harnesses.

``import clawgym_env`` registers the Gymnasium environment ids (see :mod:`clawgym_env.registration`)::

    import gymnasium as gym, clawgym_env
    env = gym.make("ClawGym/Mini-v0", policy="scripted:expert")

The public API is importable from here (listed in ``__all__``)::

    from clawgym_env import Runtime, RolloutPool, load_suite, make_harness

    suite = load_suite("builtin")
    with Runtime("scripted:expert") as rt:
        results = RolloutPool(rt).run(suite.tasks[:4], make_harness("mini"))

Invariants: names are resolved lazily (module ``__getattr__``), so ``import clawgym_env`` imports
neither torch, transformers nor the proxy's web stack; each public name resolves to the one object
defined in its home module (``clawgym_env.Task is clawgym_env.task.Task``); the engine's plugins
(harnesses, suites, graders, ...) are found through :mod:`clawgym_env.plugins`, and the fakes for
testing your own code live in :mod:`clawgym_env.testing`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from clawgym_env.registration import register_all as _register_all

if TYPE_CHECKING:
    from clawgym_env import plugins, testing
    from clawgym_env.capture.records import CallRecord, EpisodeRecord, EpisodeStatus, WorkspaceChange
    from clawgym_env.capture.tree import CallTree
    from clawgym_env.capture.tree_io import read_jsonl as read_trees_jsonl
    from clawgym_env.capture.tree_io import to_jsonl as write_trees_jsonl
    from clawgym_env.capture.tree_meta import TreeMeta
    from clawgym_env.envs.env import ClawGymEnv
    from clawgym_env.envs.runtime import RolloutPool, Runtime
    from clawgym_env.episodes.run import EpisodeResult, run_episode
    from clawgym_env.errors import (
        ClawGymError,
        CopyLimitError,
        HarnessError,
        PolicyError,
        ProxyError,
        RegistrationError,
        SandboxError,
        TaskError,
        WorkspaceError,
    )
    from clawgym_env.grading.grade import GradeContext, Grader, GradeResult, grade_episode
    from clawgym_env.harness import Endpoint, HarnessAdapter, HarnessOutput, LaunchSpec
    from clawgym_env.plugins import load_suite, make_harness
    from clawgym_env.policy import Generation, GenerationContext, PolicyBackend, SamplingParams, make_policy
    from clawgym_env.policy.base import SamplingOverrides
    from clawgym_env.policy.tokenizer import load_tokenizer
    from clawgym_env.policy.transformers_backend import TransformersPolicy
    from clawgym_env.proxy.server import ProxyServer
    from clawgym_env.registration import ENV_IDS
    from clawgym_env.task import Suite, Task, TaskLimits, TaskLoadIssue

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # tasks and harnesses: the engine's seam types
    "Task": "clawgym_env.task:Task", "TaskLimits": "clawgym_env.task:TaskLimits",
    "Suite": "clawgym_env.task:Suite", "TaskLoadIssue": "clawgym_env.task:TaskLoadIssue",
    "HarnessAdapter": "clawgym_env.harness:HarnessAdapter", "Endpoint": "clawgym_env.harness:Endpoint",
    "LaunchSpec": "clawgym_env.harness:LaunchSpec", "HarnessOutput": "clawgym_env.harness:HarnessOutput",
    # running episodes
    "Runtime": "clawgym_env.envs.runtime:Runtime", "RolloutPool": "clawgym_env.envs.runtime:RolloutPool",
    "EpisodeResult": "clawgym_env.episodes.run:EpisodeResult", "run_episode": "clawgym_env.episodes.run:run_episode",
    "ClawGymEnv": "clawgym_env.envs.env:ClawGymEnv", "ENV_IDS": "clawgym_env.registration:ENV_IDS",
    "ProxyServer": "clawgym_env.proxy.server:ProxyServer",
    # policies
    "make_policy": "clawgym_env.policy:make_policy", "PolicyBackend": "clawgym_env.policy:PolicyBackend",
    "Generation": "clawgym_env.policy:Generation", "GenerationContext": "clawgym_env.policy:GenerationContext",
    "SamplingParams": "clawgym_env.policy:SamplingParams",
    "SamplingOverrides": "clawgym_env.policy.base:SamplingOverrides",
    "load_tokenizer": "clawgym_env.policy.tokenizer:load_tokenizer",
    "TransformersPolicy": "clawgym_env.policy.transformers_backend:TransformersPolicy",
    # captured data
    "CallRecord": "clawgym_env.capture.records:CallRecord",
    "EpisodeRecord": "clawgym_env.capture.records:EpisodeRecord",
    "EpisodeStatus": "clawgym_env.capture.records:EpisodeStatus",
    "WorkspaceChange": "clawgym_env.capture.records:WorkspaceChange",
    "CallTree": "clawgym_env.capture.tree:CallTree", "TreeMeta": "clawgym_env.capture.tree_meta:TreeMeta",
    "write_trees_jsonl": "clawgym_env.capture.tree_io:to_jsonl",
    "read_trees_jsonl": "clawgym_env.capture.tree_io:read_jsonl",
    # grading
    "Grader": "clawgym_env.grading.grade:Grader", "GradeContext": "clawgym_env.grading.grade:GradeContext",
    "GradeResult": "clawgym_env.grading.grade:GradeResult", "grade_episode": "clawgym_env.grading.grade:grade_episode",
    # plugins: one registry per kind, and the two lookups most code needs
    "plugins": "clawgym_env.plugins", "load_suite": "clawgym_env.plugins:load_suite",
    "make_harness": "clawgym_env.plugins:make_harness",
    # fakes for tests
    "testing": "clawgym_env.testing",
    # errors
    **{name: f"clawgym_env.errors:{name}" for name in (
        "ClawGymError", "TaskError", "SandboxError", "HarnessError", "ProxyError", "PolicyError",
        "RegistrationError", "WorkspaceError", "CopyLimitError")},
}

__all__ = [
    "CallRecord", "CallTree", "ClawGymEnv", "ClawGymError", "CopyLimitError", "ENV_IDS", "Endpoint", "EpisodeRecord",
    "EpisodeResult", "EpisodeStatus", "Generation", "GenerationContext", "GradeContext", "GradeResult", "Grader",
    "HarnessAdapter", "HarnessError", "HarnessOutput", "LaunchSpec", "PolicyBackend", "PolicyError", "ProxyError",
    "ProxyServer", "RegistrationError", "RolloutPool", "Runtime", "SamplingOverrides", "SamplingParams",
    "SandboxError", "Suite", "Task", "TaskError", "TaskLimits", "TaskLoadIssue", "TransformersPolicy", "TreeMeta",
    "WorkspaceChange", "WorkspaceError", "grade_episode", "load_suite", "load_tokenizer", "make_harness",
    "make_policy", "plugins", "read_trees_jsonl", "run_episode", "testing", "write_trees_jsonl",
]


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'clawgym_env' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    value: Any = importlib.import_module(module_name)
    if attr:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


_register_all()
