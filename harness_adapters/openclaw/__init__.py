"""OpenClaw (``openclaw`` on npm, pinned) run headless through ``openclaw agent exec`` in a sandbox.

The adapter never modifies OpenClaw. It writes one pinned config (a single provider pointing at the
episode's proxy URL) into the sandbox HOME and launches the CLI with Node >= 24 (npm's ``node@24``
when the system Node is older).

Invariants:
  * ``launch`` is pure: argv holds absolute paths only (the Node binary and ``openclaw.mjs`` under
    the install prefix, both in ``ro_paths``; install, Node and paths come from
    :class:`~harness_adapters.npm.NpmHarnessAdapter`), the config and the instruction
    go into HOME through ``LaunchSpec.files``, cwd is the task's workspace;
  * the config is pinned (``--config``), so no ambient or stored credentials are read; its only
    provider is the proxy, so every model call goes through the proxy;
  * update checks, respawns and other start-up side jobs are switched off by environment
    (:data:`QUIET_ENV`); OpenClaw's own deadline is longer than the episode's, so the episode
    runner's timeout (status ``timeout``) always fires first;
  * ``read_output`` never raises: a missing or malformed envelope means no final answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from clawgym_env.capture.records import CallRecord
from clawgym_env.errors import HarnessError
from clawgym_env.harness import Endpoint, EpisodeResources, HarnessOutput, KindVerdict, LaunchSpec
from clawgym_env.task import Task
from harness_adapters.install import NpmPackage
from harness_adapters.npm import NpmHarnessAdapter
from harness_adapters.openclaw.envelope import parse_envelope
from harness_adapters.openclaw.kinds import openclaw_discarded, openclaw_kinds

PACKAGE = NpmPackage("openclaw", "2026.9.6", "openclaw", min_node=24)
PROVIDER = "clawgym"
APIS = ("openai-completions", "anthropic-messages", "openai-responses")
"""OpenClaw's provider ``api`` values; the proxy must serve the matching dialect route."""
DIALECTS = {"openai-completions": "openai_chat", "anthropic-messages": "anthropic_messages",
            "openai-responses": "openai_responses"}
QUIET_ENV = {
    "OPENCLAW_NO_AUTO_UPDATE": "1",      # no update check / self-update
    "OPENCLAW_NO_RESPAWN": "1",          # no second Node process at start-up
    "OPENCLAW_SKIP_CHANNELS": "1",       # no messaging channels (Telegram, ...)
    "OPENCLAW_SKIP_CRON": "1",
    "OPENCLAW_SKIP_GMAIL_WATCHER": "1",
    "OPENCLAW_SKIP_CANVAS_HOST": "1",
    "OPENCLAW_SKIP_BROWSER_CONTROL_SERVER": "1",
    "OPENCLAW_SKIP_STARTUP_MODEL_PREWARM": "1",
    "OPENCLAW_DISABLE_BONJOUR": "1",     # no mDNS advertising
    # Node's compile cache would be written afresh into each sandbox's private /tmp (34 MB), which
    # costs ~10 s at exit on a busy 2-core machine and is thrown away with the sandbox
    "NODE_DISABLE_COMPILE_CACHE": "1",
    "NO_COLOR": "1",
    "CI": "1",
}
CONFIG_DIR = ".openclaw"  # under HOME; the config file is <home>/.openclaw/openclaw.json


def provider_config(endpoint: Endpoint, api: str, *, context_window: int, max_tokens: int,
                    reasoning: bool) -> dict:
    """The pinned OpenClaw config: one provider (the proxy) with one model, selected as primary."""
    base_url = endpoint.root_url if api == "anthropic-messages" else endpoint.base_url
    model = {"id": endpoint.model, "name": "ClawGym policy", "reasoning": reasoning, "input": ["text"],
             "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
             "contextWindow": context_window, "maxTokens": max_tokens}
    return {"agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{endpoint.model}"}}},
            "update": {"checkOnStart": False},
            "models": {"mode": "replace", "providers": {PROVIDER: {
                "baseUrl": base_url, "apiKey": endpoint.api_key, "api": api, "models": [model]}}}}


class OpenClawAdapter(NpmHarnessAdapter):
    """``openclaw agent exec`` against the proxy. ``api`` picks OpenClaw's wire dialect.

    Args:
        api: ``openai-completions`` (Chat Completions), ``anthropic-messages`` or ``openai-responses``.
        context_window / max_tokens: what OpenClaw is told about the model (it sends ``max_tokens``).
        reasoning: declare the model as a reasoning model (OpenClaw then replays thinking blocks).
        thinking: OpenClaw's ``--thinking`` level, or None to leave its default.
        extra_env: more environment variables (override :data:`QUIET_ENV`).
        cache_dir: the harness cache (default: the project cache).
    """

    name = "openclaw"
    resources = EpisodeResources(cpus=1.0, memory_mb=1792)  # peak tree RSS 1184-1502 MiB; ~10 s CPU at start
    package = PACKAGE

    def __init__(self, api: str = "openai-completions", *, context_window: int = 128000, max_tokens: int = 8192,
                 reasoning: bool = False, thinking: str | None = None, extra_env: dict[str, str] | None = None,
                 cache_dir: str | None = None) -> None:
        if api not in APIS:
            raise HarnessError(f"unknown OpenClaw api {api!r}; use one of {', '.join(APIS)}")
        self.api = api
        self.dialect = DIALECTS[api]
        self.context_window = context_window
        self.max_tokens = max_tokens
        self.reasoning = reasoning
        self.thinking = thinking
        self.extra_env = dict(extra_env or {})
        super().__init__(cache_dir=cache_dir)

    # -- launch -----------------------------------------------------------------------------------
    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The launch (see the module doc); runs nothing."""
        config_path = f"{home}/{CONFIG_DIR}/openclaw.json"
        message_path = f"{home}/{CONFIG_DIR}/clawgym-instruction.md"
        config = provider_config(endpoint, self.api, context_window=self.context_window,
                                 max_tokens=self.max_tokens, reasoning=self.reasoning)
        deadline = int(math.ceil(task.limits.timeout_s)) + 60  # outlives the episode timeout
        argv = [str(self.node()), str(self.entry()), "agent", "exec", "--message-file", message_path,
                "--config", config_path, "--model", f"{PROVIDER}/{endpoint.model}", "--cwd", task.mount_dir,
                "--timeout", str(deadline), "--json"]
        if self.thinking:
            argv += ["--thinking", self.thinking]
        env = {**QUIET_ENV, **self.extra_env}
        return LaunchSpec(argv=argv, env=env, cwd=task.mount_dir,
                          files={config_path: json.dumps(config, indent=2), message_path: task.instruction})

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The final answer and transcript from the output; never raises."""
        return parse_envelope(stdout)

    def call_kinds(self, calls: Sequence[CallRecord]) -> list[KindVerdict]:
        """Main turns and compaction calls by the system prompt OpenClaw writes and the tools it offers (see
        :mod:`harness_adapters.openclaw.kinds`)."""
        return openclaw_kinds(calls)

    def discarded_calls(self, calls: Sequence[CallRecord]) -> dict[int, int]:
        """Agent calls OpenClaw abandoned and retried with a ``<turn_aborted>`` note (see
        :func:`harness_adapters.openclaw.kinds.openclaw_discarded`)."""
        return openclaw_discarded(calls)


Adapter = OpenClawAdapter
