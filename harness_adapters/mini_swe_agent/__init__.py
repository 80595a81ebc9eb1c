"""mini-swe-agent (``mini-swe-agent`` on PyPI, pinned, in its own venv) run headless in a sandbox.

The stock ``mini`` command is launched unmodified, in yolo mode with its stock ``mini.yaml`` config,
through litellm's OpenAI provider (``openai/<model>``) whose ``api_base`` is the episode's proxy URL
and whose key is the episode token. It speaks Chat Completions, non-streaming, offering one ``bash``
tool; it ends when a command's output starts with the line ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``,
and the rest of that output is its submission (the final answer). Its result is a trajectory file:
the launch runs ``mini`` through ``/bin/sh``, which prints that file after a marker line once ``mini``
exits (keeping ``mini``'s exit status), so :meth:`MiniSweAgentAdapter.read_output` finds it in stdout.

Invariants:
  * ``launch`` is pure: argv holds absolute paths only (``/bin/sh``, the venv's interpreter and
    ``mini`` script, all under ``ro_paths`` or the host toolchain; install and paths come from
    :class:`~harness_adapters.pypi.PypiHarnessAdapter`), cwd is the task's workspace;
  * nothing but the proxy is reached: litellm's model cost map is the local copy
    (``LITELLM_LOCAL_MODEL_COST_MAP``), first-run setup and cost tracking are off, mini-swe-agent's
    global config folder lies in the sandbox's HOME;
  * the instruction is passed verbatim as ``--task=<text>`` and never read as a flag;
  * ``read_output`` never raises: no trajectory, or one that did not end in a submission, means no final answer.
"""

from __future__ import annotations

import json

from clawgym_env.harness import Endpoint, EpisodeResources, HarnessOutput, LaunchSpec
from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Task
from harness_adapters.pypi import PypiHarnessAdapter, PypiPackage

PACKAGE = PypiPackage("mini-swe-agent", "2.4.6", "mini", pins=("litellm==1.110.2", "openai==3.63.0"))
TRAJECTORY_MARKER = "<<<CLAWGYM-MINI-SWE-AGENT-TRAJECTORY>>>"
"""The line after which the launch prints the trajectory file."""
SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""The first output line that makes mini-swe-agent submit (its stock configs say so to the model)."""
QUIET_ENV = {
    "MSWEA_CONFIGURED": "true",            # else it runs its interactive first-time setup and aborts
    "MSWEA_COST_TRACKING": "ignore_errors",  # the policy has no price
    "MSWEA_SILENT_STARTUP": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm fetches its cost map from the internet
    "NO_COLOR": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",        # the venv is read-only in the sandbox
}
_WRAPPER = f'out="$1"; shift; "$@"; rc=$?; printf "\\n%s\\n" "{TRAJECTORY_MARKER}"; cat "$out"; exit $rc'


def parse_trajectory(stdout: str) -> HarnessOutput:
    """The final answer and transcript from the trajectory printed after :data:`TRAJECTORY_MARKER`.

    The final answer is the submission when the run ended with ``exit_status == "Submitted"``, else None.
    The transcript is the trajectory's messages (without mini-swe-agent's bookkeeping ``extra``) and a
    last ``{"type": "mini_swe_agent_exit", ...}`` entry with the exit status and API-call count. Never raises.
    """
    _, found, tail = stdout.rpartition(TRAJECTORY_MARKER)
    if not found:
        return HarnessOutput(final_message=None)
    try:
        data = json.loads(tail)
    except ValueError:
        return HarnessOutput(final_message=None)
    if not isinstance(data, dict):
        return HarnessOutput(final_message=None)
    raw_info, raw_messages = data.get("info"), data.get("messages")
    info: JSONObject = raw_info if isinstance(raw_info, dict) else {}
    messages: list[object] = raw_messages if isinstance(raw_messages, list) else []
    transcript: list[JSONObject] = [{k: v for k, v in m.items() if k != "extra"} for m in messages
                                    if isinstance(m, dict)]
    status, submission, raw_stats = info.get("exit_status"), info.get("submission"), info.get("model_stats")
    stats: JSONObject = raw_stats if isinstance(raw_stats, dict) else {}
    transcript.append({"type": "mini_swe_agent_exit", "exit_status": status, "api_calls": stats.get("api_calls")})
    final = submission if status == "Submitted" and isinstance(submission, str) else None
    return HarnessOutput(final_message=final, transcript=transcript)


class MiniSweAgentAdapter(PypiHarnessAdapter):
    """mini-swe-agent's ``mini`` in yolo mode against the proxy (Chat Completions through litellm).

    Args:
        config: the mini-swe-agent config file(s) it starts from (its ``-c``; default its stock ``mini.yaml``).
        command_timeout_s: seconds one bash command may run (its ``environment.timeout``; stock 30).
        extra_config: more ``key=value`` config overrides (its ``-c a.b=value``), applied last.
        extra_env: more environment variables (override the defaults above).
        cache_dir: the harness cache (default: the project cache).
    """

    name = "mini-swe-agent"
    resources = EpisodeResources(cpus=0.5, memory_mb=384)  # peak tree RSS measured ~225 MiB
    dialect = "openai_chat"
    package = PACKAGE

    def __init__(self, config: str | list[str] = "mini.yaml", *, command_timeout_s: int = 30,
                 extra_config: list[str] | None = None, extra_env: dict[str, str] | None = None,
                 cache_dir: str | None = None) -> None:
        self.configs = [config] if isinstance(config, str) else list(config)
        self.command_timeout_s = int(command_timeout_s)
        self.extra_config = list(extra_config or [])
        self.extra_env = dict(extra_env or {})
        super().__init__(cache_dir=cache_dir)

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The launch (see the module doc); runs nothing."""
        trajectory = f"{home}/.clawgym-mini-swe-agent/trajectory.json"
        overrides = [f"model.model_kwargs.api_base={endpoint.base_url}", "agent.cost_limit=0",
                     f"agent.step_limit={task.limits.max_turns}", f"environment.timeout={self.command_timeout_s}",
                     f"environment.cwd={task.mount_dir}", *self.extra_config]
        configs = [arg for spec in [*self.configs, *overrides] for arg in ("-c", spec)]
        mini = [str(self.python()), str(self.entry()), "--yolo", "--exit-immediately",
                "--model", f"openai/{endpoint.model}", *configs, "--output", trajectory, f"--task={task.instruction}"]
        env = {**QUIET_ENV, "OPENAI_API_KEY": endpoint.api_key,
               "MSWEA_GLOBAL_CONFIG_DIR": f"{home}/.config/mini-swe-agent", **self.extra_env}
        return LaunchSpec(argv=["/bin/sh", "-c", _WRAPPER, "mini-swe-agent", trajectory, *mini], env=env,
                          cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The submission and transcript from the printed trajectory (:func:`parse_trajectory`); never raises."""
        return parse_trajectory(stdout)


Adapter = MiniSweAgentAdapter
