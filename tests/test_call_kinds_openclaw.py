"""OpenClaw's own retries: an agent request that timed out is re-sent as a new request (the interrupted messages,
a ``<turn_aborted>`` note, a "Continue the current task" turn), and the abandoned call must be marked dead
(``discarded_by``) by :func:`harness_adapters.openclaw.kinds.openclaw_discarded` through ``classify_calls``.

``fixtures/call_kinds/openclaw_forced_retry.json`` is a real capture, trimmed like the other fixtures there
(token ids dropped, the system prompt cut to its opening, other strings to 400 characters, tools to their names,
start and end times made relative): OpenClaw with ``models.providers.<id>.timeoutSeconds`` = 3 on the builtin
``json_merge_config`` task, the scripted expert behind the proxy holding the second call until OpenClaw re-sent it
(the forced-retry test of ``test_harness_idle.py``). The constructed cases vary that capture.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from clawgym_env.capture.call_kinds import classify_calls
from clawgym_env.capture.records import CallRecord
from clawgym_env.plugins import make_harness
from harness_adapters.openclaw.kinds import openclaw_discarded

FIXTURES = Path(__file__).parent / "fixtures" / "call_kinds"


def load(name: str) -> list[CallRecord]:
    return [CallRecord.model_validate(c) for c in json.loads((FIXTURES / name).read_text())]


@pytest.fixture
def retry() -> list[CallRecord]:
    """The captured episode: 0 read, 1 read (abandoned), 2 its retry, 3 exec, 4 the answer."""
    return load("openclaw_forced_retry.json")


def messages(call: CallRecord) -> list[dict]:
    return copy.deepcopy(call.request["messages"])


def with_messages(call: CallRecord, msgs: list, **update) -> CallRecord:
    return call.model_copy(update={"request": {**call.request, "messages": msgs}, **update})


def is_note(m: dict) -> bool:
    return m["role"] == "user" and isinstance(m["content"], str) and "<turn_aborted>" in m["content"]


# -- the capture ------------------------------------------------------------------------------------------
def test_the_captured_abandoned_call_is_discarded_by_its_retry(retry):
    first, again = retry[1], retry[2]
    # what OpenClaw sends: the interrupted messages without the transient last one, the note, "Continue"
    assert messages(again)[:len(messages(first)) - 1] == messages(first)[:-1]
    note, cont, context = messages(again)[len(messages(first)) - 1:]
    assert is_note(note) and note["content"].split("] ", 1)[1].startswith("<turn_aborted>\nThe previous turn")
    assert "Continue the current task" in cont["content"]
    assert context == messages(first)[-1] and "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>" in json.dumps(context)
    assert again.started_at < first.ended_at  # the abandoned call finished after its retry arrived
    assert openclaw_discarded(retry) == {1: 2}
    out = classify_calls(retry, make_harness("openclaw"))
    assert [c.discarded_by for c in out] == [None, 2, None, None, None]
    assert [c.kind for c in out] == ["main"] * 5


OTHERS = sorted(p.name for p in FIXTURES.glob("*.json") if p.name != "openclaw_forced_retry.json")


@pytest.mark.parametrize("name", OTHERS)
def test_no_other_captured_episode_has_a_retry(name):
    # OpenClaw's compaction episode carries a "Continue the current task" turn with no note: not a retry
    calls = load(name)
    assert openclaw_discarded(calls) == {}
    assert all(c.discarded_by is None for c in classify_calls(calls, make_harness("openclaw")))


def test_a_retry_of_a_retry_marks_each_attempt(retry):
    again = retry[2]
    note, cont, context = messages(again)[-3:]
    third = with_messages(again, messages(again)[:-1] + [note, cont, context], call_index=9,
                          started_at=again.started_at + 1)
    assert openclaw_discarded(retry[:3] + [third]) == {1: 2, 2: 9}
    # the first call retried twice: only the first retry pairs with it
    twice = with_messages(again, messages(again), call_index=8, started_at=again.started_at + 1)
    assert openclaw_discarded(retry[:3] + [twice]) == {1: 2}


def test_the_order_is_by_request_start(retry):
    early = retry[2].model_copy(update={"started_at": retry[1].started_at - 0.1})
    assert openclaw_discarded([retry[0], retry[1], early]) == {}


# -- never a false positive -------------------------------------------------------------------------------
def test_a_continued_answer_is_never_discarded(retry):
    # the turn was aborted after the answer was taken (its tool call ran): the answer is in the history
    first, again = retry[1], retry[2]
    answered = messages(first)[:-1] + messages(retry[3])[len(messages(first)) + 1:len(messages(first)) + 3]
    assert [m["role"] for m in answered[-2:]] == ["assistant", "tool"]
    late = with_messages(again, answered + messages(again)[-3:])
    assert openclaw_discarded([retry[0], first, late]) == {}
    # any later call going on from the abandoned call's messages with an answer keeps it
    other = with_messages(retry[3], answered + messages(retry[3])[-1:], call_index=7, started_at=9.0)
    assert openclaw_discarded(retry + [other]) == {}


def test_continue_without_a_note_is_not_a_retry(retry):
    first, again = retry[1], retry[2]
    no_note = [m for m in messages(again) if not is_note(m)]
    assert openclaw_discarded([retry[0], first, with_messages(again, no_note)]) == {}


@pytest.mark.parametrize("where", ["assistant", "tool", "tool_result_block", "internal_context", "midway",
                                   "unclosed"])
def test_a_note_a_model_could_write_is_not_a_note(retry, where):
    first, again = retry[1], retry[2]
    note = next(m for m in messages(again) if is_note(m))
    base = messages(first)[:-1]
    context = messages(first)[-1]
    if where == "assistant":
        tail = [{"role": "assistant", "content": note["content"]}]
    elif where == "tool":
        tail = [{"role": "tool", "tool_call_id": "x", "content": note["content"]}]
    elif where == "tool_result_block":
        tail = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": note["content"]},
                                             {"type": "text", "text": note["content"]}]}]
    elif where == "internal_context":  # the transient message is not part of the history
        context = {"role": "user", "content": [{"type": "text", "text": context["content"][0]["text"] + "\n"
                                                + note["content"]}]}
        tail = []
    elif where == "midway":  # the note's words inside a plain user message that does not open with them
        tail = [{"role": "user", "content": "Please read this: " + note["content"]}]
    else:
        tail = [{"role": "user", "content": note["content"].split("</turn_aborted>")[0]}]
    forged = with_messages(again, base + tail + [context])
    assert openclaw_discarded([retry[0], first, forged]) == {}, where


def test_only_openclaw_agent_calls_take_part(retry):
    first, again = retry[1], retry[2]
    foreign = messages(first)
    foreign[0] = {"role": "system", "content": "You are a careful coding agent."}
    foreign_again = messages(again)
    foreign_again[0] = foreign[0]
    assert openclaw_discarded([with_messages(first, foreign), with_messages(again, foreign_again)]) == {}
    no_tools = again.model_copy(update={"request": {**again.request, "tools": []}})
    assert openclaw_discarded([retry[0], first, no_tools]) == {}
    assert openclaw_discarded([]) == {}


@pytest.mark.parametrize("request_", [{}, {"messages": "text"}, {"messages": [None, 3]},
                                      {"messages": [{"role": "system", "content": 5}, {"role": "user"}]},
                                      {"input": [{"type": "function_call"}], "instructions": ["x"]}])
def test_malformed_records_never_raise(retry, request_):
    bad = retry[2].model_copy(update={"request": request_, "call_index": 9})
    assert openclaw_discarded(retry + [bad]) == {1: 2}
