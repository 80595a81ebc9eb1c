"""Fakes for testing your own code against ClawGym: no model, no real harness, no LLM judge.

Everything here runs the real engine (real proxy, real sandbox, real tokenizer, real grading)
around stand-ins that are fast and predictable:

==========================  ======================================================================
name                        what it stands in for
==========================  ======================================================================
:class:`EchoScriptPolicy`   a model: answers ``"Echo: <user text>"``, calls an offered tool once
                            (:mod:`~clawgym_env.testing.policy`; ``echo_policy`` for the registry)
:class:`EchoHarness`        a harness: one Chat Completions call with the instruction, the answer
                            printed (:mod:`~clawgym_env.testing.harness`); :func:`sandbox_python`
                            names this Python as a sandbox sees it (for your own fake harnesses)
:func:`echo_suite`          a suite: three tiny task dirs graded by ``reward.sh``
                            (:mod:`~clawgym_env.testing.suite`; ``load_echo_suite`` for the registry)
:class:`JudgeServer`        an LLM judge: an OpenAI-compatible HTTP server answering from a Python
                            function (:mod:`~clawgym_env.testing.judge`)
:class:`Marked`, ...        left-behind process checks for harness authors
                            (:mod:`~clawgym_env.testing.processes`)
:class:`SlowPolicy`         a slow model: any policy held back on chosen calls, to test idle timeouts,
                            keep-alives and forced retries (:func:`fail_once`; :mod:`~clawgym_env.testing.slow`)
==========================  ======================================================================

Usage (a whole episode, graded, in a few seconds; needs bubblewrap and the Qwen3 tokenizer)::

    from clawgym_env import Runtime
    from clawgym_env.testing import EchoHarness, EchoScriptPolicy, echo_suite

    def test_my_pipeline(tmp_path):
        suite = echo_suite(tmp_path / "suite")
        with Runtime(EchoScriptPolicy(), out_dir=tmp_path / "episodes") as rt:
            results = [rt.run(task, EchoHarness()) for task in suite]
        assert [r.record.reward for r in results] == [1.0, 1.0, 0.0]

Invariants: this package imports only :mod:`clawgym_env` (never the project's task sources,
harness packages or trainers), so a third party can use it with the engine alone; names are
imported lazily, so ``import clawgym_env.testing`` starts no server and loads no tokenizer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clawgym_env.testing.harness import EchoHarness, sandbox_python
    from clawgym_env.testing.judge import JudgeServer, free_port, replying
    from clawgym_env.testing.policy import FAIL, EchoScriptPolicy, echo_policy
    from clawgym_env.testing.processes import MARKER_ENV, Marked, Watch, assert_no_survivors, survivors
    from clawgym_env.testing.slow import Delay, SlowPolicy, fail_once
    from clawgym_env.testing.suite import ECHO_TASKS, EchoTaskSpec, echo_suite, load_echo_suite

_EXPORTS: dict[str, str] = {
    "EchoScriptPolicy": "policy", "echo_policy": "policy", "FAIL": "policy",
    "EchoHarness": "harness", "sandbox_python": "harness",
    "EchoTaskSpec": "suite", "ECHO_TASKS": "suite", "echo_suite": "suite", "load_echo_suite": "suite",
    "JudgeServer": "judge", "replying": "judge", "free_port": "judge",
    "Marked": "processes", "Watch": "processes", "survivors": "processes", "assert_no_survivors": "processes",
    "MARKER_ENV": "processes",
    "SlowPolicy": "slow", "fail_once": "slow", "Delay": "slow",
}

__all__ = [
    "Delay", "ECHO_TASKS", "EchoHarness", "EchoScriptPolicy", "EchoTaskSpec", "FAIL", "JudgeServer", "MARKER_ENV",
    "Marked", "SlowPolicy", "Watch", "assert_no_survivors", "echo_policy", "echo_suite", "fail_once", "free_port",
    "load_echo_suite", "replying", "sandbox_python", "survivors",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'clawgym_env.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"clawgym_env.testing.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
