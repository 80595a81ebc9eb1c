"""The reference harness ``mini``: our own small agent loop, launched as a black box."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from clawgym_env.harness import Endpoint, EpisodeResources, HarnessAdapter, HarnessOutput, LaunchSpec
from clawgym_env.task import Task

AGENT = Path(__file__).with_name("agent.py")


class MiniAdapter(HarnessAdapter):
    """Launches ``agent.py`` with the sandbox's (read-only, host) Python. OpenAI chat dialect."""

    name = "mini"
    resources = EpisodeResources(cpus=0.5, memory_mb=384)  # peak tree RSS measured 224-225 MiB (Python + litellm)
    dialect = "openai_chat"

    def __init__(self, stream: bool = False, command_timeout: float = 120.0) -> None:
        self.stream = stream
        self.command_timeout = command_timeout

    def ro_paths(self) -> list[Path]:
        """Only the agent file (stdlib-only): the rest of the project tree holds the tasks' answers."""
        return [AGENT]

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The launch (see the module doc); runs nothing."""
        instruction = f"{home}/.mini/instruction.txt"
        argv = [sys.executable, str(AGENT), "--base-url", endpoint.base_url, "--model", endpoint.model,
                "--instruction-file", instruction, "--max-turns", str(task.limits.max_turns),
                "--command-timeout", str(self.command_timeout)]
        if self.stream:
            argv.append("--stream")
        return LaunchSpec(argv=argv, env={"OPENAI_API_KEY": endpoint.api_key}, files={instruction: task.instruction},
                          cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The final answer and transcript from the output; never raises."""
        for line in reversed(stdout.strip().splitlines()):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "final":
                return HarnessOutput(final_message=obj.get("final_message"), transcript=obj.get("transcript") or [])
        return HarnessOutput(final_message=None)


Adapter = MiniAdapter
