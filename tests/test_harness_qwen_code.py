"""Qwen Code, the real pinned CLI, run headless (``--output-format stream-json``) in the bubblewrap
sandbox against the real proxy, driven by the scripted expert through the real tokenizer."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from helpers_harness import (
    check_expert_episode,
    hanging_script,
    installed,
    marked_task,
    multi_step_tasks,
)

import clawgym_env  # noqa: F401 - registers the env ids
from clawgym_env.envs.runtime import RolloutPool, Runtime
from clawgym_env.errors import HarnessError
from clawgym_env.harness import Endpoint
from clawgym_env.testing import Marked, Watch, assert_no_survivors
from harness_adapters.install import NODE24, prefix_for
from harness_adapters.qwen_code import PACKAGE, QwenCodeAdapter
from harness_adapters.qwen_code.stream import parse_stream

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

EXPERT_TASKS = ["backup_and_edit_config", "archive_site", "implement_function"]  # shell+read; +write; overwrite
ENDPOINT = Endpoint(base_url="http://127.0.0.1:18080/ep/tok123/v1", api_key="tok123")


@pytest.fixture(scope="module")
def qwen():
    return installed("qwen-code")


def _tools_called(calls) -> set[str]:
    return {tc["function"]["name"] for c in calls for tc in c.response_message.get("tool_calls") or []}


# -- launch and output, without running anything ---------------------------------------------------
def test_launch_spec_is_pinned_and_quiet(qwen, builtin_suite):
    task = builtin_suite.get("csv_total")
    spec = qwen.launch(task, ENDPOINT, home="/root")
    node, entry = spec.argv[0], spec.argv[1]
    assert node.startswith("/") and entry.endswith("/@qwen-code/qwen-code/cli-entry.js")
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    assert int(out.strip().lstrip("v").split(".")[0]) >= 22
    assert spec.argv[-1] == task.instruction and spec.cwd == task.mount_dir
    assert spec.argv[spec.argv.index("--auth-type") + 1] == "openai" and "--yolo" in spec.argv
    assert spec.argv[spec.argv.index("--output-format") + 1] == "stream-json"
    assert (spec.env["OPENAI_BASE_URL"], spec.env["OPENAI_API_KEY"]) == (ENDPOINT.base_url, "tok123")
    user = json.loads(spec.files["/root/.qwen/settings.json"])
    system = json.loads(spec.files[spec.env["QWEN_CODE_SYSTEM_SETTINGS_PATH"]])
    for settings in (user, system):
        assert settings["telemetry"]["enabled"] is False
        assert settings["privacy"]["usageStatisticsEnabled"] is False
        assert settings["general"]["enableAutoUpdate"] is False
    assert user["security"]["auth"]["selectedType"] == "openai"
    assert str(prefix_for(PACKAGE)) in [str(p) for p in qwen.ro_paths()] and qwen.package is PACKAGE
    roots = [str(p) for p in qwen.ro_paths()]
    assert any(node.startswith(r + "/") for r in roots) or not node.startswith(str(prefix_for(NODE24)))


def test_instruction_is_never_read_as_a_flag(builtin_suite):
    task = builtin_suite.get("csv_total").model_copy(deep=True)
    task.instruction = "--version? no: " + task.instruction
    spec = QwenCodeAdapter().launch(task, ENDPOINT, home="/root")
    assert spec.argv[-1] == f"--prompt={task.instruction}"
    anthropic = QwenCodeAdapter(auth_type="anthropic").launch(task, ENDPOINT, home="/root")
    assert anthropic.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080/ep/tok123"
    with pytest.raises(HarnessError, match="auth type"):
        QwenCodeAdapter(auth_type="qwen-oauth")


def test_stream_parsing():
    lines = [{"type": "system", "subtype": "init", "tools": ["run_shell_command"]},
             {"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}},
             {"type": "result", "subtype": "success", "is_error": False, "result": "hi", "num_turns": 1}]
    out = parse_stream("noise\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    assert out.final_message == "hi"
    assert out.transcript[0]["role"] == "assistant" and out.transcript[-1]["type"] == "qwen_result"
    failed = {"type": "result", "subtype": "error_during_execution", "is_error": True, "result": "x"}
    assert parse_stream(json.dumps(failed)).final_message is None
    assert parse_stream("").final_message is None


# -- real episodes -------------------------------------------------------------------------------------
def test_expert_solves_multi_step_tasks(qwen, expert_runtime, builtin_suite, tokenizer):
    tasks = multi_step_tasks(builtin_suite, EXPERT_TASKS)
    results = RolloutPool(expert_runtime, concurrency=2, progress=False).run(tasks, qwen)
    for res in results:
        check_expert_episode(res, tokenizer)
        first = res.calls[0]
        assert first.stream and first.dialect == "openai_chat"
        assert res.record.resources.get("harness_started_at")
        offered = {t["function"]["name"] for t in first.request["tools"]}
        assert {"run_shell_command", "read_file", "write_file"} <= offered
    assert {"run_shell_command", "read_file"} <= _tools_called(results[0].calls)
    assert {"run_shell_command", "write_file"} <= _tools_called(results[1].calls)
    assert "write_file" in _tools_called(results[2].calls)  # overwrites a file it has read first


@pytest.mark.parametrize("auth_type,dialect,route", [("anthropic", "anthropic_messages", "/messages"),
                                                     ("openai-responses", "openai_responses", "/responses")])
def test_expert_over_other_dialects(qwen, expert_runtime, builtin_suite, tokenizer, auth_type, dialect, route):
    res = expert_runtime.run(builtin_suite.get("backup_and_edit_config"), QwenCodeAdapter(auth_type=auth_type))
    check_expert_episode(res, tokenizer, route=route)
    assert {c.dialect for c in res.calls} == {dialect}


def test_leading_dash_instruction_reaches_the_model(qwen, expert_runtime, builtin_suite):
    task = builtin_suite.get("count_words_answer").model_copy(deep=True)
    task.instruction = "--help: " + task.instruction
    res = expert_runtime.run(task, qwen)
    assert res.record.status == "ok" and res.record.reward == 1.0, (res.record.error, res.record.logs)
    texts = [part["text"] for m in res.calls[0].request["messages"] if m["role"] == "user"
             for part in (m["content"] if isinstance(m["content"], list) else [{"text": m["content"]}])]
    assert any(t.startswith(task.instruction) for t in texts), texts


def test_gym_env_passes_check_env_and_returns_an_episode(qwen, tmp_path):
    env = gym.make("ClawGym/QwenCode-v0", policy="scripted:expert", out_dir=tmp_path,
                   task_ids=["count_words_answer", "csv_total"])
    try:
        check_env(env.unwrapped, skip_render_check=True)
        obs, _ = env.reset(options={"task_id": "builtin/csv_total"})
        obs, reward, terminated, truncated, info = env.step(None)
        assert terminated and not truncated and reward == 1.0, info["episode"]["logs"]
        assert obs["status"] == "ok" and len(obs["calls"]) == info["episode"]["num_calls"] >= 2
    finally:
        env.close()


def test_hanging_harness_times_out_with_logs_and_leaves_no_process(qwen, builtin_suite, tmp_path):
    marker = uuid.uuid4().hex
    script = hanging_script(tmp_path, marker, steps=3)  # the shell tool waits up to 2 min per command
    task = marked_task(builtin_suite.get("csv_total"), marker, timeout_s=15)
    with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "eps") as rt:
        with Watch(marker) as watch:
            res = rt.run(task, Marked(qwen, marker))
    rec = res.record
    assert watch.seen, "the harness's processes were visible to the survivor check while it ran"
    assert rec.status == "timeout", (rec.status, rec.error, rec.logs)
    assert rec.num_calls == 1 and rec.reward < 1.0
    assert marker in rec.logs["stdout"], "the stream-json log shows the hanging tool call"
    assert_no_survivors(marker)


def test_wrong_token_is_an_infra_failure_with_logs(qwen, expert_runtime, builtin_suite):
    marker = uuid.uuid4().hex
    task = marked_task(builtin_suite.get("csv_total"), marker)
    res = expert_runtime.run(task, Marked(qwen, marker, wrong_token=True))
    rec = res.record
    # every request was refused before the model answered: not the agent's failure, never trained
    assert rec.status == "infra_error" and rec.failure_boundary == "harness", (rec.status, rec.logs)
    assert rec.num_calls == 0 and rec.final_message is None and rec.reward < 1.0
    assert "404" in rec.logs["stdout"], rec.logs
    assert_no_survivors(marker)
