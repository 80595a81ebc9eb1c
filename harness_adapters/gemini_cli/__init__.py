"""Gemini CLI (``@google/gemini-cli`` on npm, pinned) run headless in a sandbox, speaking the Gemini API dialect.

The CLI is launched unmodified as ``node bundle/gemini.js -m <model> -o json --approval-mode yolo
--prompt=<instruction>`` with the API-key auth pointed at the proxy: ``GOOGLE_GEMINI_BASE_URL`` = the episode's
root URL (``/ep/<token>``: the CLI appends ``/v1beta/models/<model>:streamGenerateContent``), ``GEMINI_API_KEY`` =
the episode token. Its wire dialect, the Gemini API, lives in :mod:`.dialect` (a plugin on the engine's dialect
seam, entry point ``clawgym.dialects: gemini``).

Invariants:
  * ``launch`` is pure: argv holds absolute paths only (a Node >= 20 binary and the CLI's bundle, under
    ``ro_paths`` or the host toolchain), settings go into HOME through ``LaunchSpec.files``, cwd is the task's
    workspace, and the workspace is trusted through ``GEMINI_CLI_TRUST_WORKSPACE`` (else the CLI exits 55);
  * telemetry, usage statistics and auto-update are off; the CLI's own sandbox is off (the episode's sandbox
    is the sandbox); the only model endpoint is the proxy;
  * the instruction is passed verbatim as ``--prompt=<text>`` (never read as a flag);
  * ``read_output`` never raises: no ``response`` in the JSON output (or an ``error``) means no final answer.
"""

from __future__ import annotations

import json

from clawgym_env.errors import HarnessError
from clawgym_env.harness import Endpoint, EpisodeResources, HarnessOutput, LaunchSpec
from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Task
from harness_adapters.install import NpmPackage
from harness_adapters.npm import NpmHarnessAdapter

PACKAGE = NpmPackage("@google/gemini-cli", "0.61.0", "gemini", min_node=20)
QUIET_ENV = {
    "GEMINI_SANDBOX": "false",
    "GEMINI_CLI_TRUST_WORKSPACE": "true",
    "GEMINI_CLI_NO_RELAUNCH": "true",  # no second Node with a larger heap (the sandbox caps memory)
    "NO_COLOR": "1",
    "NO_BROWSER": "1",
}


def user_settings() -> JSONObject:
    """``~/.gemini/settings.json``: the API-key auth, everything nonessential off."""
    return {"security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "ui": {"hideBanner": True, "hideTips": True},
            "ide": {"enabled": False}}


def parse_output(stdout: str) -> HarnessOutput:
    """The final answer of ``-o json`` output: the ``response`` of the last JSON object that has one and no
    ``error``; never raises."""
    text = (stdout or "").strip()
    start = text.find("{")
    obj: object = None
    while start != -1:
        try:
            obj = json.loads(text[start:])
            break
        except ValueError:
            start = text.find("{", start + 1)
    if not isinstance(obj, dict):
        return HarnessOutput(final_message=None)
    answer = obj.get("response")
    final = answer if isinstance(answer, str) and not obj.get("error") else None
    summary = {k: obj[k] for k in ("session_id", "stats", "error") if k in obj}
    return HarnessOutput(final_message=final, transcript=[{"type": "gemini_result", **summary}])


class GeminiCliAdapter(NpmHarnessAdapter):
    """Gemini CLI in headless one-shot mode against the proxy, over the Gemini API dialect.

    Args:
        api_version: the Gemini API version the CLI calls (``v1beta``, its default, or ``v1``).
        extra_settings: more user settings, merged over ``~/.gemini/settings.json`` (top-level keys replaced).
        extra_env: more environment variables (override the defaults above).
        cache_dir: the harness cache (default: the project cache).
    """

    name = "gemini-cli"
    resources = EpisodeResources(cpus=0.5, memory_mb=768)
    dialect = "gemini"
    package = PACKAGE

    def __init__(self, api_version: str = "v1beta", *, extra_settings: JSONObject | None = None,
                 extra_env: dict[str, str] | None = None, cache_dir: str | None = None) -> None:
        if api_version not in ("v1beta", "v1"):
            raise HarnessError(f"unsupported Gemini API version {api_version!r}; use 'v1beta' or 'v1'")
        self.api_version = api_version
        self.extra_settings = dict(extra_settings or {})
        self.extra_env = dict(extra_env or {})
        super().__init__(cache_dir=cache_dir)

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The launch (see the module doc); runs nothing."""
        argv = [str(self.node()), str(self.entry()), "-m", endpoint.model, "-o", "json", "--approval-mode", "yolo",
                f"--prompt={task.instruction}"]
        env = {**QUIET_ENV, "GOOGLE_GEMINI_BASE_URL": endpoint.root_url, "GEMINI_API_KEY": endpoint.api_key,
               **({"GOOGLE_GENAI_API_VERSION": "v1"} if self.api_version == "v1" else {}), **self.extra_env}
        settings = {**user_settings(), **self.extra_settings}
        files: dict[str, str | bytes] = {f"{home}/.gemini/settings.json": json.dumps(settings, indent=2)}
        return LaunchSpec(argv=argv, env=env, files=files, cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The final answer from the JSON output; never raises."""
        return parse_output(stdout)


Adapter = GeminiCliAdapter
