"""Call kinds and dead retries on episodes rendered with the real Qwen3 template, and on a real mini episode.

The constructed episode: a main agent's tool loop; a one-call helper with its own system prompt (a title
request); a two-call delegated agent with another system prompt; a main call that timed out on the client and
was sent again (same prompt, a different answer the harness continued from).
"""

from __future__ import annotations

import json

import pytest

from clawgym_env.capture.call_kinds import (
    classify_calls,
    common_prefix,
    conversations,
    find_discarded,
    structural_kinds,
)
from clawgym_env.capture.records import read_calls
from clawgym_env.capture.tree import CallTree
from clawgym_env.capture.tree_show import kind_counts, node_kind, render_html, render_text
from clawgym_env.envs.runtime import Runtime
from clawgym_env.harness import HarnessAdapter
from clawgym_env.plugins import make_harness
from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids
from tests.test_call_tree import TOOLS, call, enc

SYSTEM = "You are a careful coding agent. Use the bash tool, then answer briefly."
TASK = "Count the lines of every .txt file in the workspace and write the total to total.txt."


def _msgs(system, user):
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@pytest.fixture(scope="module")
def mixed(tokenizer):
    """(calls, expected kinds, expected discarded) of one constructed episode, in call order."""
    tok = tokenizer
    out, kinds = [], []
    msgs = _msgs(SYSTEM, TASK)

    def add(prompt, text, kind, seed):
        out.append(call("ep", len(out), prompt, enc(tok, text), seed))
        kinds.append(kind)

    p0 = render_prompt_ids(tok, msgs, TOOLS)
    add(p0, assistant_text(tool_calls=[("bash", {"command": "wc -l *.txt"})]), "main", 1)
    title = render_prompt_ids(tok, _msgs("Write a five-word title for this request. Reply with the title only.",
                                         TASK), [])
    add(title, assistant_text("Counting lines in text files"), "side", 2)
    msgs += [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "function": {"name": "bash", "arguments": json.dumps({"command": "wc -l *.txt"})}}]},
             {"role": "tool", "tool_call_id": "c0", "content": "3 a.txt\n4 b.txt\n7 total"}]
    p1 = render_prompt_ids(tok, msgs, TOOLS)
    add(p1, assistant_text(tool_calls=[("bash", {"command": "echo 7 > totl.txt"})]), "main", 3)  # discarded
    sub = _msgs("You are a file-search subagent. Report paths only.", "Find every .txt file under the workspace.")
    add(render_prompt_ids(tok, sub, TOOLS), assistant_text(tool_calls=[("bash", {"command": "ls *.txt"})]),
        "subagent", 4)
    sub += [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "s0", "function": {"name": "bash", "arguments": json.dumps({"command": "ls *.txt"})}}]},
            {"role": "tool", "tool_call_id": "s0", "content": "a.txt\nb.txt"}]
    add(render_prompt_ids(tok, sub, TOOLS), assistant_text("a.txt, b.txt"), "subagent", 5)
    add(p1, assistant_text(tool_calls=[("bash", {"command": "echo 7 > total.txt"})]), "main", 6)  # the retry
    msgs += [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "function": {"name": "bash", "arguments": json.dumps({"command": "echo 7 > total.txt"})}}]},
             {"role": "tool", "tool_call_id": "c1", "content": ""}]
    add(render_prompt_ids(tok, msgs, TOOLS), assistant_text("The total is 7."), "main", 7)
    return out, kinds, {2: 5}


def test_common_prefix_matches_a_plain_scan():
    for a, b in [([], [1]), ([1, 2, 3], [1, 2, 3]), ([1, 2, 3], [1, 2, 4, 5]), (list(range(1000)),
                 list(range(700)) + [0]), ([5], [6])]:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b) == n


def test_structural_default_on_a_rendered_episode(mixed):
    calls, kinds, _ = mixed
    assert conversations(calls) == [0, 1, 0, 2, 2, 0, 0]
    got = structural_kinds(calls)
    assert [k for k, _ in got] == kinds
    assert all(reason.startswith("structural:") for _, reason in got)


def test_a_resent_prompt_marks_the_earlier_call_discarded(mixed):
    calls, _, discarded = mixed
    assert find_discarded(calls) == discarded
    three = [calls[0], calls[2], calls[2].model_copy(update={"call_index": 7}),
             calls[2].model_copy(update={"call_index": 9})]
    assert find_discarded(three) == {2: 7, 7: 9}, "each attempt is discarded by the next one"
    empty = [calls[0].model_copy(update={"prompt_token_ids": [], "call_index": i}) for i in range(2)]
    assert find_discarded(empty) == {}
    # identical prompts whose answers were both continued (nested subagents) are not retries
    twin = calls[0].model_copy(update={"call_index": 1, "output_token_ids": calls[0].output_token_ids[:-1] + [13]})
    both = [calls[0], twin, calls[2].model_copy(update={"call_index": 2})]
    assert find_discarded(both) == {}, "calls[2] continues from calls[0]'s answer"
    same = [calls[0], calls[0].model_copy(update={"call_index": 1}), calls[2].model_copy(update={"call_index": 2})]
    assert find_discarded(same) == {0: 1}, "an identical answer re-sent is a copy: the earlier one is discarded"
    # an abandoned attempt that finishes after its retry: order by arrival, not by call_index
    late = calls[2].model_copy(update={"call_index": 6, "started_at": 1.0})
    retry = calls[5].model_copy(update={"call_index": 5, "started_at": 2.0})
    assert find_discarded([calls[0], retry, late, calls[6].model_copy(update={"started_at": 3.0})]) == {6: 5}


