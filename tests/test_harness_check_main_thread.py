"""`harness check` finds the main thread as the call tree labels it: the adapter's own call kinds first, else the
structural default (the conversation with the most calls), never simply call 0."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from clawgym_env.capture.call_kinds import classify_calls
from clawgym_env.capture.records import CallKind, CallRecord, EpisodeRecord
from clawgym_env.policy.chat_format import assistant_text, parse_assistant, render_prompt_ids
from harness_adapters.check import analyze


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"arg": {"type": "string"}}}}}


AGENT_TOOLS = [_tool(n) for n in ("bash", "read", "write", "edit")]
AGENT_SYSTEM = {"role": "system", "content": "You are a coding agent working in a repository. " * 20}
TASK = {"role": "user", "content": "Sum the totals column of data.csv and write it to answer.txt."}


def _call(tokenizer, i: int, messages: list[dict], tools: list[dict], text: str, *, prompt: list[int] | None = None,
          started: float | None = None) -> CallRecord:
    """One recorded chat call; ``prompt`` overrides the rendered prompt ids (to extend a previous call exactly)."""
    body = {"model": "m", "messages": messages, "stream": False}
    if tools:
        body["tools"] = tools
    out = tokenizer.encode(text)
    msg = parse_assistant(text).to_openai_message()
    for k, tc in enumerate(msg.get("tool_calls") or []):
        tc["id"] = f"call_{i}_{k}"
    return CallRecord(episode_id="e", call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                      stream=False, request=body,
                      prompt_token_ids=prompt if prompt is not None else render_prompt_ids(tokenizer, messages, tools),
                      output_token_ids=out, output_logprobs=[0.0] * len(out), finish_reason="stop",
                      response_message=msg, started_at=started if started is not None else 100.0 + i)


def _thread(tokenizer, first_index: int, system: dict, tools: list[dict], commands: Sequence[str],
            final: str) -> list[CallRecord]:
    """A conversation whose every call extends the previous one's prompt + output, by messages and by token ids."""
    messages = [system, TASK]
    calls: list[CallRecord] = []
    prompt: list[int] | None = None
    for step, command in enumerate([*commands, None]):
        i = first_index + step
        text = assistant_text(final) if command is None else assistant_text("", tool_calls=[("bash", {"arg": command})])
        call = _call(tokenizer, i, list(messages), tools, text, prompt=prompt)
        calls.append(call)
        result = {"role": "tool", "tool_call_id": f"call_{i}_0", "content": f"ran {command}"}
        messages += [call.response_message, result]
        # the next prompt: exactly this call's prompt + output, then the tool result turn and the assistant opener
        turn = (f"\n<|im_start|>user\n<tool_response>\nran {command}\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n")
        prompt = list(call.prompt_token_ids) + list(call.output_token_ids) + tokenizer.encode(turn)
    return calls


def _title(tokenizer, i: int) -> CallRecord:
    """A helper call with its own system prompt and no tools: what OpenCode sends first to title a session."""
    msgs = [{"role": "system", "content": "Generate a short title for this conversation."}, TASK]
    return _call(tokenizer, i, msgs, [], assistant_text("Summing a CSV column"))


def _record() -> EpisodeRecord:
    return EpisodeRecord(episode_id="e", task_id="t", harness="h", policy="p", status="ok", reward=1.0, wall_s=3.0,
                         resources={"harness_started_at": 99.0})


def _tree_main(calls: list[CallRecord], adapter=None) -> list[int]:
    return [c.call_index for c in classify_calls(calls, adapter) if c.kind == "main" and c.discarded_by is None]


class _Adapter:
    """Marks calls by system prompt, as a real adapter reads its harness's own prompts."""

    name = "marker"

    def __init__(self, kinds: dict[str, CallKind]) -> None:
        self.kinds = kinds

    def call_kinds(self, calls: Sequence[CallRecord]) -> list[tuple[CallKind, str] | None]:
        out: list[tuple[CallKind, str] | None] = []
        for c in calls:
            system = str(c.request["messages"][0]["content"])
            kind = next((k for prefix, k in self.kinds.items() if system.startswith(prefix)), None)
            out.append((kind, f"system prompt starts {system[:12]!r}") if kind else None)
        return out


class _Broken:
    name = "broken"

    def call_kinds(self, calls: Sequence[CallRecord]) -> list[tuple[CallKind, str] | None]:
        raise RuntimeError("cannot read the prompts")


