"""Token-in, token-out: sampled assistant turns are spliced back verbatim despite harness rewrites."""

from __future__ import annotations

import json
from types import SimpleNamespace

from clawgym_env.policy.chat_format import assistant_text, parse_assistant, render_prompt_ids
from clawgym_env.proxy.splice import splice_prompt, turn_key

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}]
BASE = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "List the files."}]


def _call(tokenizer, messages, text, thinking=False):
    prompt = render_prompt_ids(tokenizer, messages, TOOLS, thinking)
    out = tokenizer.encode(text, add_special_tokens=False)
    return SimpleNamespace(prompt_token_ids=prompt, output_token_ids=out,
                           response_message=parse_assistant(text).to_openai_message())


def _rewritten_turn(content, name, args_compact, call_id="callabc"):
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args_compact}}]}


def test_rewritten_history_is_spliced_token_exact(tokenizer):
    # The model sampled odd whitespace and spaced JSON; the harness sends back compact JSON and a new id.
    text = assistant_text("Let me  look.", tool_calls=[("bash", {"command": "ls -la", "n": 1})])
    c1 = _call(tokenizer, BASE, text)
    history = BASE + [_rewritten_turn("Let me  look.", "bash", json.dumps({"n": 1, "command": "ls -la"},
                                                                           separators=(",", ":"))),
                      {"role": "tool", "tool_call_id": "callabc", "content": "a.txt\nb.txt"}]
    ids, exact, reason = splice_prompt(tokenizer, history, TOOLS, False, [c1])
    assert exact and reason is None
    assert ids[:len(c1.prompt_token_ids) + len(c1.output_token_ids)] == c1.prompt_token_ids + c1.output_token_ids
    # re-rendering the text instead would NOT extend the sampled sequence (the drift we avoid)
    plain = render_prompt_ids(tokenizer, history, TOOLS, False)
    assert plain[:len(ids)] != ids[:len(plain)]
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_two_turns_and_dropped_reasoning(tokenizer):
    t1 = assistant_text("", reasoning="I should list.", tool_calls=[("bash", {"command": "ls"})])
    c1 = _call(tokenizer, BASE, t1, thinking=None)
    h1 = BASE + [_rewritten_turn("", "bash", '{"command":"ls"}', "c1"), {"role": "tool", "tool_call_id": "c1",
                                                                         "content": "a.txt"}]
    p2, exact, _ = splice_prompt(tokenizer, h1, TOOLS, None, [c1])
    assert exact
    t2 = assistant_text("There is one file: a.txt.")
    c2 = SimpleNamespace(prompt_token_ids=p2, output_token_ids=tokenizer.encode(t2, add_special_tokens=False),
                         response_message=parse_assistant(t2).to_openai_message())
    h2 = h1 + [{"role": "assistant", "content": "There is one file: a.txt."}, {"role": "user", "content": "Thanks"}]
    p3, exact, _ = splice_prompt(tokenizer, h2, TOOLS, None, [c1, c2])
    assert exact
    assert p3[:len(p2) + len(c2.output_token_ids)] == p2 + c2.output_token_ids
    # the reasoning the harness dropped is still in the spliced prompt, as the model sampled it
    assert "I should list." in tokenizer.decode(p3)


def test_unmatched_turn_is_flagged_not_exact(tokenizer):
    c1 = _call(tokenizer, BASE, assistant_text("Hello."))
    history = BASE + [{"role": "assistant", "content": "A turn the policy never produced."},
                      {"role": "user", "content": "go on"}]
    ids, exact, reason = splice_prompt(tokenizer, history, TOOLS, False, [c1])
    assert not exact and "match no sampled output" in reason
    assert ids == render_prompt_ids(tokenizer, history, TOOLS, False)


def test_turn_key_ignores_ids_and_formatting():
    a = _rewritten_turn(" ok ", "bash", '{"b": 2, "a": 1}', "call_1")
    b = _rewritten_turn("ok", "bash", '{"a":1,"b":2}', "call1")
    assert turn_key(a) == turn_key(b)
    assert turn_key(a) != turn_key(_rewritten_turn("ok", "bash", '{"a":1,"b":3}'))
