"""Request models of the three dialects, the dialect list, and the one assistant-text parser.

No server and no tokenizer: the dialects' ``parse_request`` and the parser are called directly (the proxy
tests check the same errors over HTTP).
"""

from __future__ import annotations

import random

import pytest

from clawgym_env.capture.records import CallRecord
from clawgym_env.errors import ProxyError, RegistrationError
from clawgym_env.policy.chat_format import IM_END, parse_assistant, segment
from clawgym_env.proxy.app import dialect_routes
from clawgym_env.proxy.deltas import iter_deltas
from clawgym_env.proxy.dialects.anthropic import dialect as anthropic_messages
from clawgym_env.proxy.dialects.openai_chat import dialect as openai_chat
from clawgym_env.proxy.dialects.registry import registered, spec
from clawgym_env.proxy.dialects.request_base import field_path
from clawgym_env.proxy.dialects.responses import dialect as openai_responses

CHAT = {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                                   {"role": "assistant", "content": "", "tool_calls": [
                                       {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                                   {"role": "tool", "tool_call_id": "c1", "content": "out"}]}
ANTHROPIC = {"model": "m", "max_tokens": 8, "messages": [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "out"}]}]}
RESPONSES = {"model": "m", "input": [{"role": "user", "content": "q"},
                                     {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                                     {"type": "function_call_output", "call_id": "c1", "output": "out"}]}
PARSERS = {"chat": openai_chat.parse_request, "anthropic": anthropic_messages.parse_request,
           "responses": openai_responses.parse_request}


def _error(parse, body) -> ProxyError:
    with pytest.raises(ProxyError) as info:
        parse(body)
    assert info.value.status == 400
    return info.value


def _with_extras(value, depth=0):
    """``value`` with an unknown field added to every object in it."""
    if isinstance(value, dict):
        return {**{k: _with_extras(v, depth + 1) for k, v in value.items()}, f"x_unknown_{depth}": {"any": [1]}}
    if isinstance(value, list):
        return [_with_extras(v, depth + 1) for v in value]
    return value


@pytest.mark.parametrize("name,body", [("chat", CHAT), ("anthropic", ANTHROPIC), ("responses", RESPONSES)])
def test_unknown_fields_are_ignored_everywhere(name, body):
    plain, extra = PARSERS[name](body), PARSERS[name](_with_extras(body))
    assert [m.get("role") for m in extra.messages] == [m.get("role") for m in plain.messages]
    assert len(plain.messages) >= 3 and extra.tools == plain.tools and extra.max_tokens == plain.max_tokens


@pytest.mark.parametrize("name,body,field", [
    ("chat", {**CHAT, "messages": CHAT["messages"][:3] + [{"role": "tool", "tool_call_id": "c1", "content": 7}]},
     "messages[3].content"),
    ("chat", {**CHAT, "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ("chat", {**CHAT, "max_tokens": "12"}, "max_tokens"),  # strict: a string is not an integer
    ("chat", {**CHAT, "temperature": True}, "temperature"),  # a boolean is not a number
    ("chat", {**CHAT, "temperature": float("inf")}, "temperature"),
    ("chat", {**CHAT, "model": 3}, "model"),
    ("anthropic", {**ANTHROPIC, "messages": ANTHROPIC["messages"][:2] + [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": 5}]}]}]},
     "messages[2].content[0].content[0].type"),
    ("anthropic", {**ANTHROPIC, "messages": [{"role": "user", "content": [
        {"type": "search_result", "title": "t", "content": [{"type": "text", "text": 1}]}]}]},
     "messages[0].content[0].content[0].text"),
    ("anthropic", {**ANTHROPIC, "thinking": {"type": "enabled", "budget_tokens": -1}}, "thinking.budget_tokens"),
    ("anthropic", {**ANTHROPIC, "messages": "hi", "thread": {"id": "t"}}, "thread"),  # the refusal comes first
    ("responses", {**RESPONSES, "input": RESPONSES["input"][:2] + [{"type": "function_call_output", "call_id": "c1",
                                                                   "output": [{"type": "input_text", "text": None}]}]},
     "input[2].output[0].text"),
    ("responses", {**RESPONSES, "input": [{"role": "user", "content": [{"type": {"nested": 1}}]}]},
     "input[0].content[0].type"),  # was a 500 (an unhashable part type), now a 400
    ("responses", {**RESPONSES, "background": True}, "background"),
    ("responses", {**RESPONSES, "conversation": "conv_1"}, "conversation"),
])
def test_errors_name_the_field_path(name, body, field):
    err = _error(PARSERS[name], body)
    assert err.field == field and str(err).startswith(f"'{field}' "), (err.field, str(err))


@pytest.mark.parametrize("parse", list(PARSERS.values()))
def test_a_body_that_is_not_an_object_names_no_field(parse):
    for body in ([], "x", None, 3):
        err = _error(parse, body)
        assert err.field is None and "JSON object" in str(err)


def test_chat_parts_and_tools_are_passed_on_as_sent():
    """The template renders tools with ``tojson``: key order and unknown keys reach the prompt unchanged."""
    tool = {"function": {"strict": True, "parameters": {"type": "object"}, "name": "f", "description": "d"},
            "type": "function", "x_note": 1}
    part = {"cache_control": {"type": "ephemeral"}, "text": "hi", "type": "text"}
    req = openai_chat.parse_request({**CHAT, "tools": [tool], "messages": [{"role": "user", "content": [part, "raw"]}]})
    assert req.tools == [tool] and list(req.tools[0]) == list(tool)
    assert list(req.tools[0]["function"]) == list(tool["function"])
    assert req.messages[0]["content"] == [part, "raw"] and list(req.messages[0]["content"][0]) == list(part)


def test_mapped_requests_keep_their_meaning():
    chat = openai_chat.parse_request({**CHAT, "max_tokens": 9, "max_completion_tokens": 7, "stop": ["", "X"],
                                      "stream": True, "stream_options": {"include_usage": True},
                                      "chat_template_kwargs": {"enable_thinking": False}, "temperature": 1})
    assert (chat.max_tokens, chat.stop, chat.include_usage, chat.enable_thinking) == (7, ["X"], True, False)
    assert chat.temperature == 1.0 and isinstance(chat.temperature, float)
    assert chat.messages[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    anth = anthropic_messages.parse_request(ANTHROPIC)
    assert anth.messages[-1] == {"role": "tool", "tool_call_id": "t1", "content": "out"}
    assert anth.tool_id_prefix == "toolu_" and anth.max_tokens == 8
    resp = openai_responses.parse_request({**RESPONSES, "reasoning": {"effort": "minimal"}})
    assert resp.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert resp.enable_thinking is False


def test_field_path_drops_union_tags():
    assert field_path(["messages", 3, "<user>", "content", "<array>", 0, "text"]) == "messages[3].content[0].text"
    assert field_path([]) == ""


# ----------------------------------------------------------------------------- the dialect list

def test_the_registry_feeds_names_routes_and_records():
    """The built-in dialects' routes come from each module's own DIALECT; records accept registered names only."""
    dialects = registered()
    assert [d.name for d in dialects[:3]] == ["openai_chat", "anthropic_messages", "openai_responses"]
    routes = {(method, path): (d.name, fn, side) for method, path, d, fn, side in dialect_routes(dialects)}
    assert routes[("POST", "/v1/chat/completions")] == ("openai_chat", "parse_request", False)
    assert routes[("POST", "/v1/messages")] == ("anthropic_messages", "parse_request", False)
    assert routes[("POST", "/v1/messages/count_tokens")] == ("anthropic_messages", "count_tokens", True)
    assert routes[("POST", "/v1/responses")] == ("openai_responses", "parse_request", False)
    for d in dialects:
        assert all(callable(getattr(d.module, f)) for f in ("parse_request", "render_response", "stream_response",
                                                            "error_body", "keepalive"))
    assert spec("openai_responses").history_key == "input"
    with pytest.raises(RegistrationError, match="available: .*openai-chat"):
        spec("grpc")
    fields = dict(episode_id="e", call_index=0, path="/v1/x", stream=False, request={}, prompt_token_ids=[1],
                  output_token_ids=[2], output_logprobs=[0.0], finish_reason="stop")
    assert CallRecord(dialect="openai_chat", **fields).dialect == "openai_chat"
    with pytest.raises(ValueError, match="unknown dialect 'grpc'.*available: anthropic-messages"):
        CallRecord(dialect="grpc", **fields)


# ----------------------------------------------------------------------------- one assistant-text parser

TRICKY = [
    "",
    "plain answer",
    "<think>\nonly thinking\n</think>\n\n",
    "<think>\nunclosed reasoning that never ends",
    "no opening tag</think>\n\nanswer",
    "<think>\nr\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
    "text first\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"</tool_call> inside\"}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"<tool_call>\"}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": "
    "{\"x\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"c\", \"arguments\": \"raw string\"}\n</tool_call>",
    "<tool_call>\n{not json}\n</tool_call> then text",
    "<tool_call>\n{\"name\": 3}\n</tool_call>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n",  # unclosed tool call
    "<think>\n</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>" + IM_END,
    "émoji 🤔 <tool_call>\n{\"name\": \"f\", \"arguments\": {\"t\": \"ü\"}}\n</tool_call>  \n" + IM_END,
    "  \n<think>a</think>b<|endoftext|>",
]


def _chunkings(text: str, rng: random.Random) -> list[list[str]]:
    out = [[text], list(text)]
    for _ in range(5):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 6))))
        out.append([text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])])
    return out