@pytest.fixture(scope="module")
def titled(tokenizer) -> list[CallRecord]:
    """Call 0 a title call with no tools, then a three-call agent thread with four tools."""
    return [_title(tokenizer, 0), *_thread(tokenizer, 1, AGENT_SYSTEM, AGENT_TOOLS, ["ls", "cat data.csv"], "Done.")]


def test_a_side_call_first_is_not_the_main_thread(titled):
    report = analyze("h", _record(), titled)
    assert report.main_calls == [1, 2, 3] == _tree_main(titled)
    assert report.tools_offered == ["bash", "read", "write", "edit"]
    assert report.num_calls == 4 and report.side_calls == 1
    assert report.call_kinds == {"main": 3, "side": 1}
    assert report.extends_by_tokens == [True, True] and report.extends_by_messages == [True, True]
    assert report.first_prompt_tokens == len(titled[1].prompt_token_ids)
    assert report.startup_s == pytest.approx(1.0)  # to the first call of any kind
    assert "structural" in report.main_thread_by
    text = report.render()
    assert re.search(r"^tools offered +4: bash, read, write, edit$", text, re.M)
    assert re.search(r"^main thread \(call indices\) +1, 2, 3 - structural", text, re.M)


def test_the_adapters_kinds_come_first(tokenizer):
    """A subagent thread longer than the agent's own: structurally it wins; the adapter's kinds say otherwise."""
    sub_system = {"role": "system", "content": "You are an explore subagent. Search the repository. " * 20}
    main = _thread(tokenizer, 0, AGENT_SYSTEM, AGENT_TOOLS, ["task explore"], "Done.")
    sub = _thread(tokenizer, 2, sub_system, AGENT_TOOLS[:2], ["grep a", "grep b", "grep c"], "Found it.")
    calls = [*main, *sub]
    plain = analyze("h", _record(), calls)
    assert plain.main_calls == [2, 3, 4, 5] == _tree_main(calls)  # the tree's own structural verdict
    assert plain.tools_offered == ["bash", "read"]
    assert plain.call_kinds == {"main": 4, "subagent": 2}

    adapter = _Adapter({"You are an explore": "subagent", "You are a coding": "main"})
    report = analyze("h", _record(), calls, adapter)
    assert report.main_calls == [0, 1] == _tree_main(calls, adapter)
    assert report.tools_offered == ["bash", "read", "write", "edit"]
    assert report.side_calls == 4 and report.call_kinds == {"main": 2, "subagent": 4}
    assert report.extends_by_tokens == [True] and report.extends_by_messages == [True]
    assert report.main_thread_by == "marker: system prompt starts 'You are a co'"


def test_adapter_marks_the_title_call(titled):
    adapter = _Adapter({"Generate a short title": "side"})
    report = analyze("h", _record(), titled, adapter)
    assert report.main_calls == [1, 2, 3] and report.side_calls == 1
    assert report.call_kinds == {"main": 3, "side": 1}


def test_a_failing_adapter_falls_back_to_the_structural_default(titled):
    report = analyze("h", _record(), titled, _Broken())
    assert report.main_calls == [1, 2, 3] and len(report.tools_offered) == 4
    assert "broken.call_kinds raised RuntimeError" in report.main_thread_by


def test_a_dead_retry_is_not_part_of_the_main_thread(tokenizer, titled):
    """The harness timed out on call 2 and re-sent its prompt (call 4); nothing continued from call 2's answer."""
    retry_text = assistant_text("", tool_calls=[("bash", {"arg": "head data.csv"})])
    dead = titled[2].model_copy(update={"output_token_ids": tokenizer.encode(retry_text)})
    retry = _call(tokenizer, 4, titled[2].request["messages"], AGENT_TOOLS, assistant_text("Done."),
                  prompt=list(titled[2].prompt_token_ids), started=120.0)
    calls = [titled[0], titled[1], dead, retry]
    report = analyze("h", _record(), calls)
    assert report.discarded_calls == 1
    assert report.main_calls == [1, 4] == _tree_main(calls)
    assert report.extends_by_tokens == [True]


def test_no_main_call_is_a_note(titled):
    report = analyze("h", _record(), titled, _Adapter({"": "side"}))
    assert report.main_calls == [] and report.tools_offered == [] and report.side_calls == 4
    assert any("no call is the main thread" in n for n in report.notes)
