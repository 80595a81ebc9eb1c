"""Incremental prompt rendering gives exactly the ids of a full render + splice, and reuses what it can.

(a) seeded synthetic episodes: tools, thinking kept and dropped, parallel tool calls, unicode, new user
queries, cut-off outputs, repeated identical turns, invented turns, interleaved side conversations,
prefills, edits; (b) real episodes of every installed harness (scripted expert through the proxy),
each call's request replayed against a fresh cache; (c) the fallbacks: an edited history, changed
tools or system prompt, a template the incremental path is not proven for.
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from clawgym_env.envs.runtime import RolloutPool
from clawgym_env.errors import HarnessError
from clawgym_env.plugins import make_harness
from clawgym_env.policy.chat_format import assistant_text, normalize_messages, parse_assistant
from clawgym_env.proxy.dialects.registry import spec
from clawgym_env.proxy.incremental import PromptCache, PromptIds, template_is_local
from clawgym_env.proxy.splice import splice_prompt

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command — «safely»",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a file (UTF-8, 日本語 ok)",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
]
WORDS = ["ls", "naïve", "Straße", "数据", "🙂", "x=1", "\n", "  ", "{\"a\": 1}", "<tool_response>", "résumé", "end."]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, n)))


def _check(tokenizer, cache: PromptCache, messages, tools, thinking, calls) -> PromptIds:
    full = splice_prompt(tokenizer, messages, tools, thinking, calls)
    got = cache.prompt(tokenizer, messages, tools, thinking, calls)
    assert (got.ids, got.token_exact, got.reason) == full
    return got


class _Episode:
    """A harness's view of one conversation plus the calls the policy answered."""

    def __init__(self, rng: random.Random, tools, system: str | None) -> None:
        self.rng = rng
        self.tools = tools
        self.messages = [{"role": "system", "content": system}] if system is not None else []
        self.messages.append({"role": "user", "content": "Task: " + _text(rng, 8)})

    def answer(self, tokenizer, prompt_ids, calls) -> None:
        """Sample a turn (as the model would write it), record the call, append it as a harness would."""
        rng = self.rng
        reasoning = _text(rng, 6) if rng.random() < 0.5 else None
        names = [("bash", {"command": rng.choice(["ls", "cat a.txt", "echo 数据"])}),
                 ("read_file", {"path": rng.choice(["a.txt", "ü.md"])})]
        tool_calls = [rng.choice(names) for _ in range(rng.choice([0, 1, 1, 2, 3]))] if self.tools else []
        out = tokenizer.encode(assistant_text(_text(rng, 5), reasoning, tool_calls), add_special_tokens=False)
        if rng.random() < 0.1:
            out = out[:-1]  # cut off (max_tokens): no <|im_end|>
        message = parse_assistant(tokenizer.decode(out)).to_openai_message()
        calls.append(SimpleNamespace(prompt_token_ids=list(prompt_ids), output_token_ids=out,
                                     response_message=message))
        sent = json.loads(json.dumps(message))
        if rng.random() < 0.5:
            sent.pop("reasoning_content", None)  # harnesses often drop the thinking
        for k, tc in enumerate(sent.get("tool_calls") or []):
            tc["id"] = f"toolu_{len(calls)}_{k}"  # harnesses rewrite ids and argument formatting
            args = json.loads(tc["function"]["arguments"])
            tc["function"]["arguments"] = json.dumps(args, indent=rng.choice([None, 1]))
        self.messages.append(sent)
        if sent.get("tool_calls"):
            for tc in sent["tool_calls"]:
                self.messages.append({"role": "tool", "tool_call_id": tc["id"], "content": _text(rng, 12)})
        else:
            self.messages.append({"role": "user", "content": _text(rng, 6) or "go on"})


@pytest.mark.parametrize("seed", range(12))
def test_incremental_equals_full_render_on_synthetic_episodes(tokenizer, seed):
    rng = random.Random(seed)
    cache = PromptCache()
    calls: list[SimpleNamespace] = []
    main = _Episode(rng, TOOLS if seed % 3 else None, "You are a helper. ✓" if seed % 2 else None)
    side = _Episode(rng, TOOLS, "Summarise in 5 words.")
    reused = total = 0
    usual = rng.choice([None, True, False])
    for step in range(24):
        ep = side if step % 7 == 6 else main
        thinking = usual if rng.random() < 0.9 else rng.choice([None, True, False])
        messages = normalize_messages(ep.messages)
        event = rng.random()
        if event < 0.08 and len(messages) > 3:  # an invented assistant turn the policy never sampled
            messages = messages + [{"role": "assistant", "content": "I made this up"},
                                   {"role": "user", "content": "ok <|im_start|>assistant\nquoted"}]
        elif event < 0.14:  # a prefill: the conversation ends with a partial assistant turn
            messages = messages + [{"role": "assistant", "content": "Sure"}]
        elif event < 0.18 and len(messages) > 4:  # an edit deep in the history (compaction)
            k = rng.randrange(1, len(messages) - 1)
            messages = [dict(m) for m in messages]
            messages[k]["content"] = "[compacted] " + _text(rng, 3)
        elif event < 0.22 and messages[-1]["role"] == "user":  # a message quoting the template's own tokens
            ep.messages[-1]["content"] += " <|im_start|>user\nquoted<|im_end|>"
            messages = normalize_messages(ep.messages)
        got = _check(tokenizer, cache, messages, ep.tools, thinking, calls)
        reused += got.reused
        total += len(got.ids)
        ep.answer(tokenizer, got.ids, calls)
    assert reused > 0.25 * total, (reused, total)  # repeated identical turns legitimately cut reuse short


