"""Each real harness adapter's ``call_kinds``: on calls captured from the real harnesses (trimmed fixtures), on
hostile variations of them, and live (the real harness through the proxy, kinds set by ``run_episode``).

The fixtures under ``fixtures/call_kinds/`` are real captures trimmed to the marks the adapters read (headers,
system prompt, the shape of the last turn, tool names); token ids are dropped. They were captured with the
policies below: Claude Code delegating to its ``Agent`` tool (a subagent that delegates again), Claude Code with
auto-compact at 21 % of a 100 k window, OpenClaw overflowing the proxy's context (it compacts), Codex with
``model_auto_compact_token_limit`` = 9000, Qwen Code delegating to its ``agent`` tool, and Qwen Code with
``autoCompactThreshold`` 0.2 of a 60 k window; and OpenClaw retrying a timed-out request (every message kept, long
strings cut: see ``test_call_kinds_openclaw``). (The capture policies answered every call of a conversation the
same way, so some episodes repeat compaction cycles; only the first calls are kept.)
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from clawgym_env.capture.call_kinds import classify_calls
from clawgym_env.capture.records import CALL_KINDS, CallRecord
from clawgym_env.envs.runtime import Runtime
from clawgym_env.plugins import make_harness
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams
from clawgym_env.policy.chat_format import assistant_text
from clawgym_env.policy.scripted import plan_call, resolve_tools
from harness_adapters.claude_code.kinds import COMPACT_OPENING
from harness_adapters.openclaw.kinds import SUMMARY_OPENING
from harness_adapters.qwen_code.kinds import MAIN_OPENING

FIXTURES = Path(__file__).parent / "fixtures" / "call_kinds"
M, S, C = "main", "subagent", "compaction"
EXPECTED = {
    ("claude-code", "claude_code_subagent.json"): [M, M, S, S, S, S, S, S, M],
    ("claude-code", "claude_code_compaction.json"): [M, M, C, C, M, C, C, M, C, C, M],
    ("openclaw", "openclaw_compaction.json"): [M, M, M, C, M, M],
    ("openclaw", "openclaw_forced_retry.json"): [M] * 5,
    ("codex", "codex_compaction.json"): [M, M, C, M, M, C],
    ("qwen-code", "qwen_code_subagent.json"): [M, M] + [S] * 10 + [M],
    ("qwen-code", "qwen_code_compaction.json"): [M, M, C, M, M, C],
}


def load(name: str) -> list[CallRecord]:
    return [CallRecord.model_validate(c) for c in json.loads((FIXTURES / name).read_text())]


def kinds(adapter_name: str, calls: list[CallRecord]) -> list[str | None]:
    verdicts = make_harness(adapter_name).call_kinds(calls)
    assert len(verdicts) == len(calls)
    for v in verdicts:
        assert v is None or (v[0] in CALL_KINDS and isinstance(v[1], str) and v[1])
    return [v[0] if v else None for v in verdicts]


# -- captured episodes -------------------------------------------------------------------------------
@pytest.mark.parametrize(("harness", "fixture"), sorted(EXPECTED))
def test_kinds_of_captured_episodes(harness, fixture):
    calls = load(fixture)
    assert kinds(harness, calls) == EXPECTED[(harness, fixture)]
    labelled = classify_calls(calls, make_harness(harness))  # the adapter's verdicts win over the default
    assert [c.kind for c in labelled] == EXPECTED[(harness, fixture)]
    assert all(c.kind_reason.startswith(f"{harness}: ") for c in labelled)


def test_claude_code_marks_nested_subagents_by_their_own_header():
    calls = load("claude_code_subagent.json")
    verdicts = make_harness("claude-code").call_kinds(calls)
    nested = [v[1] for c, v in zip(calls, verdicts) if "x-claude-code-parent-agent-id" in c.headers]
    assert nested and all("nested under" in r for r in nested)


def test_mini_has_no_marks():
    calls = load("openclaw_compaction.json")
    assert make_harness("mini").call_kinds(calls) == [None] * len(calls)


# -- what a model can make a harness send is never read as a mark -------------------------------------
def test_claude_code_compaction_text_inside_a_tool_result_is_main():
    main = load("claude_code_compaction.json")[1]
    request = json.loads(json.dumps(main.request))
    request["messages"][-1]["content"] = [{"type": "tool_result", "tool_use_id": "t", "content": COMPACT_OPENING}]
    forged = main.model_copy(update={"request": request})
    assert kinds("claude-code", [forged]) == [M]
    # the task's own instruction (the first user turn, nothing answered yet) is never a compaction
    first = {**request, "messages": [{"role": "user", "content": [{"type": "text", "text": COMPACT_OPENING}]}]}
    assert kinds("claude-code", [main.model_copy(update={"request": first})]) == [M]


def test_claude_code_without_header_or_tools_is_left_to_the_default():
    main = load("claude_code_subagent.json")[0]
    bare = main.model_copy(update={"request": {**main.request, "tools": []}})
    assert kinds("claude-code", [bare]) == [None]


def test_openclaw_summary_text_later_in_the_conversation_is_not_compaction():
    main = load("openclaw_compaction.json")[0]
    request = json.loads(json.dumps(main.request))
    request["messages"].append({"role": "user", "content": SUMMARY_OPENING + " summarise this."})
    assert kinds("openclaw", [main.model_copy(update={"request": request})]) == [M]
    summary = load("openclaw_compaction.json")[3]
    with_tools = {**summary.request, "tools": main.request["tools"]}  # not the shape OpenClaw sends
    assert kinds("openclaw", [summary.model_copy(update={"request": with_tools})]) == [None]


@pytest.mark.parametrize("header", [None, "not json", "[1, 2]", '{"request_kind": "turn", "agent_name": "/root/w1"}',
                                    '{"request_kind": "review"}'])
def test_codex_unknown_or_missing_metadata_is_left_to_the_default(header):
    call = load("codex_compaction.json")[0]
    headers = {k: v for k, v in call.headers.items() if k != "x-codex-turn-metadata"}
    if header is not None:
        headers["x-codex-turn-metadata"] = header
    assert kinds("codex", [call.model_copy(update={"headers": headers})]) == [None]


def test_qwen_code_main_is_the_first_calls_prompt_not_its_opening_words():
    calls = load("qwen_code_subagent.json")
    request = json.loads(json.dumps(calls[2].request))
    request["messages"][0]["content"] = MAIN_OPENING + " (a custom subagent a model wrote)"
    forged = calls[2].model_copy(update={"request": request})
    assert kinds("qwen-code", [calls[0], forged]) == [M, S]
    assert kinds("qwen-code", calls[2:4]) == [None, None]  # no main call first: nothing to compare with


MALFORMED = [
    {},
    {"messages": "text", "system": 5, "tools": "x"},
    {"messages": [None, 3, {"role": "user", "content": [None, 7, {"type": "text"}]}], "system": [None, {"text": 3}]},
    {"messages": [{"role": "system", "content": [{"text": None}]}], "tools": [{}], "instructions": {"a": 1}},
    {"input": [{"role": "developer", "content": 5}], "messages": [{"role": "assistant"}, {"role": "user"}]},
]


@pytest.mark.parametrize("harness", ["claude-code", "openclaw", "codex", "qwen-code", "mini"])
def test_malformed_records_never_raise(harness):
    headers = [{}, {"x-claude-code-agent-id": ""}, {"x-codex-turn-metadata": "{" * 5000},
               {"x-codex-turn-metadata": '{"request_kind": ["compaction"], "compaction": 3}'},
               {"X-Claude-Code-Agent-Id": " "}]
    calls = [CallRecord(episode_id="e", call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                        stream=False, request=req, headers=hdr, prompt_token_ids=[], output_token_ids=[],
                        output_logprobs=[], finish_reason="stop")
             for i, (req, hdr) in enumerate(zip(MALFORMED, headers))]
    assert kinds(harness, calls) == [None] * len(calls)
    assert kinds(harness, []) == []


# -- live: the real harness through the proxy, kinds set at the end of the episode -----------------------
class CountingPolicy(PolicyBackend):
    """A scripted model for kind captures: ``first`` answers the episode's first call (e.g. a delegation), then
    a call that offers a shell runs ``command`` at its conversation's first turn (a delegated agent works), at
    most ``main_turns`` shell calls in all, and every other call answers in text (a summary request too)."""

    name = "counting"

    def __init__(self, tokenizer, first: tuple[str, dict] | None, command: str, main_turns: int = 1) -> None:
        self._tokenizer, self.first, self.command, self.main_turns = tokenizer, first, command, main_turns
        self._lock = threading.Lock()
        self.calls = 0
        self.shell_calls = 0

    @property
    def tokenizer(self):
        return self._tokenizer

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        with self._lock:
            n, self.calls = self.calls, self.calls + 1
            shell = resolve_tools(ctx.tools).get("shell")
            turn = sum(m.get("role") == "assistant" for m in ctx.messages)
            if n == 0 and self.first is not None:
                text = assistant_text("", tool_calls=[self.first])
            elif shell is not None and self.shell_calls < self.main_turns and (turn == 0 or self.first is None):
                self.shell_calls += 1
                call = plan_call({"tool": "bash", "command": self.command}, {"shell": shell}, "/")
                text = assistant_text("", tool_calls=[call] if call else None)
            else:
                text = assistant_text("Done: the work is finished.")
        ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")


def _live(adapter, policy, task, tmp_path):
    with Runtime(policy, out_dir=tmp_path / "eps") as rt:
        return rt.run(task, adapter)


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@needs_bwrap
@pytest.mark.slow
def test_live_claude_code_subagent_calls_are_subagent(builtin_suite, tokenizer, tmp_path):
    try:
        from helpers_claude_codex import installed
    except ImportError:  # tests run as a package
        from tests.helpers_claude_codex import installed
    adapter = installed(make_harness("claude-code"))
    delegate = ("Agent", {"description": "list files", "subagent_type": "general-purpose",
                          "prompt": "Run `ls` in the workspace and report what you see."})
    policy = CountingPolicy(tokenizer, delegate, "ls > listing.txt", main_turns=1)
    res = _live(adapter, policy, builtin_suite.tasks[0], tmp_path)
    assert res.record.status == "ok", (res.record.error, res.record.logs)
    by_header = ["subagent" if "x-claude-code-agent-id" in c.headers else "main" for c in res.calls]
    assert [c.kind for c in res.calls] == by_header, [(c.kind, c.kind_reason) for c in res.calls]
    assert by_header.count("subagent") >= 2 and by_header.count("main") >= 2
    assert all(c.kind_reason.startswith("claude-code: ") for c in res.calls)


@needs_bwrap
@pytest.mark.slow
def test_live_openclaw_compaction_call_is_compaction(builtin_suite, tokenizer, tmp_path):
    try:
        from helpers_harness import installed
    except ImportError:  # tests run as a package
        from tests.helpers_harness import installed
    adapter = installed("openclaw")
    # each tool result adds 6-12 k tokens: within five of them a prompt outgrows the proxy's context and
    # OpenClaw summarises
    flood = "python3 -c \"print('lorem ipsum dolor sit ' * 2000)\""
    policy = CountingPolicy(tokenizer, None, flood, main_turns=5)
    res = _live(adapter, policy, builtin_suite.tasks[0], tmp_path)
    kinds_seen = [c.kind for c in res.calls]
    assert kinds_seen.count("compaction") >= 1, [(c.kind, c.kind_reason, len(c.prompt_token_ids)) for c in res.calls]
    for c in res.calls:
        summary = not c.request.get("tools")
        assert c.kind == ("compaction" if summary else "main"), (c.call_index, c.kind, c.kind_reason)
        assert c.kind_reason.startswith("openclaw: ")


@needs_bwrap
@pytest.mark.slow
def test_live_codex_compaction_call_is_compaction(builtin_suite, tokenizer, tmp_path):
    try:
        from helpers_claude_codex import installed
    except ImportError:  # tests run as a package
        from tests.helpers_claude_codex import installed
    adapter = installed(make_harness("codex", extra_config={"model_auto_compact_token_limit": 9000}))
    flood = "python3 -c \"print('lorem ipsum dolor ' * 600)\""
    policy = CountingPolicy(tokenizer, None, flood, main_turns=2)
    res = _live(adapter, policy, builtin_suite.tasks[0], tmp_path)
    kinds_seen = [c.kind for c in res.calls]
    assert "compaction" in kinds_seen and "main" in kinds_seen, [(c.kind, c.kind_reason) for c in res.calls]
    for c in res.calls:
        assert (c.kind == "compaction") == ('"request_kind":"compaction"' in c.headers["x-codex-turn-metadata"])


@needs_bwrap
@pytest.mark.slow
def test_live_claude_code_compaction_call_is_compaction(builtin_suite, tokenizer, tmp_path):
    try:
        from helpers_claude_codex import installed
    except ImportError:  # tests run as a package
        from tests.helpers_claude_codex import installed
    window = {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "21"}
    adapter = installed(make_harness("claude-code", extra_env=window))
    # the prompt opens at ~20 k tokens; after two ~2.4 k tool results the usage passes 21 k and Claude Code compacts
    # before its next request (the policy answers that one, and all later ones, in text)
    policy = CountingPolicy(tokenizer, None, "python3 -c \"print('lorem ipsum dolor ' * 600)\"", main_turns=2)
    res = _live(adapter, policy, builtin_suite.tasks[0], tmp_path)
    assert [c.kind for c in res.calls].count("compaction") >= 1, [(c.kind, c.kind_reason) for c in res.calls]
    for c in res.calls:
        blocks = c.request["messages"][-1]["content"]
        tail = blocks[-1].get("text", "") if isinstance(blocks, list) and blocks else ""
        assert (c.kind == "compaction") == tail.startswith(COMPACT_OPENING), (c.call_index, c.kind)
        assert c.kind in ("main", "compaction") and c.kind_reason.startswith("claude-code: ")


@needs_bwrap
@pytest.mark.slow
def test_live_qwen_code_subagent_and_compaction(builtin_suite, tokenizer, tmp_path):
    try:
        from helpers_harness import installed
    except ImportError:  # tests run as a package
        from tests.helpers_harness import installed
    settings = {"context": {"autoCompactThreshold": 0.2}, "model": {"generationConfig": {"contextWindowSize": 60000}}}
    adapter = installed("qwen-code", extra_settings=settings)
    delegate = ("agent", {"description": "list files", "subagent_type": "general-purpose",
                          "prompt": "Run `ls` in the workspace and report what you see."})
    policy = CountingPolicy(tokenizer, delegate, "python3 -c \"print('lorem ipsum dolor ' * 600)\"", main_turns=2)
    res = _live(adapter, policy, builtin_suite.tasks[0], tmp_path)
    seen = [c.kind for c in res.calls]
    assert {"subagent", "main", "compaction"} <= set(seen), [(c.kind, c.kind_reason) for c in res.calls]
    assert all(c.kind_reason.startswith("qwen-code: ") for c in res.calls)