def test_classify_keeps_tokens_and_labels_copies(mixed):
    calls, kinds, discarded = mixed
    before = [c.model_dump() for c in calls]
    out = classify_calls(calls)
    assert [c.model_dump() for c in calls] == before, "the records handed in are not modified"
    assert [c.kind for c in out] == kinds
    assert {c.call_index: c.discarded_by for c in out if c.discarded_by is not None} == discarded
    for a, b in zip(calls, out):
        assert (a.prompt_token_ids, a.output_token_ids, a.output_logprobs) == \
            (b.prompt_token_ids, b.output_token_ids, b.output_logprobs)


class _Marks(HarnessAdapter):
    name = "marks"

    def __init__(self, answer):
        self.answer = answer

    def launch(self, task, endpoint, *, home):  # pragma: no cover - never launched here
        raise NotImplementedError

    def read_output(self, stdout, stderr):  # pragma: no cover
        raise NotImplementedError

    def call_kinds(self, calls):
        return self.answer(calls)


class _Retries(_Marks):
    """An adapter that pairs retries of its own (``discarded_calls``) and marks no kinds."""

    def __init__(self, pairs):
        super().__init__(lambda cs: [None] * len(cs))
        self.pairs = pairs

    def discarded_calls(self, calls):
        return self.pairs(calls)


def test_an_adapter_verdict_wins_and_a_broken_adapter_is_ignored(mixed):
    calls, kinds, _ = mixed
    verdicts = [None] * len(calls)
    verdicts[-1] = ("compaction", "the request asks for a summary")
    out = classify_calls(calls, _Marks(lambda cs: verdicts))
    assert [c.kind for c in out] == kinds[:-1] + ["compaction"]
    assert out[-1].kind_reason == "marks: the request asks for a summary"
    assert out[0].kind_reason.startswith("structural:")

    def boom(cs):
        raise KeyError("system")

    for broken, why in [(boom, "raised KeyError"), (lambda cs: [None], "answered for 1 of 7"),
                        (lambda cs: [("bogus", "x")] * len(cs), "not (kind, reason)")]:
        out = classify_calls(calls, _Marks(broken))
        assert [c.kind for c in out] == kinds
        assert all(why in c.kind_reason for c in out), out[0].kind_reason


def test_tree_meta_and_show_carry_kinds(mixed, tmp_path):
    calls, _, _ = mixed
    tree = CallTree.from_calls(classify_calls(calls))
    tree.validate()
    assert tree.meta.call_kinds == ["main", "side", "main", "subagent", "subagent", "main", "main"]
    assert tree.meta.discarded_calls == [2]
    assert kind_counts(tree) == "main 3, side 1, subagent 2, discarded 1"
    leaf_kinds = {node_kind(tree, tree.nodes[tree.call_leaf[c]]) for c in range(len(calls))}
    assert leaf_kinds == {"main", "side", "subagent", "discarded"}
    text = render_text(tree)
    assert "[side]" in text and "[discarded]" in text and "[subagent]" in text and "[shared]" in text
    assert "\033[31m[discarded]" in render_text(tree, colour=True)
    page = render_html(tree, tmp_path / "t.html").read_text()
    assert "border-left-color:#b00020" in page
    old = CallTree.from_calls(calls)  # records without kinds read as main
    assert {node_kind(old, n) for n in old.nodes} == {"main"}


def test_a_real_mini_episode_is_labelled_on_disk(builtin_suite, tmp_path):
    task = builtin_suite.tasks[0]
    with Runtime("scripted:expert", out_dir=tmp_path) as rt:
        res = rt.run(task, make_harness("mini"))
    assert res.record.status == "ok", res.record.error
    on_disk = read_calls(res.record.calls_path)
    assert len(on_disk) == len(res.calls) >= 2
    assert [c.kind for c in on_disk] == ["main"] * len(on_disk)
    assert all(c.kind_reason and c.kind_reason.startswith("structural: the main conversation") for c in on_disk)
    assert [c.output_token_ids for c in on_disk] == [c.output_token_ids for c in res.calls]
    assert not list(tmp_path.rglob("*.labelled")), "the labelled file replaced the streamed one"


def test_an_adapters_own_retries_fill_in_and_bad_answers_are_ignored(mixed):
    calls, kinds, discarded = mixed
    out = classify_calls(calls, _Retries(lambda cs: {0: 6, 2: 6}))  # 2 is already paired (identical prompt)
    assert {c.call_index: c.discarded_by for c in out if c.discarded_by is not None} == {0: 6, **discarded}
    assert [c.kind for c in out] == kinds and not any("ignored" in c.kind_reason for c in out)
    assert [c.discarded_by for c in classify_calls(calls, _Retries(lambda cs: {}))] == \
        [c.discarded_by for c in classify_calls(calls)]

    def boom(cs):
        raise ValueError("bad request")

    late = [c.model_copy(update={"started_at": float(c.call_index)}) for c in calls]
    for bad, why in [(boom, "raised ValueError"), (lambda cs: {0: 99}, "paired 0 with 99"),
                     (lambda cs: {3: 3}, "paired 3 with 3"), (lambda cs: {6: 0}, "paired 6 with 0"),
                     (lambda cs: {"0": 6}, "paired '0' with 6"), (lambda cs: [1, 2], "raised TypeError")]:
        out = classify_calls(late, _Retries(bad))
        assert {c.call_index: c.discarded_by for c in out if c.discarded_by is not None} == discarded, why
        assert all(why in c.kind_reason for c in out), (why, out[0].kind_reason)
