"""Claude Code, the real binary, inside the bubblewrap sandbox, against the proxy's Anthropic dialect."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import clawgym_env  # noqa: F401 - registers the env ids
from clawgym_env.envs.runtime import Runtime
from clawgym_env.harness import Endpoint
from clawgym_env.plugins import make_harness
from harness_adapters.claude_code import DEFAULT_MODEL, ClaudeCodeAdapter
from harness_adapters.claude_code.stream_json import parse_stream

try:
    from helpers_claude_codex import check_expert_episode, installed, multi_step_tasks, run_hanging_episode, survivors
except ImportError:  # tests run as a package
    from tests.helpers_claude_codex import (
        check_expert_episode,
        installed,
        multi_step_tasks,
        run_hanging_episode,
        survivors,
    )

ENDPOINT = Endpoint(base_url="http://127.0.0.1:18080/ep/TOKEN123/v1", api_key="TOKEN123")


@pytest.fixture(scope="module")
def adapter():
    return installed(make_harness("claude-code"))


def test_launch_spec(builtin_suite):
    task = builtin_suite.tasks[0].model_copy(update={"instruction": "--help me: count the words"})
    spec = ClaudeCodeAdapter(bare=True, extra_args=["--effort", "low"]).launch(task, ENDPOINT, home="/root")
    assert spec.cwd == task.mount_dir
    argv = spec.argv
    assert argv[1] == "-p" and "--dangerously-skip-permissions" in argv and "--bare" in argv
    assert argv[argv.index("--output-format") + 1] == "stream-json" and "--verbose" in argv
    assert argv[argv.index("--max-turns") + 1] == str(task.limits.max_turns)
    # the instruction is the last argument, after "--", so a leading "-" is not read as a flag
    assert argv[-2:] == ["--", task.instruction] and argv.index("--effort") < argv.index("--")
    env = spec.env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080/ep/TOKEN123"  # the client appends /v1
    assert env["ANTHROPIC_API_KEY"] == "TOKEN123"
    for var in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL"):
        assert env[var] == DEFAULT_MODEL
    for var in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER", "IS_SANDBOX"):
        assert env[var] == "1"
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "0"
    assert "--bare" not in ClaudeCodeAdapter().launch(task, ENDPOINT, home="/root").argv


def test_read_output_success_and_error():
    lines = [
        {"type": "system", "subtype": "init", "tools": ["Bash", "Read"], "session_id": "s"},
        {"type": "assistant", "message": {"id": "m1", "content": [{"type": "thinking", "thinking": "hm"}]}},
        {"type": "assistant", "message": {"id": "m1", "content": [
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]}},
        {"type": "assistant", "message": {"id": "m2", "content": [{"type": "text", "text": "There is a.txt."}]}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "There is a.txt.", "num_turns": 2},
    ]
    stdout = "warning: not json\n" + "\n".join(json.dumps(x) for x in lines) + "\n"
    out = ClaudeCodeAdapter().read_output(stdout, "")
    assert out.final_message == "There is a.txt."
    assert [m["role"] for m in out.transcript] == ["assistant", "user", "assistant"]
    assert [b["type"] for b in out.transcript[0]["content"]] == ["thinking", "tool_use"]  # one API message
    err = dict(lines[-1], is_error=True, result="API Error: 502 the policy failed")
    final, transcript, summary = parse_stream("\n".join(json.dumps(x) for x in [*lines[:-1], err]))
    assert final is None and summary["is_error"] is True
    assert transcript[-1]["role"] == "error" and "502" in transcript[-1]["content"][0]["text"]
    assert ClaudeCodeAdapter().read_output("", "Segmentation fault").final_message is None


def test_install_is_idempotent_and_visible_read_only(adapter):
    adapter.install()  # a no-op now
    prefix = adapter.ro_paths()[0]
    assert prefix.is_dir() and adapter.executable().startswith(str(prefix))


def test_expert_solves_builtin_tasks_in_bwrap(adapter, expert_runtime, builtin_suite, tokenizer):
    tasks = multi_step_tasks(builtin_suite, 2, want=("backup_and_edit_config", "fix_off_by_one"))
    for task in tasks:
        res = expert_runtime.run(task, adapter)
        check_expert_episode(res, tokenizer, "anthropic_messages", "/v1/messages")
        first = res.calls[0]
        assert first.stream and first.request["model"] == DEFAULT_MODEL
        offered = {t["name"] for t in first.request["tools"]}
        assert {"Bash", "Read", "Write", "Edit"} <= offered
        used = {tc["function"]["name"] for c in res.calls for tc in c.response_message.get("tool_calls") or []}
        assert used and used <= {"Bash", "Read", "Write"}
        # the conversation Claude Code sent last: one non-error tool_result per tool call
        results = [b for m in res.calls[-1].request["messages"] if m["role"] == "user"
                   for b in (m["content"] if isinstance(m["content"], list) else []) if b.get("type") == "tool_result"]
        assert len(results) == len(res.calls) - 1 and not any(b.get("is_error") for b in results), results


def test_gym_env_check_and_episode(tmp_path):
    env = gym.make("ClawGym/ClaudeCode-v0", policy="scripted:expert", out_dir=tmp_path)
    try:
        installed(env.unwrapped.adapter)
        check_env(env.unwrapped, skip_render_check=True)
        obs, _ = env.reset(options={"task_id": "csv_total"})
        obs, reward, terminated, truncated, info = env.step(None)
        assert terminated and not truncated and obs["status"] == "ok" and reward == 1.0, info["episode"]["logs"]
        assert len(obs["calls"]) >= 3 and all(c["dialect"] == "anthropic_messages" for c in info["calls"])
    finally:
        env.close()


def test_crashing_harness_is_a_record(adapter, expert_runtime, builtin_suite):
    bad = ClaudeCodeAdapter(extra_args=["--no-such-flag-clawgym"])
    res = expert_runtime.run(builtin_suite.tasks[0], bad)
    rec = res.record
    # the model never acted: the harness's own failure is infrastructure (boundary harness), never trained
    assert rec.status == "infra_error" and rec.failure_boundary == "harness" and rec.exit_code not in (0, None)
    assert "no-such-flag-clawgym" in rec.logs["stderr"] and rec.num_calls == 0 and rec.reward == 0.0


def test_hanging_harness_times_out_and_leaves_no_process(adapter, builtin_suite, tmp_path):
    res, seen, marker = run_hanging_episode(builtin_suite, adapter, tmp_path)
    rec = res.record
    assert seen, "the sleeping tool command never ran inside the sandbox"
    assert rec.status == "timeout" and 1 <= rec.num_calls <= 3, (rec.status, rec.error, rec.logs)
    assert "system" in rec.logs["stdout"]  # the harness's stream-json output up to the kill is kept
    assert survivors(marker) == [], "processes of the killed episode survived"


def test_runtime_with_bare_mode(adapter, builtin_suite, tokenizer, tmp_path):
    task = multi_step_tasks(builtin_suite, 1)[0]
    with Runtime("scripted:expert", out_dir=tmp_path) as rt:
        res = rt.run(task, ClaudeCodeAdapter(bare=True))
    check_expert_episode(res, tokenizer, "anthropic_messages", "/v1/messages")
    assert {t["name"] for t in res.calls[0].request["tools"]} == {"Bash", "Edit", "Read"}
    assert len(res.calls[0].prompt_token_ids) < 3000