@pytest.mark.parametrize("text", TRICKY)
def test_streamed_and_whole_parses_agree(text):
    ref = parse_assistant(text)
    for pieces in _chunkings(text, random.Random(len(text))):
        deltas = list(iter_deltas(pieces, segment("".join(pieces))))
        assert "".join(d.text for d in deltas if d.kind == "content") == ref.content
        assert "".join(d.text for d in deltas if d.kind == "reasoning") == (ref.reasoning or "")
        starts = [d for d in deltas if d.kind == "tool_start"]
        assert [d.name for d in starts] == [c["name"] for c in ref.tool_calls]
        assert [d.index for d in starts] == list(range(len(ref.tool_calls)))
        for i, call in enumerate(ref.tool_calls):
            args = [d for d in deltas if d.kind == "tool_args" and d.index == i]
            assert "".join(d.text for d in args) == call["arguments"]
            assert deltas.index(starts[i]) < min((deltas.index(d) for d in args), default=len(deltas))


def test_parser_results_on_tricky_texts():
    assert parse_assistant(TRICKY[2]).reasoning == "only thinking" and parse_assistant(TRICKY[2]).content == ""
    assert parse_assistant(TRICKY[3]).reasoning is None  # no </think>: all of it is content
    assert parse_assistant(TRICKY[4]).reasoning == "no opening tag"
    inside = parse_assistant(TRICKY[7])
    assert [c["name"] for c in inside.tool_calls] == ["f"] and '"<tool_call>"' in inside.tool_calls[0]["arguments"]
    several = parse_assistant(TRICKY[8])
    assert [(c["name"], c["arguments"]) for c in several.tool_calls] == [
        ("a", "{}"), ("b", '{"x": [1, 2]}'), ("c", "raw string")]
    broken = parse_assistant(TRICKY[9])
    assert broken.tool_calls == [] and broken.content.startswith("<tool_call>") and broken.errors
    assert parse_assistant(TRICKY[11]).tool_calls == []  # an unclosed call stays content
