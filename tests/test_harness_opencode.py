"""OpenCode, the real pinned executable, run headless (``opencode run --format json``) in the bubblewrap sandbox
against the real proxy, driven by the scripted expert through the real tokenizer: solved tasks, every call
token-exact, OpenCode's title call a side call and its agent's calls one extending main thread."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers_harness import (
    ENDPOINT,
    EXPERT_TASKS,
    check_main_thread_episode,
    check_wrong_token_episode,
    hanging_episode,
    installed,
    multi_step_tasks,
    tools_called,
)

from clawgym_env.envs.runtime import RolloutPool
from clawgym_env.errors import HarnessError
from harness_adapters.install import prefix_for
from harness_adapters.opencode import PACKAGE, OpenCodeAdapter
from harness_adapters.opencode.events import parse_events

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture(scope="module")
def opencode():
    return installed("opencode")


def check_opencode_episode(res, tokenizer, dialect: str = "openai_chat", *, title_call: bool = True) -> None:
    """A solved episode (:func:`check_main_thread_episode`), the title call (when OpenCode makes one) a side call."""
    check_main_thread_episode(res, tokenizer, harness="opencode", dialect=dialect, side_calls=1 if title_call else 0)


# -- launch and output, without running anything ---------------------------------------------------
def test_launch_spec_is_pinned_and_quiet(opencode, builtin_suite):
    task = builtin_suite.get("csv_total")
    spec = opencode.launch(task, ENDPOINT, home="/root")
    shell, flag, script, prompt, exe = spec.argv[:5]
    assert (shell, flag, script) == ("/bin/sh", "-c", 'exec "$@" < "$0"') and spec.files[prompt] == task.instruction
    assert exe.startswith(str(prefix_for(PACKAGE)) + "/") and opencode.package is PACKAGE
    assert spec.argv[5:8] == ["run", "--format", "json"] and "--auto" in spec.argv and "--title" not in spec.argv
    assert task.instruction not in spec.argv  # OpenCode would quote it: it goes through stdin
    assert spec.cwd == task.mount_dir == spec.env["PWD"]
    config = json.loads(spec.files[spec.env["OPENCODE_CONFIG"]])
    provider = config["provider"]["clawgym"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": ENDPOINT.base_url, "apiKey": "tok123"}
    assert config["model"] == spec.argv[spec.argv.index("--model") + 1] == "clawgym/clawgym-policy"
    assert config["autoupdate"] is False and config["share"] == "disabled"
    for switch in ("OPENCODE_DISABLE_AUTOUPDATE", "OPENCODE_DISABLE_MODELS_FETCH", "OPENCODE_DISABLE_PROJECT_CONFIG"):
        assert spec.env[switch] == "1"
    assert [str(p) for p in opencode.ro_paths()] == [str(prefix_for(PACKAGE))]  # native: no Node mounted


def test_options_pick_the_dialect_and_bad_ones_name_the_fix(builtin_suite):
    assert OpenCodeAdapter().dialect == "openai_chat"
    assert OpenCodeAdapter(provider_npm="@ai-sdk/openai").dialect == "openai_responses"
    assert OpenCodeAdapter(provider_npm="@ai-sdk/anthropic").dialect == "anthropic_messages"
    with pytest.raises(HarnessError, match="provider_npm .*@ai-sdk/openai-compatible"):
        OpenCodeAdapter(provider_npm="@ai-sdk/google")
    task = builtin_suite.get("csv_total")
    titled = OpenCodeAdapter(title="csv").launch(task, ENDPOINT, home="/h")
    assert titled.argv[titled.argv.index("--title") + 1] == "csv"


def test_event_parsing():
    def ev(kind, **part):
        return json.dumps({"type": kind, "sessionID": "s", "part": part})

    answered = [ev("step_start"), ev("tool_use", tool="bash", callID="c1", state={"status": "completed",
                                                                                 "input": {"command": "ls"},
                                                                                 "output": "a\n"}),
                ev("step_finish", reason="tool-calls"), ev("step_start"), ev("text", text="The answer is 4."),
                ev("step_finish", reason="stop")]
    out = parse_events("noise\n" + "\n".join(answered) + "\n")
    assert out.final_message == "The answer is 4."
    assert [e["type"] for e in out.transcript] == ["tool_use", "text"]
    assert out.transcript[0]["input"] == {"command": "ls"}
    # a step cut off by tool calls, a run that ended in an error, or no output at all: no answer
    assert parse_events("\n".join(answered[:3])).final_message is None
    failed = answered + [json.dumps({"type": "error", "error": {"name": "APIError", "data": {"message": "x"}}})]
    assert parse_events("\n".join(failed)).final_message is None
    assert parse_events("").final_message is None and parse_events("{not json").transcript == []


# -- real episodes -------------------------------------------------------------------------------------
def test_expert_solves_multi_step_tasks(opencode, expert_runtime, builtin_suite, tokenizer):
    tasks = multi_step_tasks(builtin_suite, EXPERT_TASKS)
    results = RolloutPool(expert_runtime, concurrency=2, progress=False).run(tasks, opencode)
    for res in results:
        check_opencode_episode(res, tokenizer)
        offered = {t["function"]["name"] for c in res.calls if c.kind == "main" for t in c.request["tools"]}
        assert {"bash", "read", "write"} <= offered
    called = [tools_called(r.calls) for r in results]
    assert {"bash", "read"} <= called[0] and "write" in called[1] | called[2]


@pytest.mark.slow
@pytest.mark.parametrize("provider_npm", ["@ai-sdk/openai", "@ai-sdk/anthropic"])
def test_expert_over_other_dialects(opencode, expert_runtime, builtin_suite, tokenizer, provider_npm):
    adapter = OpenCodeAdapter(provider_npm=provider_npm)
    res = expert_runtime.run(builtin_suite.get("backup_and_edit_config"), adapter)
    check_opencode_episode(res, tokenizer, adapter.dialect)


def test_leading_dash_instruction_reaches_the_model_and_title_removes_the_side_call(opencode, expert_runtime,
                                                                                   builtin_suite, tokenizer):
    task = builtin_suite.get("count_words_answer").model_copy(deep=True)
    task.instruction = "--help: " + task.instruction
    res = expert_runtime.run(task, OpenCodeAdapter(title="word count"))
    check_opencode_episode(res, tokenizer, title_call=False)
    texts = [m["content"] if isinstance(m["content"], str) else "".join(p.get("text", "") for p in m["content"])
             for m in res.calls[0].request["messages"] if m["role"] == "user"]
    assert texts == [task.instruction], texts  # verbatim: no quotes added, not read as a flag


@pytest.mark.slow
def test_hanging_harness_times_out_with_logs_and_leaves_no_process(opencode, builtin_suite, tmp_path):
    res, marker = hanging_episode(opencode, builtin_suite, tmp_path, steps=3, timeout_s=20)
    assert marker in res.record.logs["stdout"] + json.dumps([c.response_message for c in res.calls])


def test_wrong_token_is_an_infra_failure_with_logs(opencode, expert_runtime, builtin_suite):
    check_wrong_token_episode(opencode, expert_runtime, builtin_suite, evidence="404")
