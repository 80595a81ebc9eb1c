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

if TYPE_CHECKING:  # the same names for type checkers (``X as X``: re-exported); tests check they agree
    from clawgym_env import plugins as plugins
    from clawgym_env import testing as testing
    from clawgym_env.capture.records import CallRecord as CallRecord
    from clawgym_env.capture.records import EpisodeRecord as EpisodeRecord
    from clawgym_env.capture.records import EpisodeStatus as EpisodeStatus
    from clawgym_env.capture.records import WorkspaceChange as WorkspaceChange
    from clawgym_env.capture.tree import CallTree as CallTree
    from clawgym_env.capture.tree_io import read_jsonl as read_trees_jsonl  # noqa: F401 - exported under this name
    from clawgym_env.capture.tree_io import to_jsonl as write_trees_jsonl  # noqa: F401 - exported under this name
    from clawgym_env.capture.tree_meta import TreeMeta as TreeMeta
    from clawgym_env.envs.env import ClawGymEnv as ClawGymEnv
    from clawgym_env.envs.runtime import RolloutPool as RolloutPool
    from clawgym_env.envs.runtime import Runtime as Runtime
    from clawgym_env.episodes.run import EpisodeResult as EpisodeResult
    from clawgym_env.episodes.run import run_episode as run_episode
    from clawgym_env.errors import ClawGymError as ClawGymError
    from clawgym_env.errors import CopyLimitError as CopyLimitError
    from clawgym_env.errors import HarnessError as HarnessError
    from clawgym_env.errors import PolicyError as PolicyError
    from clawgym_env.errors import ProxyError as ProxyError
    from clawgym_env.errors import RegistrationError as RegistrationError
    from clawgym_env.errors import SandboxError as SandboxError
    from clawgym_env.errors import TaskError as TaskError
    from clawgym_env.errors import WorkspaceError as WorkspaceError
    from clawgym_env.grading.grade import GradeContext as GradeContext
    from clawgym_env.grading.grade import Grader as Grader
    from clawgym_env.grading.grade import GradeResult as GradeResult
    from clawgym_env.grading.grade import grade_episode as grade_episode
    from clawgym_env.harness import Endpoint as Endpoint
    from clawgym_env.harness import HarnessAdapter as HarnessAdapter
    from clawgym_env.harness import HarnessOutput as HarnessOutput
    from clawgym_env.harness import LaunchSpec as LaunchSpec
    from clawgym_env.plugins import load_suite as load_suite
    from clawgym_env.plugins import make_harness as make_harness
    from clawgym_env.policy import Generation as Generation
    from clawgym_env.policy import GenerationContext as GenerationContext
    from clawgym_env.policy import PolicyBackend as PolicyBackend
    from clawgym_env.policy import SamplingParams as SamplingParams
    from clawgym_env.policy import make_policy as make_policy
    from clawgym_env.policy.base import SamplingOverrides as SamplingOverrides
    from clawgym_env.policy.tokenizer import load_tokenizer as load_tokenizer
    from clawgym_env.policy.transformers_backend import TransformersPolicy as TransformersPolicy
    from clawgym_env.proxy.server import ProxyServer as ProxyServer
    from clawgym_env.registration import ENV_IDS as ENV_IDS
    from clawgym_env.task import Suite as Suite
    from clawgym_env.task import Task as Task
    from clawgym_env.task import TaskLimits as TaskLimits
    from clawgym_env.task import TaskLoadIssue as TaskLoadIssue

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

__all__ = sorted(_EXPORTS)
"""The public names: the keys of ``_EXPORTS`` (the ``TYPE_CHECKING`` imports above name the same objects for
type checkers; a test checks that the two agree)."""


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
