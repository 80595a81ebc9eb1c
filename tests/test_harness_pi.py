"""pi, the real pinned CLI, run headless (``-p --mode json``) in the bubblewrap sandbox against the real proxy,
driven by the scripted expert through the real tokenizer: solved tasks, every call token-exact, every call
the main agent's (pi makes no side calls), one extending main thread."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from helpers_harness import (
    ENDPOINT,
    EXPERT_TASKS,
    check_main_thread_episode,
    check_wrong_token_episode,
    installed,
    multi_step_tasks,
    tools_called,
)

from clawgym_env.envs.runtime import RolloutPool
from clawgym_env.errors import HarnessError
from harness_adapters.install import prefix_for
from harness_adapters.pi import PACKAGE, PiAdapter
from harness_adapters.pi.events import parse_events

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture(scope="module")
def pi():
    return installed("pi")


def check_pi_episode(res, tokenizer, dialect: str = "openai_chat") -> None:
    """A solved episode (:func:`check_main_thread_episode`) in which every call is the main agent's."""
    check_main_thread_episode(res, tokenizer, harness="pi", dialect=dialect)


# -- launch and output, without running anything ---------------------------------------------------
def test_launch_spec_is_pinned_and_offline(pi, builtin_suite):
    task = builtin_suite.get("csv_total")
    spec = pi.launch(task, ENDPOINT, home="/root")
    node, entry = spec.argv[0], spec.argv[1]
    assert node.startswith("/") and entry.startswith(str(prefix_for(PACKAGE)) + "/") and pi.package is PACKAGE
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    assert int(out.strip().lstrip("v").split(".")[0]) >= (PACKAGE.min_node or 0)
    assert spec.argv[-1] == task.instruction and spec.cwd == task.mount_dir
    assert {"-p", "--no-session", "--offline"} <= set(spec.argv)
    assert spec.argv[spec.argv.index("--mode") + 1] == "json"
    assert spec.argv[spec.argv.index("--provider") + 1] == "clawgym"
    assert spec.env["PI_OFFLINE"] == "1" and spec.env["PI_SKIP_VERSION_CHECK"] == "1"
    models = json.loads(spec.files[spec.env["PI_CODING_AGENT_DIR"] + "/models.json"])["providers"]["clawgym"]
    assert (models["baseUrl"], models["apiKey"], models["api"]) == (ENDPOINT.base_url, "tok123", "openai-completions")
    assert [m["id"] for m in models["models"]] == [ENDPOINT.model]
    settings = json.loads(spec.files[spec.env["PI_CODING_AGENT_DIR"] + "/settings.json"])
    assert settings["enableInstallTelemetry"] is False


def test_api_option_picks_the_dialect_and_instructions_are_never_flags(builtin_suite):
    assert PiAdapter(api="openai-responses").dialect == "openai_responses"
    anthropic = PiAdapter(api="anthropic-messages")
    task = builtin_suite.get("csv_total").model_copy(deep=True)
    spec = anthropic.launch(task, ENDPOINT, home="/h")
    provider = json.loads(spec.files["/h/.pi/agent/models.json"])["providers"]["clawgym"]
    assert anthropic.dialect == "anthropic_messages" and provider["baseUrl"] == ENDPOINT.root_url
    with pytest.raises(HarnessError, match="api .*openai-completions"):
        PiAdapter(api="google-vertex")
    for opening in ("--version: ", "@essay.txt "):  # pi would read these as a flag and a file
        task.instruction = opening + "count the words"
        spec = PiAdapter().launch(task, ENDPOINT, home="/h")
        assert spec.argv[:3] == ["/bin/sh", "-c", 'exec "$@" < "$0"'] and task.instruction not in spec.argv
        assert spec.files[spec.argv[3]] == task.instruction


def test_event_parsing():
    def assistant(text, stop):
        return {"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": stop}

    user = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    tool = {"role": "assistant", "content": [{"type": "toolCall", "id": "c1", "name": "bash"}], "stopReason": "toolUse"}
    lines = [{"type": "session", "version": 3}, {"type": "message_end", "message": user},
             {"type": "message_end", "message": tool}, {"type": "compaction_start", "reason": "threshold"},
             {"type": "message_end", "message": assistant("The answer is 4.", "stop")},
             {"type": "agent_end", "messages": [user, tool, assistant("The answer is 4.", "stop")]}]
    out = parse_events('{"cut off mid-line\n' + "\n".join(json.dumps(x) for x in lines) + "\n")
    assert out.final_message == "The answer is 4."
    assert [e["role"] for e in out.transcript] == ["user", "assistant", "assistant", "harness"]
    assert out.transcript[-1]["type"] == "pi_compaction_start"
    # no agent_end (a tail cut or a killed run): the finished messages still give the answer
    assert parse_events("\n".join(json.dumps(x) for x in lines[:5])).final_message == "The answer is 4."
    for stop in ("error", "aborted", "length"):
        failed = {"type": "agent_end", "messages": [user, assistant("partial", stop)]}
        assert parse_events(json.dumps(failed)).final_message is None
    assert parse_events("").final_message is None


# -- real episodes -------------------------------------------------------------------------------------
def test_expert_solves_multi_step_tasks(pi, expert_runtime, builtin_suite, tokenizer):
    tasks = multi_step_tasks(builtin_suite, EXPERT_TASKS)
    results = RolloutPool(expert_runtime, concurrency=2, progress=False).run(tasks, pi)
    for res in results:
        check_pi_episode(res, tokenizer)
        assert {"bash", "read", "write", "edit"} <= {t["function"]["name"] for t in res.calls[0].request["tools"]}
    called = [tools_called(r.calls) for r in results]
    assert {"bash", "read"} <= called[0] and "write" in called[1] | called[2]


@pytest.mark.slow
@pytest.mark.parametrize("api", ["openai-responses", "anthropic-messages"])
def test_expert_over_other_dialects(pi, expert_runtime, builtin_suite, tokenizer, api):
    adapter = PiAdapter(api=api)
    res = expert_runtime.run(builtin_suite.get("backup_and_edit_config"), adapter)
    check_pi_episode(res, tokenizer, adapter.dialect)


def test_leading_dash_instruction_reaches_the_model_verbatim(pi, expert_runtime, builtin_suite, tokenizer):
    task = builtin_suite.get("count_words_answer").model_copy(deep=True)
    task.instruction = "--help: " + task.instruction
    res = expert_runtime.run(task, pi)
    check_pi_episode(res, tokenizer)
    texts = ["".join(p.get("text", "") for p in m["content"]) if isinstance(m["content"], list) else m["content"]
             for m in res.calls[0].request["messages"] if m["role"] == "user"]
    assert texts == [task.instruction], texts


def test_wrong_token_is_an_infra_failure_with_logs(pi, expert_runtime, builtin_suite):
    check_wrong_token_episode(pi, expert_runtime, builtin_suite, evidence="404")
