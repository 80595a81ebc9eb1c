"""Codex (``@openai/codex``), run unmodified with ``codex exec`` against the proxy.

Codex speaks only the OpenAI Responses dialect (``POST {base_url}/responses``, streamed). The npm
package's ``bin/codex.js`` only picks and starts a static (musl) native binary from the platform
package; we start that binary directly (no Node.js at run time, signals reach Codex itself) and fall
back to the JS launcher where no native binary matches this machine.

Launch (cwd = the task's workspace, as the sandbox's non-root uid, private HOME)::

    codex exec --skip-git-repo-check --json --ephemeral --strict-config --color never [extra_args...] -- "<instruction>"

with ``CODEX_HOME=<home>/.codex`` holding the ``config.toml`` from
:func:`harness_adapters.codex.config.codex_config` (a provider whose ``base_url`` is the episode's
``/v1`` URL, ``wire_api = "responses"``, key from ``CLAWGYM_CODEX_API_KEY``, approvals never,
``sandbox_mode = "danger-full-access"``, analytics, update check, plugins and apps off, retries 0).

Invariants: ``launch`` never runs anything; the instruction comes after ``--``; ``read_output``
never raises; the config file is written into the sandbox's private HOME only; ``--strict-config``
makes Codex refuse (exit non-zero, a ``harness_error`` record) a config key this version does not know,
so a misspelt switch can never be silently ignored.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from pathlib import Path

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import Endpoint, EpisodeResources, HarnessOutput, KindVerdict, LaunchSpec
from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Task
from harness_adapters.codex.config import KEY_ENV, codex_config, parse_events, render_toml
from harness_adapters.codex.kinds import codex_kinds
from harness_adapters.install import NpmPackage
from harness_adapters.npm import NpmHarnessAdapter

PACKAGE = NpmPackage("@openai/codex", "0.171.0", "codex")
#: machine → (platform package, Rust target triple) for Linux, as ``bin/codex.js`` maps them
NATIVE = {"x86_64": ("@openai/codex-linux-x64", "x86_64-unknown-linux-musl"),
          "aarch64": ("@openai/codex-linux-arm64", "aarch64-unknown-linux-musl")}


class CodexAdapter(NpmHarnessAdapter):
    """``codex exec --json``. OpenAI Responses dialect.

    Args:
        model: the model name Codex is told (default: the endpoint's served model name). Codex has
            no metadata for names it does not know and says so on stderr; the request is the same.
        context_window: ``model_context_window`` (Codex compacts the conversation near it); None
            leaves Codex's fallback.
        extra_config: more config keys (a dict value merges into the table of that name).
        extra_args: more ``codex exec`` arguments, placed before the instruction.
        extra_env: more environment variables.
        cache_dir: where the pinned package is installed (default: the project cache).
    """

    name = "codex"
    resources = EpisodeResources(cpus=0.5, memory_mb=256)  # peak tree RSS measured 80-154 MiB
    dialect = "openai_responses"
    package = PACKAGE

    def __init__(self, model: str | None = None, context_window: int | None = None,
                 extra_config: JSONObject | None = None, extra_args: list[str] | tuple[str, ...] = (),
                 extra_env: dict[str, str] | None = None, cache_dir: str | Path | None = None) -> None:
        self.model = model
        self.context_window = context_window
        self.extra_config = dict(extra_config or {})
        self.extra_args = [str(a) for a in extra_args]
        self.extra_env = dict(extra_env or {})
        super().__init__(cache_dir=cache_dir)

    def executable(self) -> str:
        """The native Codex binary, else the npm launcher (raises HarnessError when not installed)."""
        launcher = self.entry()  # also checks the install exists
        native = NATIVE.get(platform.machine()) if platform.system() == "Linux" else None
        if native is not None:
            pkg, triple = native
            exe = self.prefix() / "node_modules" / pkg / "vendor" / triple / "bin" / "codex"
            if exe.is_file():
                return str(exe)
        return str(launcher)

    def config_toml(self, endpoint: Endpoint) -> str:
        """The ``config.toml`` pointing Codex at ``endpoint`` (see :mod:`harness_adapters.codex.config`)."""
        cfg = codex_config(endpoint.base_url, self.model or endpoint.model, context_window=self.context_window,
                           extra=self.extra_config)
        return render_toml(cfg)

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The launch (see the module doc); runs nothing."""
        codex_home = f"{home.rstrip('/')}/.codex"
        argv = [self.executable(), "exec", "--skip-git-repo-check", "--json", "--ephemeral", "--strict-config",
                "--color", "never", *self.extra_args, "--", task.instruction]
        env = {"CODEX_HOME": codex_home, KEY_ENV: endpoint.api_key, "CODEX_MANAGED_BY_NPM": "1",
               "CODEX_MANAGED_PACKAGE_ROOT": str(self.prefix() / "node_modules" / "@openai" / "codex"),
               "NO_COLOR": "1", **self.extra_env}
        files: dict[str, str | bytes] = {f"{codex_home}/config.toml": self.config_toml(endpoint)}
        return LaunchSpec(argv=argv, env=env, files=files, cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The final answer and transcript from the output; never raises."""
        final, transcript, _summary = parse_events(stdout)
        return HarnessOutput(final_message=final, transcript=transcript)

    def call_kinds(self, calls: Sequence[CallRecord]) -> list[KindVerdict]:
        """Main turns and compaction calls by the ``x-codex-turn-metadata`` header Codex writes (see
        :mod:`harness_adapters.codex.kinds`)."""
        return codex_kinds(calls)


Adapter = CodexAdapter
