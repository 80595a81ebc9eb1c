"""Qwen Code (``@qwen-code/qwen-code`` on npm, pinned) run headless in a sandbox.

The CLI is launched unmodified as ``node cli-entry.js --auth-type openai --yolo --output-format
stream-json ... "<instruction>"`` with the OpenAI-compatible endpoint given by ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` / ``OPENAI_MODEL`` (the episode's proxy URL and token).

Invariants:
  * ``launch`` is pure: argv holds absolute paths only (a Node >= 22 binary and the CLI's entry
    script, both under ``ro_paths`` or the host toolchain; install, Node and paths come from
    :class:`~harness_adapters.npm.NpmHarnessAdapter`), settings go into
    HOME through ``LaunchSpec.files``, cwd is the task's workspace;
  * telemetry, usage statistics, auto-update and chat recording are off in the user settings and,
    pinned with higher precedence, in a system settings file (so neither the host's
    ``/etc/qwen-code`` nor a workspace can turn them back on); the only model endpoint is the proxy;
  * the instruction is passed verbatim and never read as a flag (see :func:`prompt_args`);
  * ``read_output`` never raises: no successful ``result`` event means no final answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from clawgym_env.capture.records import CallRecord
from clawgym_env.errors import HarnessError
from clawgym_env.harness import Endpoint, EpisodeResources, HarnessOutput, KindVerdict, LaunchSpec
from clawgym_env.task import Task
from harness_adapters.install import NpmPackage
from harness_adapters.npm import NpmHarnessAdapter
from harness_adapters.qwen_code.kinds import qwen_code_kinds
from harness_adapters.qwen_code.stream import parse_stream

PACKAGE = NpmPackage("@qwen-code/qwen-code", "0.24.4", "qwen", min_node=22)
AUTH_TYPES = {"openai": "openai_chat", "openai-responses": "openai_responses", "anthropic": "anthropic_messages"}
"""Qwen Code's ``--auth-type`` values launched here → the proxy dialect each one speaks."""
SETTINGS_VERSION = 4
PINNED = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "chatRecording": False},
}
"""Switches enforced through the system settings file (highest precedence)."""
QUIET_ENV = {
    # the bin wrapper still runs the CLI as one child (``node --expose-gc cli.js``); this stops the
    # CLI relaunching itself once more with a heap of half the host's RAM (the sandbox caps memory)
    "QWEN_CODE_NO_RELAUNCH": "true",
    "NO_COLOR": "1",
    "CI": "1",
    "NO_BROWSER": "1",
    "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
}


def user_settings(auth_type: str = "openai") -> dict:
    """``~/.qwen/settings.json``: the auth type, everything nonessential off."""
    return {"$version": SETTINGS_VERSION,
            "security": {"auth": {"selectedType": auth_type}, "folderTrust": {"enabled": False}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False, "chatRecording": False},
            "ui": {"hideBanner": True, "hideTips": True, "enableWelcomeBack": False, "enableUserFeedback": False,
                   "enableFollowupSuggestions": False},
            "ide": {"enabled": False},
            "tools": {"useRipgrep": False}}  # the packaged rg lacks its exec bit; say so instead of failing over


def merged(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` merged in (nested objects merged key by key, other values replaced)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def prompt_args(instruction: str) -> list[str]:
    """The instruction as the positional prompt; one that starts with ``-`` (which the CLI's parser
    would take for a flag, ``--`` included) is passed as ``--prompt=<text>`` instead."""
    return [f"--prompt={instruction}"] if instruction.startswith("-") else [instruction]


class QwenCodeAdapter(NpmHarnessAdapter):
    """Qwen Code in headless one-shot mode against the proxy (Chat Completions unless ``auth_type`` says otherwise).

    Args:
        auth_type: Qwen Code's ``--auth-type``: ``openai`` (Chat Completions), ``openai-responses`` or ``anthropic``.
        max_session_turns: passed as ``--max-session-turns`` when set (else the task's ``max_turns``).
        extra_settings: more user settings, merged into ``~/.qwen/settings.json`` (opt-in; e.g.
            ``{"context": {"autoCompactThreshold": 0.2}, "model": {"generationConfig": {"contextWindowSize": 60000}}}``
            makes Qwen Code compact early); the pinned system settings still win.
        extra_env: more environment variables (override the defaults above).
        cache_dir: the harness cache (default: the project cache).
    """

    name = "qwen-code"
    resources = EpisodeResources(cpus=0.5, memory_mb=640)  # peak tree RSS measured 315-504 MiB
    dialect = "openai_chat"
    package = PACKAGE

    def __init__(self, auth_type: str = "openai", *, max_session_turns: int | None = None,
                 extra_settings: dict | None = None, extra_env: dict[str, str] | None = None,
                 cache_dir: str | None = None) -> None:
        if auth_type not in AUTH_TYPES:
            raise HarnessError(f"unsupported Qwen Code auth type {auth_type!r}; use one of {', '.join(AUTH_TYPES)}")
        self.auth_type = auth_type
        self.dialect = AUTH_TYPES[auth_type]
        self.max_session_turns = max_session_turns
        self.extra_settings = dict(extra_settings or {})
        self.extra_env = dict(extra_env or {})
        super().__init__(cache_dir=cache_dir)

    # -- launch -----------------------------------------------------------------------------------
    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The launch (see the module doc); runs nothing."""
        qdir = f"{home}/.qwen"
        system = f"{qdir}/clawgym-system-settings.json"
        turns = self.max_session_turns or task.limits.max_turns
        argv = [str(self.node()), str(self.entry()), "--auth-type", self.auth_type, "--model", endpoint.model,
                "--yolo", "--output-format", "stream-json", "--max-session-turns", str(turns),
                "--chat-recording", "false", *prompt_args(task.instruction)]
        if self.auth_type == "anthropic":
            creds = {"ANTHROPIC_BASE_URL": endpoint.root_url, "ANTHROPIC_API_KEY": endpoint.api_key,
                     "ANTHROPIC_MODEL": endpoint.model}
        else:
            creds = {"OPENAI_BASE_URL": endpoint.base_url, "OPENAI_API_KEY": endpoint.api_key,
                     "OPENAI_MODEL": endpoint.model}
        env = {**QUIET_ENV, **creds, "QWEN_CODE_SYSTEM_SETTINGS_PATH": system,
               "QWEN_CODE_SYSTEM_DEFAULTS_PATH": f"{qdir}/clawgym-system-defaults.json", **self.extra_env}
        settings = merged(user_settings(self.auth_type), self.extra_settings)
        files: dict[str, str | bytes] = {f"{qdir}/settings.json": json.dumps(settings, indent=2),
                 system: json.dumps(PINNED, indent=2), f"{qdir}/clawgym-system-defaults.json": "{}"}
        return LaunchSpec(argv=argv, env=env, files=files, cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The final answer and transcript from the output; never raises."""
        return parse_stream(stdout)

    def call_kinds(self, calls: Sequence[CallRecord]) -> list[KindVerdict]:
        """Main and subagent calls by the system prompt Qwen Code writes (see
        :mod:`harness_adapters.qwen_code.kinds`)."""
        return qwen_code_kinds(calls)


Adapter = QwenCodeAdapter
