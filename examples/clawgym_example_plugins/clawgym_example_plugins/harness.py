"""The ``example-agent`` harness: :mod:`clawgym_example_plugins.agent` launched as a black box.

The agent file imports only the standard library, so the adapter launches it with the *base* interpreter
of this Python (``sys.base_prefix``), which the sandbox always shows read-only: it works the same when
ClawGym runs from a virtual environment (whose own folder a sandbox may not show). ``ro_paths`` adds only
the agent file itself; nothing else of this package (its suite data holds the expected answers) is visible
inside the sandbox.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from clawgym_env.errors import ConfigError
from clawgym_env.harness import Endpoint, EpisodeResources, HarnessAdapter, HarnessOutput, LaunchSpec
from clawgym_env.task import Task

AGENT = Path(__file__).with_name("agent.py")


def base_python() -> Path | None:
    """The base interpreter of this Python (outside any virtual environment) under the *real* path of its prefix,
    as the sandbox binds it (a prefix reached through a symlinked folder is not there by that name); None when
    none is found."""
    bindir = Path(os.path.realpath(sys.base_prefix)) / "bin"
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3"):
        if (bindir / name).is_file():
            return bindir / name
    return None


WIRES = {"chat": "openai_chat", "example": "example_turns"}
"""The agent's ``--wire`` → the dialect its calls are recorded under (``example_turns``: this package's own)."""


class ExampleAgentAdapter(HarnessAdapter):
    """Launches ``agent.py`` with the base interpreter; ``wire`` picks its dialect (``--harness-opt wire=example``)."""

    name = "example-agent"
    dialect = "openai_chat"
    resources = EpisodeResources(cpus=0.25, memory_mb=128)  # a stdlib-only Python process

    def __init__(self, max_turns: int | None = None, wire: str = "chat") -> None:
        if wire not in WIRES:
            raise ConfigError(f"example-agent: wire must be one of {', '.join(WIRES)}, got {wire!r}")
        self.max_turns = max_turns
        self.wire = wire
        self.dialect = WIRES[wire]

    def missing(self) -> str | None:
        """Why the harness cannot run here (no base interpreter found), or None."""
        if base_python() is None:
            return f"no Python interpreter under {sys.base_prefix}/bin; install python3"
        return None

    def ro_paths(self) -> list[Path]:
        """Only the agent file (the rest of this package holds the suite's expected answers)."""
        return [AGENT]

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The agent's command line, its task file and its key; runs nothing."""
        task_file = f"{home}/.example-agent/task.txt"
        turns = self.max_turns or task.limits.max_turns
        python = base_python()
        argv = [str(python or "python3"), "-I", str(AGENT), "--base-url", endpoint.base_url,
                "--model", endpoint.model, "--task-file", task_file, "--max-turns", str(turns), "--wire", self.wire]
        return LaunchSpec(argv=argv, env={"OPENAI_API_KEY": endpoint.api_key}, files={task_file: task.instruction},
                          cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The final answer from the agent's last JSON line; None when it gave none. Never raises."""
        for line in reversed(stdout.strip().splitlines()):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "final":
                final = obj.get("final_message")
                return HarnessOutput(final_message=final if isinstance(final, str) else None)
        return HarnessOutput(final_message=None)
