"""Gemini CLI, the real pinned CLI, run headless (``-o json``) in the bubblewrap sandbox against the real proxy over
the Gemini API dialect (a plugin on the dialect seam), driven by the scripted expert through the real tokenizer."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from helpers_harness import ENDPOINT, EXPERT_TASKS, check_expert_episode, installed, multi_step_tasks, tools_called

from clawgym_env.envs.runtime import RolloutPool
from clawgym_env.errors import HarnessError
from clawgym_env.plugins import harnesses
from harness_adapters.gemini_cli import PACKAGE, GeminiCliAdapter, parse_output
from harness_adapters.install import prefix_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

STREAM_ROUTE = "beta/models/clawgym-policy:streamGenerateContent"  # after /ep/<token>/v1


@pytest.fixture(scope="module")
def gemini():
    return installed("gemini-cli")


# -- launch and output, without running anything ---------------------------------------------------
def test_launch_spec_is_pinned_and_points_at_the_proxy(gemini, builtin_suite):
    assert harnesses.load("gemini-cli") is GeminiCliAdapter
    task = builtin_suite.get("csv_total")
    spec = gemini.launch(task, ENDPOINT, home="/root")
    node, entry = spec.argv[0], spec.argv[1]
    assert node.startswith("/") and entry.endswith("/@google/gemini-cli/bundle/gemini.js")
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    assert int(out.strip().lstrip("v").split(".")[0]) >= 20
    assert spec.argv[-1] == f"--prompt={task.instruction}" and spec.cwd == task.mount_dir
    assert spec.argv[spec.argv.index("-o") + 1] == "json"
    assert spec.argv[spec.argv.index("--approval-mode") + 1] == "yolo"
    assert spec.env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:18080/ep/tok123"
    assert spec.env["GEMINI_API_KEY"] == "tok123" and spec.env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
    assert "GOOGLE_GENAI_API_VERSION" not in spec.env
    settings = json.loads(spec.files["/root/.gemini/settings.json"])
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["telemetry"]["enabled"] is False and settings["privacy"]["usageStatisticsEnabled"] is False
    assert str(prefix_for(PACKAGE)) in [str(p) for p in gemini.ro_paths()] and gemini.package is PACKAGE
    v1 = GeminiCliAdapter(api_version="v1").launch(task, ENDPOINT, home="/root")
    assert v1.env["GOOGLE_GENAI_API_VERSION"] == "v1"
    with pytest.raises(HarnessError, match="'v1beta' or 'v1'"):
        GeminiCliAdapter(api_version="v2")


def test_output_parsing():
    good = {"session_id": "s", "response": "the answer", "stats": {"models": {}}}
    out = parse_output("Loaded cached credentials.\n" + json.dumps(good, indent=2) + "\n")
    assert out.final_message == "the answer" and out.transcript[0]["session_id"] == "s"
    failed = {"session_id": "s", "error": {"type": "FatalError", "message": "boom", "code": 1}}
    assert parse_output(json.dumps(failed)).final_message is None
    assert parse_output("").final_message is None and parse_output("{not json").final_message is None


# -- real episodes -------------------------------------------------------------------------------------
def test_expert_solves_multi_step_tasks(gemini, expert_runtime, builtin_suite, tokenizer):
    tasks = multi_step_tasks(builtin_suite, EXPERT_TASKS)
    results = RolloutPool(expert_runtime, concurrency=2, progress=False).run(tasks, gemini)
    for res in results:
        check_expert_episode(res, tokenizer, route=STREAM_ROUTE)
        assert {c.dialect for c in res.calls} == {"gemini"} and all(c.stream for c in res.calls)
        assert all(c.token_exact for c in res.calls), [c.token_exact_reason for c in res.calls]
        for prev, nxt in zip(res.calls, res.calls[1:]):  # the re-sent history renders to the ids the policy saw
            head = prev.prompt_token_ids + prev.output_token_ids
            assert nxt.prompt_token_ids[:len(head)] == head
        first = res.calls[0]
        assert first.request["systemInstruction"]["parts"]
        offered = {f["name"] for t in first.request["tools"] for f in t.get("functionDeclarations", [])}
        assert {"run_shell_command", "read_file", "write_file"} <= offered
        ids = [tc["id"] for c in res.calls for tc in c.response_message.get("tool_calls") or []]
        echoed = [p["functionResponse"].get("id") for c in res.calls[-1:] for content in c.request["contents"]
                  for p in content["parts"] if "functionResponse" in p]
        assert echoed == ids  # the CLI answers each call by the id the proxy gave it
        assert re.fullmatch(r"/ep/[^/]+/v1beta/models/clawgym-policy:streamGenerateContent", first.path)
    assert {"run_shell_command", "read_file"} <= tools_called(results[0].calls)
    assert {"run_shell_command", "write_file"} <= tools_called(results[1].calls)
    assert "write_file" in tools_called(results[2].calls)


def test_expert_over_the_v1_api(gemini, expert_runtime, builtin_suite, tokenizer):
    adapter = GeminiCliAdapter(api_version="v1", cache_dir=gemini.cache_dir)
    res = expert_runtime.run(builtin_suite.get("backup_and_edit_config"), adapter)
    check_expert_episode(res, tokenizer, route="/models/clawgym-policy:streamGenerateContent")
    assert {c.dialect for c in res.calls} == {"gemini"}