def _conversation(n_turns: int) -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}]
    for i in range(n_turns):
        msgs.append({"role": "assistant", "content": "", "reasoning_content": f"think {i}",
                     "tool_calls": [{"type": "function", "id": f"c{i}",
                                     "function": {"name": "bash", "arguments": json.dumps({"command": f"ls {i}"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i} ünïcode"})
    return msgs


def test_extending_reuses_and_an_edited_history_falls_back(tokenizer):
    cache = PromptCache()
    first = _check(tokenizer, cache, _conversation(3), TOOLS, None, [])
    assert first.reused == 0
    longer = _conversation(4)
    assert _check(tokenizer, cache, longer, TOOLS, None, []).reused == len(first.ids) - 3  # all but the opener
    edited = [dict(m) for m in longer]
    edited[3]["content"] = "out 0 (edited)"
    upto = _check(tokenizer, PromptCache(), edited[:4], TOOLS, None, [])
    tail = "<|im_start|>user\n<tool_response>\nout 0 (edited)\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    again = _check(tokenizer, cache, edited, TOOLS, None, [])
    assert again.reused == len(upto.ids) - len(tokenizer.encode(tail, add_special_tokens=False))  # up to the edit
    assert _check(tokenizer, cache, longer, TOOLS[:1], None, []).reused == 0  # other tools: a new header
    other_system = [{"role": "system", "content": "another"}] + longer[1:]
    assert _check(tokenizer, cache, other_system, TOOLS, None, []).reused == 0


def test_a_new_user_query_cuts_before_turns_whose_reasoning_it_drops(tokenizer):
    cache = PromptCache()
    msgs = _conversation(2)
    _check(tokenizer, cache, msgs, None, None, [])
    # Qwen3 renders reasoning only after the last real query: a new query re-renders turns 2 and 4
    got = _check(tokenizer, cache, msgs + [{"role": "user", "content": "next question"}], None, None, [])
    head = _check(tokenizer, PromptCache(), msgs[:2], None, None, [])
    assert got.reused == len(head.ids) - 3


def test_a_new_call_that_sampled_an_earlier_turn_again_is_spliced_like_the_full_render(tokenizer):
    cache = PromptCache()
    turn = assistant_text("", "think 0", [("bash", {"command": "ls 0"})])
    other = assistant_text("", "other thought", [("bash", {"command": "ls 0"})])  # same turn key, other ids

    def call(text):
        return SimpleNamespace(prompt_token_ids=[], output_token_ids=tokenizer.encode(text, add_special_tokens=False),
                               response_message=parse_assistant(text).to_openai_message())

    calls = [call(turn)]
    _check(tokenizer, cache, _conversation(2), None, None, calls)
    calls.append(call(other))  # splicing now takes this one for turn 2
    got = _check(tokenizer, cache, _conversation(3), None, None, calls)
    head = _check(tokenizer, PromptCache(), _conversation(0), None, None, [])
    assert got.reused == len(head.ids) - 3  # cut before turn 2
    assert got.token_exact is False  # turns 4 and 6 were never sampled
    # the same turn sampled again with the same ids changes no id: nothing to re-render
    same = PromptCache()
    first = _check(tokenizer, same, _conversation(2), None, None, calls[:1])
    again = _check(tokenizer, same, _conversation(3), None, None, calls[:1] + [call(turn)])
    assert again.reused == len(first.ids) - 3
    # a request that raced ahead: its snapshot lacks the call the kept prompt spliced turn 2 from
    raced = PromptCache()
    _check(tokenizer, raced, _conversation(2), None, None, calls)
    assert _check(tokenizer, raced, _conversation(3), None, None, calls[:1]).reused == len(head.ids) - 3


def test_a_history_quoting_the_templates_tokens_is_still_reused(tokenizer):
    cache = PromptCache()
    quoting = _conversation(2)
    quoting[3]["content"] = "a chat template: <|im_start|>user\nhi<|im_end|>\n<|im_start|>system"
    quoting[0]["content"] = "sys <|im_start|>"
    tools = [dict(TOOLS[0], description="<|im_start|> in a schema")]
    first = _check(tokenizer, cache, quoting, tools, None, [])
    more = quoting + _conversation(3)[-2:]
    assert _check(tokenizer, cache, more, tools, None, []).reused == len(first.ids) - 3


def test_other_templates_always_take_the_full_path(tokenizer):
    assert template_is_local(tokenizer)
    assert not template_is_local(SimpleNamespace(chat_template="{{ messages }}"))
    assert not template_is_local(SimpleNamespace(chat_template=None))


HARNESSES = ["mini", "claude-code", "codex", "qwen-code", "openclaw"]


@pytest.mark.parametrize("harness", HARNESSES)
def test_incremental_equals_full_render_on_real_episodes(harness, tokenizer, expert_runtime, builtin_suite):
    adapter = make_harness(harness)
    try:
        adapter.install()
    except HarnessError as exc:
        pytest.skip(f"cannot install {harness}: {exc}")

    def tool_steps(t):
        return sum("tool" in s for s in json.loads(t.expert_path.read_text())["steps"])

    task = max(builtin_suite.tasks, key=tool_steps)
    [result] = RolloutPool(expert_runtime, concurrency=1, progress=False).run([task], adapter)
    assert result.record.status == "ok", (harness, result.record.error)
    calls = result.calls
    assert len(calls) >= 3
    cache = PromptCache()
    reused = 0
    for i, call in enumerate(calls):
        req = spec(call.dialect).load().parse_request(call.request)
        got = _check(tokenizer, cache, normalize_messages(req.messages), req.tools or None, req.enable_thinking,
                     calls[:i])
        assert got.ids == call.prompt_token_ids  # what the proxy computed live, incrementally
        reused += got.reused > 0
    assert reused >= len(calls) // 2, (harness, reused, len(calls))
