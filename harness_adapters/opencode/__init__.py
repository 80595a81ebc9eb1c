"""OpenCode (``opencode-ai`` on npm, pinned), run unmodified as ``opencode run`` in a sandbox.

The npm package ships a native executable (no Node at run time). Launch, cwd = the task's workspace::

    /bin/sh -c 'exec "$@" < "$0"' <instruction file> opencode run --format json --auto --pure \
        --model clawgym/<model> [--title T]

The instruction reaches OpenCode on its stdin, from a file in the private HOME: OpenCode joins its message
arguments after wrapping each one that holds a space in double quotes (escaping the quotes inside), so an
argument would not reach the model verbatim; piped text, with no message argument, does.

The model endpoint is a custom provider in the config file the adapter writes into the private HOME
(``OPENCODE_CONFIG``): ``provider_npm`` picks OpenCode's client, and so the proxy dialect
(``@ai-sdk/openai-compatible`` → Chat Completions, ``@ai-sdk/openai`` → Responses, ``@ai-sdk/anthropic`` →
Messages); its ``baseURL`` is the episode's base URL and its key the episode token.

Invariants:
  * ``launch`` runs nothing: argv holds absolute paths (the system shell and the installed executable, under
    ``ro_paths``), config and instruction go into HOME through ``LaunchSpec.files``, cwd is the task's
    workspace, and ``PWD`` names it
    (OpenCode takes its project folder from ``PWD``, which the sandbox's clean environment lacks);
  * auto-update, sharing, the models catalogue fetch, LSP downloads, default and external plugins, other
    harnesses' prompts and skills, and the workspace's own config are off; the only model endpoint is the proxy;
  * the instruction reaches the model verbatim and is never read as a flag (it is not an argument at all);
  * ``read_output`` never raises (see :mod:`harness_adapters.opencode.events`);
  * without ``title``, OpenCode's first call writes the session title (no tools offered): a side call, which
    :meth:`call_kinds` marks (see :mod:`harness_adapters.opencode.kinds`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from clawgym_env.capture.records import CallRecord
from clawgym_env.errors import HarnessError
from clawgym_env.harness import Endpoint, EpisodeResources, HarnessOutput, KindVerdict, LaunchSpec
from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Task
from harness_adapters.install import NpmPackage
from harness_adapters.npm import NpmHarnessAdapter
from harness_adapters.opencode.events import parse_events
from harness_adapters.opencode.kinds import opencode_kinds

PACKAGE = NpmPackage("opencode-ai", "1.18.33", "opencode")
PROVIDER = "clawgym"
PROVIDER_NPM = {"@ai-sdk/openai-compatible": "openai_chat", "@ai-sdk/openai": "openai_responses",
                "@ai-sdk/anthropic": "anthropic_messages"}
"""OpenCode's client packages (all bundled in its executable) → the proxy dialect each one speaks."""
SHELL = "/bin/sh"
QUIET_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",  # else it fetches a models catalogue
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",  # no prompts or skills read from another harness's folders
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",  # a workspace's opencode.json cannot change the endpoint
    "OPENCODE_DISABLE_TERMINAL_TITLE": "1",
    "NO_COLOR": "1",
    "CI": "1",
}


def opencode_config(endpoint: Endpoint, *, provider_npm: str, context_window: int, max_output: int) -> JSONObject:
    """The config file: one custom provider (the proxy) with one model, everything nonessential off."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": f"{PROVIDER}/{endpoint.model}",
        "small_model": f"{PROVIDER}/{endpoint.model}",
        "enabled_providers": [PROVIDER],
        "provider": {PROVIDER: {
            "npm": provider_npm,
            "name": "ClawGym proxy",
            "options": {"baseURL": endpoint.base_url, "apiKey": endpoint.api_key},
            "models": {endpoint.model: {"name": endpoint.model, "tool_call": True,
                                         "limit": {"context": context_window, "output": max_output}}},
        }},
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
    }


class OpenCodeAdapter(NpmHarnessAdapter):
    """OpenCode's one-shot ``run`` mode with JSON events, against the proxy (Chat Completions by default).

    Args:
        provider_npm: OpenCode's client package (a key of :data:`PROVIDER_NPM`); it sets the dialect.
        title: the session title, passed as ``--title`` (which removes OpenCode's title call); None keeps the call.
        context_window: the model's context size OpenCode is told (it compacts near it).
        max_output: the model's output limit OpenCode is told.
        extra_config: more config, merged on top of the adapter's (top-level keys replaced).
        extra_env: more environment variables (override the defaults above).
        cache_dir: the harness cache (default: the project cache).
    """

    name = "opencode"
    resources = EpisodeResources(cpus=0.5, memory_mb=768)  # peak tree RSS measured 562 MiB
    dialect = "openai_chat"
    package = PACKAGE

    def __init__(self, provider_npm: str = "@ai-sdk/openai-compatible", *, title: str | None = None,
                 context_window: int = 32768, max_output: int = 4096, extra_config: JSONObject | None = None,
                 extra_env: dict[str, str] | None = None, cache_dir: str | None = None) -> None:
        if provider_npm not in PROVIDER_NPM:
            raise HarnessError(f"unsupported OpenCode provider_npm {provider_npm!r}; "
                               f"use one of {', '.join(PROVIDER_NPM)}")
        self.provider_npm = provider_npm
        self.dialect = PROVIDER_NPM[provider_npm]
        self.title = title
        self.context_window = int(context_window)
        self.max_output = int(max_output)
        self.extra_config = dict(extra_config or {})
        self.extra_env = dict(extra_env or {})
        super().__init__(cache_dir=cache_dir)

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The launch (see the module doc); runs nothing."""
        config_path = f"{home}/.config/opencode/opencode.json"
        config = {**opencode_config(endpoint, provider_npm=self.provider_npm, context_window=self.context_window,
                                    max_output=self.max_output), **self.extra_config}
        prompt_path = f"{home}/.config/opencode/clawgym-instruction.txt"
        argv = [SHELL, "-c", 'exec "$@" < "$0"', prompt_path, str(self.entry()), "run", "--format", "json",
                "--auto", "--pure", "--model", f"{PROVIDER}/{endpoint.model}"]
        if self.title is not None:
            argv += ["--title", self.title]
        env = {**QUIET_ENV, "OPENCODE_CONFIG": config_path, "PWD": task.mount_dir, **self.extra_env}
        files: dict[str, str | bytes] = {config_path: json.dumps(config, indent=2), prompt_path: task.instruction}
        return LaunchSpec(argv=argv, env=env, files=files, cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The final answer and transcript from the JSON events; never raises."""
        return parse_events(stdout)

    def call_kinds(self, calls: Sequence[CallRecord]) -> list[KindVerdict]:
        """The title call as a side call, the agent's calls as main (see :mod:`harness_adapters.opencode.kinds`)."""
        return opencode_kinds(calls)


Adapter = OpenCodeAdapter
