"""Codex, the real binary, inside the bubblewrap sandbox, against the proxy's OpenAI Responses dialect."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import tomllib
from gymnasium.utils.env_checker import check_env

import clawgym_env  # noqa: F401 - registers the env ids
from clawgym_env.errors import HarnessError
from clawgym_env.harness import Endpoint
from clawgym_env.plugins import make_harness
from harness_adapters.codex import CodexAdapter
from harness_adapters.codex.config import KEY_ENV, PROVIDER, codex_config, parse_events, render_toml

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
    return installed(make_harness("codex"))


def test_launch_spec_and_config(builtin_suite):
    task = builtin_suite.tasks[0].model_copy(update={"instruction": "-v: say \"hi\" \\ now"})
    ad = CodexAdapter(extra_args=["--add-dir", "/tmp"], context_window=32768)
    spec = ad.launch(task, ENDPOINT, home="/root")
    argv = spec.argv
    assert argv[1] == "exec" and {"--skip-git-repo-check", "--json", "--strict-config"} <= set(argv)
    assert argv[-2:] == ["--", task.instruction] and argv.index("--add-dir") < argv.index("--")
    assert spec.cwd == task.mount_dir
    assert spec.env["CODEX_HOME"] == "/root/.codex" and spec.env[KEY_ENV] == "TOKEN123"
    cfg = tomllib.loads(spec.files["/root/.codex/config.toml"])
    assert cfg["model_provider"] == PROVIDER and cfg["model"] == ENDPOINT.model
    assert cfg["approval_policy"] == "never" and cfg["sandbox_mode"] == "danger-full-access"
    assert cfg["check_for_update_on_startup"] is False and cfg["analytics"] == {"enabled": False}
    assert cfg["model_context_window"] == 32768
    provider = cfg["model_providers"][PROVIDER]
    assert provider["base_url"] == ENDPOINT.base_url and provider["wire_api"] == "responses"
    assert provider["env_key"] == KEY_ENV and provider["request_max_retries"] == provider["stream_max_retries"] == 0


def test_toml_round_trips_awkward_strings_and_rejects_objects():
    odd = 'quote " backslash \\ newline \n tab \t unicode é ☃'
    cfg = codex_config("http://h/v1", odd, extra={"features": {"x": True}, "notify": ["a", "b"]})
    back = tomllib.loads(render_toml(cfg))
    assert back["model"] == odd and back["features"] == {"plugins": False, "apps": False, "x": True}
    assert back["notify"] == ["a", "b"]
    with pytest.raises(HarnessError, match="unsupported type"):
        render_toml({"a": object()})


def test_read_output():
    events = [
        {"type": "thread.started", "thread_id": "t"},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "i1", "type": "command_execution", "command": "ls",
                                            "aggregated_output": "a\n", "exit_code": 0}},
        {"type": "item.completed", "item": {"id": "i2", "type": "agent_message", "text": "first"}},
        {"type": "item.completed", "item": {"id": "i3", "type": "agent_message", "text": "It is a."}},
        {"type": "turn.completed", "usage": {"input_tokens": 5}},
    ]
    stdout = "\n".join(json.dumps(e) for e in events) + "\nnot json\n"
    out = CodexAdapter().read_output(stdout, "")
    assert out.final_message == "It is a." and [i["id"] for i in out.transcript] == ["i1", "i2", "i3"]
    failed = events[:4] + [{"type": "error", "message": "boom"}, {"type": "turn.failed", "error": {"message": "boom"}}]
    final, transcript, summary = parse_events("\n".join(json.dumps(e) for e in failed))
    assert final is None and summary["failed"] and transcript[-1] == {"type": "error", "message": "boom"}
    assert CodexAdapter().read_output("", "panic").final_message is None


def test_runs_the_native_binary(adapter):
    adapter.install()  # a no-op now
    exe = adapter.executable()
    assert exe.startswith(str(adapter.ro_paths()[0]))
    with open(exe, "rb") as fh:
        head = fh.read(4)
    assert head == b"\x7fELF" or exe.endswith(".js")


def test_expert_solves_builtin_tasks_in_bwrap(adapter, expert_runtime, builtin_suite, tokenizer):
    tasks = multi_step_tasks(builtin_suite, 2, want=("json_merge_config", "fix_failing_test"))
    for task in tasks:
        res = expert_runtime.run(task, adapter)
        check_expert_episode(res, tokenizer, "openai_responses", "/v1/responses")
        first = res.calls[0]
        assert first.stream and first.request["model"] == "clawgym-policy"
        offered = {t.get("name") for t in first.request["tools"]}
        assert "exec_command" in offered
        used = {tc["function"]["name"] for c in res.calls for tc in c.response_message.get("tool_calls") or []}
        assert used == {"exec_command"}
        # every command Codex ran for the expert exited 0 (as Codex reported it back to the model)
        outputs = [i for i in res.calls[-1].request["input"] if i.get("type") == "function_call_output"]
        assert len(outputs) == len(res.calls) - 1
        assert all("Process exited with code 0" in json.dumps(i["output"]) for i in outputs), outputs


def test_gym_env_check_and_episode(tmp_path):
    env = gym.make("ClawGym/Codex-v0", policy="scripted:expert", out_dir=tmp_path)
    try:
        installed(env.unwrapped.adapter)
        check_env(env.unwrapped, skip_render_check=True)
        obs, _ = env.reset(options={"task_id": "csv_total"})
        obs, reward, terminated, truncated, info = env.step(None)
        assert terminated and not truncated and obs["status"] == "ok" and reward == 1.0, info["episode"]["logs"]
        assert len(obs["calls"]) >= 3 and all(c["dialect"] == "openai_responses" for c in info["calls"])
    finally:
        env.close()


@pytest.mark.parametrize("bad", [{"extra_args": ["--no-such-flag-clawgym"]},
                                 {"extra_config": {"no_such_key_clawgym": True}}], ids=["flag", "config-key"])
def test_crashing_harness_is_a_record(adapter, expert_runtime, builtin_suite, bad):
    res = expert_runtime.run(builtin_suite.tasks[0], CodexAdapter(**bad))
    rec = res.record
    assert rec.status == "infra_error" and rec.failure_boundary == "harness", (rec.status, rec.logs)
    assert rec.exit_code not in (0, None) and "no model answer" in rec.error
    assert "no_such" in (rec.logs["stderr"] + rec.logs["stdout"]).replace("-", "_") and rec.num_calls == 0


def test_hanging_harness_times_out_and_leaves_no_process(adapter, builtin_suite, tmp_path):
    res, seen, marker = run_hanging_episode(builtin_suite, adapter, tmp_path)
    rec = res.record
    assert seen, "the sleeping tool command never ran inside the sandbox"
    assert rec.status == "timeout" and 1 <= rec.num_calls <= 3, (rec.status, rec.error, rec.logs)
    assert "thread.started" in rec.logs["stdout"]  # Codex's JSONL up to the kill is kept
    assert survivors(marker) == [], "processes of the killed episode survived"
