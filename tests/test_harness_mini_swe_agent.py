"""mini-swe-agent, the real pinned PyPI package in its own venv, run headless (``mini --yolo``) in the
bubblewrap sandbox against the real proxy, driven by the scripted expert through the real tokenizer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from helpers_harness import (
    ENDPOINT,
    EXPERT_TASKS,
    PYPI_OFFLINE_HINTS,
    check_wrong_token_episode,
    hanging_episode,
    installed,
    multi_step_tasks,
)

import clawgym_env  # noqa: F401 - registers the env ids
from clawgym_env.capture.tree import CallTree
from clawgym_env.envs.env import ClawGymEnv
from clawgym_env.envs.runtime import RolloutPool
from clawgym_env.errors import HarnessError
from clawgym_env.policy.base import GenerationContext
from clawgym_env.policy.scripted import ScriptedPolicy, submit_command
from harness_adapters.mini_swe_agent import (
    PACKAGE,
    SUBMIT_SENTINEL,
    TRAJECTORY_MARKER,
    MiniSweAgentAdapter,
    parse_trajectory,
)
from harness_adapters.pypi import base_prefix, venv_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture(scope="module")
def msa():
    return installed("mini-swe-agent", offline_hints=PYPI_OFFLINE_HINTS, installer="pip, venv or the package index")


def _commands(calls) -> list[str]:
    out = []
    for c in calls:
        for tc in c.response_message.get("tool_calls") or []:
            assert tc["function"]["name"] == "bash", tc
            out.append(json.loads(tc["function"]["arguments"])["command"])
    return out


def _trajectory(messages: list[dict], status: str, submission: str) -> str:
    data = {"info": {"exit_status": status, "submission": submission, "model_stats": {"api_calls": 2}},
            "messages": messages, "trajectory_format": "mini-swe-agent-1.1"}
    return "mini's console log\n" + TRAJECTORY_MARKER + "\n" + json.dumps(data, indent=2)


# -- launch, output and the expert's submit step, without running anything ----------------------------
def test_launch_spec_runs_the_pinned_venv_and_is_quiet(msa, builtin_suite):
    task = builtin_suite.get("csv_total")
    spec = msa.launch(task, ENDPOINT, home="/root")
    assert spec.argv[:2] == ["/bin/sh", "-c"] and spec.cwd == task.mount_dir
    trajectory, python, mini = spec.argv[4], spec.argv[5], spec.argv[6]
    assert trajectory.startswith("/root/") and python == str(venv_for(PACKAGE) / "bin" / "python")
    assert mini == str(venv_for(PACKAGE) / "bin" / "mini")
    out = subprocess.run([python, "-c", "import sys, minisweagent; print(sys.prefix, minisweagent.__version__)"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, **spec.env})
    assert out.stdout.split() == [str(venv_for(PACKAGE)), PACKAGE.version], out.stderr
    assert spec.argv[-1] == f"--task={task.instruction}" and "--yolo" in spec.argv
    assert spec.argv[spec.argv.index("--model") + 1] == "openai/clawgym-policy"
    assert f"model.model_kwargs.api_base={ENDPOINT.base_url}" in spec.argv
    assert f"agent.step_limit={task.limits.max_turns}" in spec.argv
    assert spec.env["OPENAI_API_KEY"] == "tok123" and spec.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert spec.env["MSWEA_CONFIGURED"] == "true" and spec.env["MSWEA_GLOBAL_CONFIG_DIR"].startswith("/root/")
    roots = [str(p) for p in msa.ro_paths()]
    assert roots[0] == str(venv_for(PACKAGE)) and str(base_prefix(venv_for(PACKAGE))) in roots
    assert msa.missing() is None


def test_instruction_is_never_read_as_a_flag_and_a_missing_venv_names_the_fix(msa, builtin_suite, tmp_path):
    task = builtin_suite.get("csv_total").model_copy(deep=True)
    task.instruction = "--help? no: " + task.instruction
    spec = MiniSweAgentAdapter(extra_config=["agent.step_limit=3"]).launch(task, ENDPOINT, home="/root")
    assert spec.argv[-1] == f"--task={task.instruction}"
    configs = [spec.argv[i + 1] for i, a in enumerate(spec.argv) if a == "-c" and i > 1]
    assert configs[0] == "mini.yaml" and configs[-1] == "agent.step_limit=3"  # the user's overrides come last
    bare = MiniSweAgentAdapter(cache_dir=str(tmp_path))
    assert "not installed" in bare.missing() and "clawgym harness install mini-swe-agent" in bare.missing()
    with pytest.raises(HarnessError, match="clawgym harness install mini-swe-agent"):
        bare.launch(task, ENDPOINT, home="/root")


def test_trajectory_parsing():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": "", "tool_calls": [], "extra": {"actions": []}}]
    out = parse_trajectory(_trajectory(messages, "Submitted", "42\n"))
    assert out.final_message == "42\n"
    assert [m.get("role") for m in out.transcript[:3]] == ["system", "user", "assistant"]
    assert "extra" not in out.transcript[2] and out.transcript[-1]["exit_status"] == "Submitted"
    assert parse_trajectory(_trajectory(messages, "RepeatedFormatError", "")).final_message is None
    assert parse_trajectory(_trajectory(messages, "LimitsExceeded", "x")).final_message is None
    assert parse_trajectory("no trajectory at all").final_message is None
    assert parse_trajectory(TRAJECTORY_MARKER + "\n{ torn").final_message is None
    assert parse_trajectory(TRAJECTORY_MARKER + "\n[1, 2]").transcript == []


def test_expert_submits_through_the_sentinel_only_where_the_harness_asks():
    answer = "it's 100.14\nline two"
    told = [{"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": f"finish with `echo {SUBMIT_SENTINEL}`"}]}]
    command = submit_command(told, answer)
    assert command is not None
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30).stdout
    assert out == f"{SUBMIT_SENTINEL}\n{answer}"  # mini-swe-agent's submission: the lines after the sentinel
    assert submit_command([{"role": "user", "content": "just answer"}], answer) is None
    bash = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    policy = ScriptedPolicy("noop")
    submit = policy.decide(GenerationContext(messages=told, tools=bash))
    assert "<tool_call>" in submit and SUBMIT_SENTINEL in submit
    plain = policy.decide(GenerationContext(messages=[{"role": "user", "content": "hi"}], tools=bash))
    assert "<tool_call>" not in plain and "I am done." in plain


# -- real episodes -------------------------------------------------------------------------------------
def test_expert_solves_multi_step_tasks_token_exact_on_one_main_thread(msa, expert_runtime, builtin_suite):
    tasks = multi_step_tasks(builtin_suite, EXPERT_TASKS)
    results = RolloutPool(expert_runtime, concurrency=2, progress=False).run(tasks, msa)
    for task, res in zip(tasks, results):
        rec, calls = res.record, res.calls
        assert rec.status == "ok" and rec.reward == 1.0, (rec.task_id, rec.error, rec.reward_reason, rec.logs)
        final = json.loads(task.expert_path.read_text())["steps"][-1]["final"]
        assert rec.final_message == final, (rec.final_message, rec.logs)
        assert rec.num_calls == len(calls) >= 3
        assert {c.path for c in calls} == {calls[0].path} and calls[0].path.endswith("/v1/chat/completions")
        assert all(c.dialect == "openai_chat" and not c.stream for c in calls)
        assert [t["function"]["name"] for t in calls[0].request["tools"]] == ["bash"]
        assert all(c.finish_reason == "tool_calls" for c in calls)  # it ends only on its submit command
        assert _commands(calls)[-1].startswith(f"echo {SUBMIT_SENTINEL} && ")
        for prev, call in zip(calls, calls[1:]):  # a strict prefix, verbatim: the sampled ids come back
            assert call.prompt_token_ids[:len(prev.prompt_token_ids) + len(prev.output_token_ids)] == \
                prev.prompt_token_ids + prev.output_token_ids, (rec.task_id, call.call_index)
        assert all(c.token_exact and len(c.output_logprobs) == len(c.output_token_ids) for c in calls)
        assert [c.kind for c in calls] == ["main"] * len(calls) and all(c.discarded_by is None for c in calls)
        tree = CallTree.from_calls(calls)
        assert len(tree.leaves()) == 1, "one main thread, no branch"
        logs = rec.logs.get("stdout", "") + rec.logs.get("stderr", "")
        assert "raw.githubusercontent.com" not in logs and "Traceback" not in logs, logs[-3000:]


@pytest.mark.slow
def test_env_passes_check_env_and_returns_an_episode(msa, tmp_path):
    env = gym.make("ClawGym/MiniSweAgent-v0", policy="scripted:expert", out_dir=tmp_path,
                   task_ids=["count_words_answer", "csv_total"])
    try:
        assert isinstance(env.unwrapped, ClawGymEnv) and env.unwrapped.adapter.name == "mini-swe-agent"
        check_env(env.unwrapped, skip_render_check=True)
        obs, _ = env.reset(options={"task_id": "builtin/csv_total"})
        obs, reward, terminated, truncated, info = env.step(None)
        assert terminated and not truncated and reward == 1.0, info["episode"]["logs"]
        assert obs["status"] == "ok" and len(obs["calls"]) == info["episode"]["num_calls"] >= 2
    finally:
        env.close()


@pytest.mark.slow
def test_hanging_harness_times_out_with_logs_and_leaves_no_process(msa, builtin_suite, tmp_path):
    slow = MiniSweAgentAdapter(command_timeout_s=120)  # the command outlives the episode, not mini's own timeout
    res, marker = hanging_episode(slow, builtin_suite, tmp_path, steps=3, timeout_s=15)
    assert res.record.num_calls == 1
    assert marker in res.record.logs["stdout"], "mini's console log shows the hanging command"


def test_wrong_token_is_an_infra_failure_with_logs(msa, expert_runtime, builtin_suite):
    check_wrong_token_episode(msa, expert_runtime, builtin_suite, evidence="NotFoundError")
