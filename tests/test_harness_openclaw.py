"""OpenClaw, the real pinned CLI on Node 24, run headless (``agent exec``) in the bubblewrap sandbox
against the real proxy, driven by the scripted expert through the real tokenizer.

OpenClaw needs 7-20 s to start on a small machine, so the number of episodes here is kept small:
two expert tasks over Chat Completions, one each over the Anthropic Messages and Responses
dialects, two inside ``check_env`` plus one more through ``gym.make``, one timeout and one
wrong-token episode.
"""

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
from clawgym_env.envs.runtime import Runtime
from clawgym_env.errors import HarnessError
from clawgym_env.harness import Endpoint
from clawgym_env.testing import Marked, Watch, assert_no_survivors
from harness_adapters.install import NODE24, prefix_for
from harness_adapters.openclaw import PACKAGE, OpenClawAdapter
from harness_adapters.openclaw.envelope import parse_envelope

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

EXPERT_TASKS = ["backup_and_edit_config", "archive_site"]  # exec + read; exec + write
ENDPOINT = Endpoint(base_url="http://127.0.0.1:18080/ep/tok123/v1", api_key="tok123")


@pytest.fixture(scope="module")
def openclaw():
    return installed("openclaw")


def _tools_called(calls) -> set[str]:
    return {tc["function"]["name"] for c in calls for tc in c.response_message.get("tool_calls") or []}


# -- launch and output, without running anything ---------------------------------------------------
def test_launch_spec_is_pinned_and_absolute(openclaw, builtin_suite):
    task = builtin_suite.get("csv_total")
    spec = openclaw.launch(task, ENDPOINT, home="/root")
    node, entry = spec.argv[0], spec.argv[1]
    assert node.startswith("/") and entry.endswith("/node_modules/openclaw/openclaw.mjs")
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    assert int(out.strip().lstrip("v").split(".")[0]) >= 24
    assert spec.argv[2:4] == ["agent", "exec"] and "--json" in spec.argv
    config_path = spec.argv[spec.argv.index("--config") + 1]
    message_path = spec.argv[spec.argv.index("--message-file") + 1]
    assert spec.files[message_path] == task.instruction
    assert spec.argv[spec.argv.index("--cwd") + 1] == spec.cwd == task.mount_dir
    assert int(spec.argv[spec.argv.index("--timeout") + 1]) > task.limits.timeout_s
    provider = json.loads(spec.files[config_path])["models"]["providers"]["clawgym"]
    assert provider["baseUrl"] == ENDPOINT.base_url and provider["apiKey"] == "tok123"
    assert provider["api"] == "openai-completions"
    assert spec.argv[spec.argv.index("--model") + 1] == f"clawgym/{provider['models'][0]['id']}"
    assert spec.env["OPENCLAW_NO_AUTO_UPDATE"] == "1"
    roots = [str(p) for p in openclaw.ro_paths()]
    assert str(prefix_for(PACKAGE)) in roots
    assert any(node.startswith(r + "/") for r in roots) or not node.startswith(str(prefix_for(NODE24)))


def test_api_choice_sets_dialect_and_base_url(builtin_suite):
    task = builtin_suite.get("csv_total")
    for api, dialect, url in [("anthropic-messages", "anthropic_messages", "http://127.0.0.1:18080/ep/tok123"),
                              ("openai-responses", "openai_responses", ENDPOINT.base_url)]:
        adapter = OpenClawAdapter(api=api)
        spec = adapter.launch(task, ENDPOINT, home="/root")
        config = json.loads(spec.files[spec.argv[spec.argv.index("--config") + 1]])
        provider = config["models"]["providers"]["clawgym"]
        assert (adapter.dialect, provider["api"], provider["baseUrl"]) == (dialect, api, url)
    with pytest.raises(HarnessError, match="unknown OpenClaw api"):
        OpenClawAdapter(api="openai-chat")


def test_envelope_parsing():
    ok = {"ok": True, "status": "ok", "final": "42", "payloads": [{"text": "42"}], "assistantTurns": 2}
    out = parse_envelope("warning: something\n" + json.dumps(ok, indent=2) + "\n")
    assert out.final_message == "42" and out.transcript[0] == {"role": "assistant", "content": "42"}
    failed = {"ok": False, "status": "error", "final": "", "error": {"message": "boom", "kind": "exception"}}
    assert parse_envelope(json.dumps(failed)).final_message is None
    assert parse_envelope(json.dumps({**ok, "status": "timeout"})).final_message is None
    assert parse_envelope("").final_message is None and parse_envelope("{not json").final_message is None


