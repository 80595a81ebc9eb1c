"""pi (``@mariozechner/pi-coding-agent`` on npm, pinned), run unmodified in print mode in a sandbox.

Launch, cwd = the task's workspace, on a Node of at least :data:`PACKAGE`'s ``min_node``::

    node cli.js -p --mode json --no-session --offline --provider clawgym --model <model> "<instruction>"

The model endpoint is a custom provider in ``~/.pi/agent/models.json`` (written into the private HOME):
its ``api`` picks pi's client, and so the proxy dialect (``openai-completions`` → Chat Completions,
``openai-responses`` → Responses, ``anthropic-messages`` → Messages); its ``baseUrl`` is the episode's base
URL (the root URL for Messages, whose client appends ``/v1``) and its key the episode token.

Invariants:
  * ``launch`` runs nothing: argv holds absolute paths only (the Node binary and pi's entry script, under
    ``ro_paths`` or the host toolchain; install, Node and paths come from
    :class:`~harness_adapters.npm.NpmHarnessAdapter`), config goes into HOME through ``LaunchSpec.files``,
    cwd is the task's workspace;
  * startup network operations (update checks, install telemetry) are off (``--offline``, ``PI_OFFLINE``,
    ``PI_SKIP_VERSION_CHECK``, ``enableInstallTelemetry: false``); no session file is written; the only model
    endpoint is the proxy;
  * the instruction is never read as a flag or a file: pi's parser has no ``--`` separator and reads an
    argument starting with ``-`` as a flag and one starting with ``@`` as a file, so such an instruction is
    written to a file in HOME and piped to pi's stdin through ``/bin/sh`` (pi trims piped text at both
    ends; it reaches the model verbatim otherwise);
  * ``read_output`` never raises (see :mod:`harness_adapters.pi.events`).
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
from harness_adapters.pi.events import parse_events
from harness_adapters.pi.kinds import pi_kinds

PACKAGE = NpmPackage("@mariozechner/pi-coding-agent", "0.73.1", "pi", min_node=20)
PROVIDER = "clawgym"
APIS = {"openai-completions": "openai_chat", "openai-responses": "openai_responses",
        "anthropic-messages": "anthropic_messages"}
"""pi's ``api`` values launched here → the proxy dialect each one speaks."""
QUIET_ENV = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0", "NO_COLOR": "1", "CI": "1"}
SHELL = "/bin/sh"


def models_file(endpoint: Endpoint, *, api: str, context_window: int, max_tokens: int) -> JSONObject:
    """``models.json``: one custom provider (the proxy) with one model. pi's Anthropic client appends ``/v1``
    itself, so it gets the episode's root URL; the OpenAI ones get the base URL."""
    return {"providers": {PROVIDER: {
        "baseUrl": endpoint.root_url if api == "anthropic-messages" else endpoint.base_url,
        "api": api,
        "apiKey": endpoint.api_key,
        "compat": {"supportsDeveloperRole": False, "supportsStore": False},  # a plain system message, no `store`
        "models": [{"id": endpoint.model, "name": endpoint.model, "reasoning": False, "input": ["text"],
                    "contextWindow": context_window, "maxTokens": max_tokens,
                    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}],
    }}}


def settings_file() -> JSONObject:
    """``settings.json``: no install telemetry, no startup banner."""
    return {"enableInstallTelemetry": False, "quietStartup": True}


def needs_stdin(instruction: str) -> bool:
    """Whether pi's parser would misread ``instruction`` as a positional argument (a flag or an ``@file``)."""
    return instruction.startswith(("-", "@"))


class PiAdapter(NpmHarnessAdapter):
    """pi in print mode with JSON events, against the proxy (Chat Completions unless ``api`` says otherwise).

    Args:
        api: pi's provider ``api`` (a key of :data:`APIS`); it sets the dialect.
        context_window: the model's context size pi is told (it compacts near it).
        max_tokens: the model's output limit pi is told.
        extra_args: more command-line arguments (e.g. ``["--tools", "read,bash"]``), placed before the instruction.
        extra_env: more environment variables (override the defaults above).
        cache_dir: the harness cache (default: the project cache).
    """

    name = "pi"
    resources = EpisodeResources(cpus=0.5, memory_mb=256)  # peak tree RSS measured 148 MiB
    dialect = "openai_chat"
    package = PACKAGE

    def __init__(self, api: str = "openai-completions", *, context_window: int = 32768, max_tokens: int = 4096,
                 extra_args: list[str] | tuple[str, ...] = (), extra_env: dict[str, str] | None = None,
                 cache_dir: str | None = None) -> None:
        if api not in APIS:
            raise HarnessError(f"unsupported pi api {api!r}; use one of {', '.join(APIS)}")
        self.api = api
        self.dialect = APIS[api]
        self.context_window = int(context_window)
        self.max_tokens = int(max_tokens)
        self.extra_args = [str(a) for a in extra_args]
        self.extra_env = dict(extra_env or {})
        super().__init__(cache_dir=cache_dir)

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The launch (see the module doc); runs nothing."""
        agent_dir = f"{home}/.pi/agent"
        files: dict[str, str | bytes] = {
            f"{agent_dir}/models.json": json.dumps(models_file(endpoint, api=self.api,
                                                              context_window=self.context_window,
                                                              max_tokens=self.max_tokens), indent=2),
            f"{agent_dir}/settings.json": json.dumps(settings_file(), indent=2)}
        argv = [str(self.node()), str(self.entry()), "-p", "--mode", "json", "--no-session", "--offline",
                "--provider", PROVIDER, "--model", endpoint.model, *self.extra_args]
        if needs_stdin(task.instruction):
            prompt = f"{home}/.pi/clawgym-instruction.txt"
            files[prompt] = task.instruction
            argv = [SHELL, "-c", 'exec "$@" < "$0"', prompt, *argv]
        else:
            argv.append(task.instruction)
        env = {**QUIET_ENV, "PI_CODING_AGENT_DIR": agent_dir, **self.extra_env}
        return LaunchSpec(argv=argv, env=env, files=files, cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The final answer and transcript from the JSON events; never raises."""
        return parse_events(stdout)

    def call_kinds(self, calls: Sequence[CallRecord]) -> list[KindVerdict]:
        """Main and compaction calls (see :mod:`harness_adapters.pi.kinds`)."""
        return pi_kinds(calls)


Adapter = PiAdapter
