"""Claude Code (``@anthropic-ai/claude-code``), run unmodified in print mode against the proxy.

Claude Code speaks the Anthropic Messages dialect (``POST {ANTHROPIC_BASE_URL}/v1/messages``,
streamed). The npm package ships a native (Bun-compiled) executable, so no Node.js is needed at run
time; the install prefix is made visible read-only inside the sandbox (install and paths come from
:class:`~harness_adapters.npm.NpmHarnessAdapter`).

Launch (cwd = the task's workspace, as the sandbox's non-root uid, private HOME)::

    claude -p --output-format stream-json --verbose --dangerously-skip-permissions
           --no-session-persistence --max-turns N [--bare] [extra_args...] -- "<instruction>"

Environment: ``ANTHROPIC_BASE_URL`` = the episode's root URL (no ``/v1``: the client appends it),
``ANTHROPIC_API_KEY`` = the episode token, every model slot (``ANTHROPIC_MODEL``, the haiku /
small-fast / sonnet / opus defaults) = :attr:`model`, nonessential traffic, telemetry, error
reporting, the auto-updater and the non-streaming fallback off, ``CLAUDE_CODE_MAX_RETRIES``
(default 0: a failed call is not replayed with backoff), ``IS_SANDBOX=1`` (needed only when the
sandbox runs the harness as root). Claude Code still re-sends a request that got a 400 with fewer
``anthropic-beta`` features (up to 6 tries), and a request that got a 404 once more unstreamed.

The model name matters: Claude Code shapes the whole request from it. A name it knows (the default,
``claude-sonnet-4-5-20250929``) gives the request a real Sonnet 4.5 session gets (28 k-character
system prompt, ``thinking.type = "enabled"`` with a 31999-token budget, 11 tools; about 19.9 k Qwen3
prompt tokens for a builtin task, which leaves ~12.9 k of the proxy's default 32 k context); an
unknown name gives a smaller prompt (~11.6 k tokens) with ``thinking.type = "adaptive"`` and part of
the system prompt moved into a ``role: "system"`` message. We default to the known name so the
policy trains against the harness as it is really used; pass ``model=`` to choose another, or
``bare=True`` for ``--bare`` (~1.1 k tokens, tools Bash, Edit and Read only).

Invariants: ``launch`` never runs anything; the instruction is passed after ``--`` so an
instruction starting with ``-`` is never read as a flag; ``read_output`` never raises (see
:mod:`harness_adapters.claude_code.stream_json`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import Endpoint, EpisodeResources, HarnessOutput, KindVerdict, LaunchSpec
from clawgym_env.task import Task
from harness_adapters.claude_code.kinds import claude_code_kinds
from harness_adapters.claude_code.stream_json import parse_stream
from harness_adapters.install import NpmPackage
from harness_adapters.npm import NpmHarnessAdapter

PACKAGE = NpmPackage("@anthropic-ai/claude-code", "2.1.332", "claude")
DEFAULT_MODEL = "claude-sonnet-4-5-20250929"
MODEL_VARS = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL",
              "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL")
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no HEAD /api/hello, no lookups of api.anthropic.com
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_COST_WARNINGS": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK": "1",  # a broken stream is not silently re-sent unstreamed
    "IS_SANDBOX": "1",
}


class ClaudeCodeAdapter(NpmHarnessAdapter):
    """Claude Code in ``-p`` (print) mode with stream-json output. Anthropic Messages dialect.

    Args:
        model: the model name Claude Code believes it talks to (shapes its request, see above).
        bare: add ``--bare`` (minimal prompt and tools).
        max_retries: ``CLAUDE_CODE_MAX_RETRIES`` (Claude Code's own default is 10, with backoff).
        extra_args: more command-line arguments, placed before the instruction.
        extra_env: more environment variables (override the defaults above).
        cache_dir: where the pinned package is installed (default: the project cache).
    """

    name = "claude-code"
    resources = EpisodeResources(cpus=0.5, memory_mb=384)  # peak tree RSS measured 179-221 MiB
    dialect = "anthropic_messages"
    package = PACKAGE

    def __init__(self, model: str = DEFAULT_MODEL, bare: bool = False, max_retries: int = 0,
                 extra_args: list[str] | tuple[str, ...] = (), extra_env: dict[str, str] | None = None,
                 cache_dir: str | Path | None = None) -> None:
        self.model = model
        self.bare = bare
        self.max_retries = int(max_retries)
        self.extra_args = [str(a) for a in extra_args]
        self.extra_env = dict(extra_env or {})
        super().__init__(cache_dir=cache_dir)

    def executable(self) -> str:
        """The native ``claude`` binary (raises HarnessError naming the fix when not installed)."""
        return str(self.entry())

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The launch (see the module doc); runs nothing."""
        argv = [self.executable(), "-p", "--output-format", "stream-json", "--verbose",
                "--dangerously-skip-permissions", "--no-session-persistence",
                "--max-turns", str(task.limits.max_turns)]
        if self.bare:
            argv.append("--bare")
        argv += [*self.extra_args, "--", task.instruction]
        env = {"ANTHROPIC_BASE_URL": endpoint.root_url, "ANTHROPIC_API_KEY": endpoint.api_key,
               "CLAUDE_CODE_MAX_RETRIES": str(self.max_retries), **QUIET_ENV}
        env.update({var: self.model for var in MODEL_VARS})
        env.update(self.extra_env)
        return LaunchSpec(argv=argv, env=env, cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The final answer and transcript from the output; never raises."""
        final, transcript, _summary = parse_stream(stdout)
        return HarnessOutput(final_message=final, transcript=transcript)

    def call_kinds(self, calls: Sequence[CallRecord]) -> list[KindVerdict]:
        """Subagents by Claude Code's agent-id header, compaction by its appended instruction block, the rest
        main (see :mod:`harness_adapters.claude_code.kinds`)."""
        return claude_code_kinds(calls)


Adapter = ClaudeCodeAdapter