# -- real episodes -------------------------------------------------------------------------------------
def test_expert_solves_multi_step_tasks_over_chat_completions(openclaw, expert_runtime, builtin_suite, tokenizer):
    results = [expert_runtime.run(t, openclaw) for t in multi_step_tasks(builtin_suite, EXPERT_TASKS)]
    for res in results:
        check_expert_episode(res, tokenizer)
        first = res.calls[0]
        assert first.stream and first.dialect == "openai_chat"
        offered = {t["function"]["name"] for t in first.request["tools"]}
        assert {"exec", "read", "write"} <= offered
        assert "sessionId=" in json.dumps(first.request["messages"])  # OpenClaw's own prompt, unmodified
    assert {"exec", "read"} <= _tools_called(results[0].calls)
    assert {"exec", "write"} <= _tools_called(results[1].calls)


@pytest.mark.parametrize("api,dialect,route", [("anthropic-messages", "anthropic_messages", "/messages"),
                                               ("openai-responses", "openai_responses", "/responses")])
def test_expert_over_other_dialects(openclaw, expert_runtime, builtin_suite, tokenizer, api, dialect, route):
    adapter = OpenClawAdapter(api=api)
    res = expert_runtime.run(multi_step_tasks(builtin_suite, ["count_words_answer"])[0], adapter)
    check_expert_episode(res, tokenizer, route=route)
    assert {c.dialect for c in res.calls} == {dialect}


def test_gym_env_passes_check_env_and_returns_an_episode(openclaw, tmp_path):
    env = gym.make("ClawGym/OpenClaw-v0", policy="scripted:expert", out_dir=tmp_path,
                   task_ids=["count_words_answer"])
    try:
        check_env(env.unwrapped, skip_render_check=True)
        episodes = [json.loads(p.read_text()) for p in tmp_path.glob("*/episode.json")]
        assert len(episodes) >= 2 and all(e["harness"] == "openclaw" for e in episodes)  # check_env stepped
        obs, _ = env.reset(options={"task_id": "builtin/count_words_answer"})
        obs, reward, terminated, truncated, info = env.step(None)
        assert terminated and not truncated and reward == 1.0, info["episode"]["logs"]
        assert obs["status"] == "ok" and len(obs["calls"]) == info["episode"]["num_calls"] >= 3
        assert all(len(c["prompt_token_ids"]) and len(c["output_token_ids"]) for c in obs["calls"])
    finally:
        env.close()


def test_hanging_harness_times_out_with_logs_and_leaves_no_process(openclaw, builtin_suite, tmp_path):
    marker = uuid.uuid4().hex
    # OpenClaw backgrounds a command after 10 s and asks again, so every step is another long sleep
    script = hanging_script(tmp_path, marker, steps=30)
    task = marked_task(builtin_suite.get("csv_total"), marker, timeout_s=30)
    with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "eps") as rt:
        with Watch(marker) as watch:
            res = rt.run(task, Marked(openclaw, marker))
    rec = res.record
    assert watch.seen, "the harness's processes were visible to the survivor check while it ran"
    assert rec.status == "timeout", (rec.status, rec.error, rec.logs)
    assert "30 s" in rec.error and rec.reward < 1.0
    assert rec.logs["stdout"] + rec.logs["stderr"], "a timed-out episode keeps the harness's logs"
    assert_no_survivors(marker)


def test_wrong_token_is_an_infra_failure_with_logs(openclaw, expert_runtime, builtin_suite):
    marker = uuid.uuid4().hex
    task = marked_task(builtin_suite.get("csv_total"), marker)
    res = expert_runtime.run(task, Marked(openclaw, marker, wrong_token=True))
    rec = res.record
    # every request was refused before the model answered: not the agent's failure, never trained
    assert rec.status == "infra_error" and rec.failure_boundary == "harness", (rec.status, rec.logs)
    assert rec.num_calls == 0 and rec.final_message is None and rec.reward < 1.0
    assert "404" in rec.logs["stderr"], rec.logs
    assert json.loads(rec.logs["stdout"])["status"] == "error"
    assert_no_survivors(marker)
