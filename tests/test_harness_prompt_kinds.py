"""The shared pieces the JSON-lines and prompt-marked adapters read with: :mod:`harness_adapters.jsonl_events` and
:mod:`harness_adapters.call_kinds_by_prompt`, on hand-written requests in all three dialects."""

from __future__ import annotations

from clawgym_env.capture.records import CallRecord
from clawgym_env.jsontypes import JSONObject
from harness_adapters.call_kinds_by_prompt import PromptMarks, has_tools, kinds_by_system_prompt, system_prompt
from harness_adapters.jsonl_events import json_objects, typed_events
from harness_adapters.opencode.kinds import TITLE_OPENING, opencode_kinds
from harness_adapters.pi.kinds import COMPACT_OPENING, MAIN_OPENING, pi_kinds

TOOLS = [{"type": "function", "function": {"name": "bash"}}]


def chat(system: str | None, *, tools: bool = True) -> CallRecord:
    messages: list[JSONObject] = [{"role": "user", "content": "do it"}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": [{"type": "text", "text": system}]})
    request: JSONObject = {"messages": messages, **({"tools": TOOLS} if tools else {})}
    return CallRecord.model_construct(request=request, headers={})


def test_json_lines_keep_objects_in_order_and_pass_over_the_rest():
    out = '  {"type": "a", "n": 1}\nwarning: x\n{"cut off\n[1, 2]\n{"n": 2}\n{"type": 3}\n\n{"type": "b"}'
    assert list(json_objects(out)) == [{"type": "a", "n": 1}, {"n": 2}, {"type": 3}, {"type": "b"}]
    assert typed_events(out) == [{"type": "a", "n": 1}, {"type": "b"}]
    assert typed_events("") == [] and list(json_objects(None)) == []


def test_system_prompt_in_every_dialect():
    def call(request: JSONObject) -> CallRecord:
        return CallRecord.model_construct(request=request, headers={})

    assert system_prompt(call({"system": [{"type": "text", "text": "A"}, {"text": "B"}], "messages": []})) == "AB"
    assert system_prompt(call({"instructions": "R", "input": []})) == "R"
    assert system_prompt(call({"input": [{"role": "developer", "content": "D"}]})) == "D"
    assert system_prompt(call({"messages": [{"role": "user", "content": "U"}]})) is None
    assert system_prompt(call({"messages": "x"})) is None
    assert has_tools(call({"tools": TOOLS})) and not has_tools(call({"tools": []})) and not has_tools(call({}))


def test_main_is_the_first_tool_offering_prompt_exactly_and_subagents_follow_it():
    marks = PromptMarks(main_evidence="m", toolless={"Title:": ("side", "t")}, subagent_evidence="s")
    calls = [chat("Title: name it", tools=False), chat("Agent prompt"), chat("Sub prompt"), chat("Agent prompt"),
             chat("Title: but with tools"), chat("Agent prompt", tools=False), chat(None)]
    assert kinds_by_system_prompt(calls, marks) == [("side", "t"), ("main", "m"), ("subagent", "s"), ("main", "m"),
                                                    ("subagent", "s"), None, None]
    # before any main call, another prompt is no subagent; without subagent evidence it never is one
    assert kinds_by_system_prompt([chat("Sub prompt")], marks) == [("main", "m")]
    no_subagents = PromptMarks(main_evidence="m", main_opening="Agent")
    assert kinds_by_system_prompt([chat("Sub prompt"), chat("Agent x"), chat("Agent y")], no_subagents) == \
        [None, ("main", "m"), None]  # a prompt opening like main's but not the same text is not main
    assert kinds_by_system_prompt([CallRecord.model_construct(request=None, headers={})], marks) == [None]


def test_opencode_and_pi_marks():
    assert [v and v[0] for v in opencode_kinds([chat(TITLE_OPENING + " x", tools=False), chat("You are opencode"),
                                                chat("explore agent")])] == ["side", "main", "subagent"]
    assert [v and v[0] for v in pi_kinds([chat(MAIN_OPENING + "."), chat(COMPACT_OPENING, tools=False),
                                          chat("explore agent"), chat(MAIN_OPENING + ".")])] == \
        ["main", "compaction", None, "main"]
