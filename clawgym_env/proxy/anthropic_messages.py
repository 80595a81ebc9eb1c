"""The Anthropic Messages dialect: ``POST /v1/messages`` (and ``/v1/messages/count_tokens``).

The request is mapped onto the pipeline's OpenAI-chat shape, then rendered by the Qwen3 template:
  * ``system`` (a string or text blocks; empty = absent) → one leading system message; ``role: "system"`` messages
    inside ``messages`` (Claude Code sends them) → system messages in place.
  * user content: text blocks → text; ``image``/``document`` → ``[image]``/``[document]``;
    ``search_result`` → its title and texts; each ``tool_result`` → a ``tool`` message
    (``tool_call_id`` = ``tool_use_id``) whose text is its string or blocks (images as placeholders,
    a ``tool_reference`` as ``[tool_reference: NAME]``). Text around tool results becomes user
    messages in order. ``is_error`` is not rendered (the template has no slot): the tool's own text
    is what the model sees.
  * assistant content: text → ``content``; ``thinking`` → ``reasoning_content`` (the signature is
    accepted and not checked); ``redacted_thinking`` → dropped (opaque); ``tool_use`` →
    ``tool_calls`` with ``arguments = json.dumps(input)``.
  * tools: custom tools (no ``type`` or ``"custom"``) → function tools (``input_schema`` →
    ``parameters``); server tools (``web_search_*``, ``bash_*`` ...) are skipped; a tool with
    ``defer_loading: true`` is offered only once a ``tool_reference`` names it (as the API does).
  * ``tool_choice``: ``none`` hides the tools; ``any``/``tool`` offer them unchanged (the proxy
    cannot force a call; a named tool must exist). ``thinking`` enabled|adaptive → the template's
    ``enable_thinking=True``, disabled → False, absent → the template default; ``budget_tokens`` and
    ``top_k`` are accepted, not enforced. ``cache_control``, ``citations``, ``metadata``,
    ``output_config``, ``context_management`` and unknown fields are ignored. A trailing assistant
    message (prefill) is rendered as a finished turn; the answer does not continue it.
  * ``thread`` (the message-threads beta: the server holds the conversation and the client sends only
    the new turn) is refused with a 400 naming the field: this proxy is stateless, and serving the
    partial ``messages`` would be a 200 over a truncated prompt.

Response: a ``thinking`` block (if the model reasoned; signature = a hash of its text), one
``text`` block (present unless the turn is only tool calls), ``tool_use`` blocks (``toolu_`` ids).
Streaming emits the same blocks token by token (see :func:`stream_response`). ``count_tokens`` is
a side call: it renders the prompt with the real template and is not recorded.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator

from clawgym_env.policy.chat_format import render_prompt_ids
from clawgym_env.proxy.dialect_common import (JOIN, bad, flag, json_object, model_field, name_field, new_id,
                                              number, pos_int, split_output, sse, text_field)
from clawgym_env.proxy.sessions import TurnRequest, TurnResult

NAME = "anthropic_messages"
_PLACEHOLDERS = {"image": "[image]", "document": "[document]"}
_USER_BLOCKS = ("text", "image", "document", "search_result", "tool_result")
_ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def _blocks(value: Any, field: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise bad(f"'{field}' must be a string or a list of content blocks", field)
    for j, block in enumerate(value):
        if not isinstance(block, dict):
            raise bad(f"'{field}[{j}]' must be a content block object", f"{field}[{j}]")
        if not isinstance(block.get("type"), str):
            raise bad(f"'{field}[{j}].type' is required", f"{field}[{j}].type")
    return value


def _search_text(block: dict, field: str) -> str:
    parts = [block["title"]] if isinstance(block.get("title"), str) else []
    for j, inner in enumerate(_blocks(block.get("content") or [], f"{field}.content")):
        parts.append(text_field(inner, "text", f"{field}.content[{j}].text"))
    return JOIN.join(parts)


def _result_text(content: Any, field: str, refs: set[str]) -> str:
    if content is None:
        return ""
    parts = []
    for j, block in enumerate(_blocks(content, field)):
        f, kind = f"{field}[{j}]", block["type"]
        if kind == "text":
            parts.append(text_field(block, "text", f"{f}.text"))
        elif kind == "tool_reference":
            name = name_field(block, "tool_name", f"{f}.tool_name")
            refs.add(name)
            parts.append(f"[tool_reference: {name}]")
        elif kind == "search_result":
            parts.append(_search_text(block, f))
        else:  # image, document, browser state ...: the template has no slot for them
            parts.append(_PLACEHOLDERS.get(kind, f"[{kind}]"))
    return JOIN.join(parts)


def _user(content: Any, field: str, out: list[dict[str, Any]], refs: set[str]) -> None:
    texts: list[str] = []
    start = len(out)

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": JOIN.join(texts)})
            texts.clear()

    for j, block in enumerate(_blocks(content, field)):
        f, kind = f"{field}[{j}]", block["type"]
        if kind not in _USER_BLOCKS:
            raise bad(f"'{f}.type' must be one of {', '.join(_USER_BLOCKS)} in a user message; got {kind!r}",
                      f"{f}.type")
        if kind == "text":
            texts.append(text_field(block, "text", f"{f}.text"))
        elif kind == "search_result":
            texts.append(_search_text(block, f))
        elif kind in _PLACEHOLDERS:
            texts.append(_PLACEHOLDERS[kind])
        else:
            flush()
            tid = name_field(block, "tool_use_id", f"{f}.tool_use_id")
            flag(block, "is_error", f"{f}.is_error")
            out.append({"role": "tool", "tool_call_id": tid,
                        "content": _result_text(block.get("content"), f"{f}.content", refs)})
    flush()
    if len(out) == start:
        out.append({"role": "user", "content": ""})


def _assistant(content: Any, field: str) -> dict[str, Any]:
    texts, thoughts, calls = [], [], []
    for j, block in enumerate(_blocks(content, field)):
        f, kind = f"{field}[{j}]", block["type"]
        if kind not in _ASSISTANT_BLOCKS:
            raise bad(f"'{f}.type' must be one of {', '.join(_ASSISTANT_BLOCKS)} in an assistant message; "
                      f"got {kind!r}", f"{f}.type")
        if kind == "text":
            texts.append(text_field(block, "text", f"{f}.text"))
        elif kind == "thinking":
            thoughts.append(text_field(block, "thinking", f"{f}.thinking"))
        elif kind == "tool_use":
            tid = name_field(block, "id", f"{f}.id")
            name = text_field(block, "name", f"{f}.name")  # may be empty: a sampled call sent back
            args = block.get("input", {})
            if not isinstance(args, dict):
                raise bad(f"'{f}.input' must be an object", f"{f}.input")
            calls.append({"id": tid, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
    msg: dict[str, Any] = {"role": "assistant", "content": JOIN.join(texts)}
    if any(thoughts):
        msg["reasoning_content"] = JOIN.join(t for t in thoughts if t)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _system_text(value: Any, field: str) -> str:
    parts = []
    for j, block in enumerate(_blocks(value, field)):
        if block["type"] != "text":
            raise bad(f"'{field}[{j}].type' must be 'text' in a system prompt, got {block['type']!r}",
                      f"{field}[{j}].type")
        parts.append(text_field(block, "text", f"{field}[{j}].text"))
    return JOIN.join(parts)


def _messages(body: dict, refs: set[str]) -> list[dict[str, Any]]:
    msgs = body.get("messages")
    if msgs is None:
        raise bad("'messages' is required: a list of {role, content} objects", "messages")
    if not isinstance(msgs, list):
        raise bad(f"'messages' must be a list, got {type(msgs).__name__}", "messages")
    if not msgs:
        raise bad("'messages' must contain at least one message", "messages")
    out: list[dict[str, Any]] = []
    system = _system_text(body["system"], "system") if body.get("system") is not None else ""
    if system:  # an empty system prompt adds no turn, as if it were absent
        out.append({"role": "system", "content": system})
    for i, msg in enumerate(msgs):
        f = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad(f"'{f}' must be an object with a role and content", f)
        role = msg.get("role")
        if role not in ("user", "assistant", "system"):
            raise bad(f"'{f}.role' must be 'user' or 'assistant' (or 'system'); got {role!r}", f"{f}.role")
        if "content" not in msg:
            raise bad(f"'{f}.content' is required", f"{f}.content")
        if role == "user":
            _user(msg["content"], f"{f}.content", out, refs)
        elif role == "assistant":
            out.append(_assistant(msg["content"], f"{f}.content"))
        else:
            out.append({"role": "system", "content": _system_text(msg["content"], f"{f}.content")})
    return out


def _tools(body: dict, refs: set[str]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad("'tools' must be a list of {name, description, input_schema} objects", "tools")
    out = []
    for i, tool in enumerate(tools):
        f = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad(f"'{f}' must be a tool object", f)
        name = name_field(tool, "name", f"{f}.name")
        if tool.get("type") not in (None, "custom"):
            continue  # a server tool (web search, code execution...): nothing the template can offer
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise bad(f"'{f}.input_schema' is required (a JSON schema object)", f"{f}.input_schema")
        if flag(tool, "defer_loading", f"{f}.defer_loading") and name not in refs:
            continue
        fn: dict[str, Any] = {"name": name}
        desc = text_field(tool, "description", f"{f}.description", required=False)
        if desc is not None:
            fn["description"] = desc
        fn["parameters"] = schema
        out.append({"type": "function", "function": fn})
    return out


def _offered(body: dict, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    choice = body.get("tool_choice")
    if choice is None:
        return tools
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise bad("'tool_choice.type' must be one of auto, any, tool, none", "tool_choice.type")
    flag(choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use")
    if kind == "none":
        return []
    if kind == "tool":
        name = name_field(choice, "name", "tool_choice.name")
        if name not in {t["function"]["name"] for t in tools}:
            raise bad(f"'tool_choice.name' names {name!r}, which is not among 'tools'", "tool_choice.name")
    return tools


def _thinking(body: dict) -> bool | None:
    cfg = body.get("thinking")
    if cfg is None:
        return None
    kind = cfg.get("type") if isinstance(cfg, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        raise bad("'thinking.type' must be 'enabled', 'adaptive' or 'disabled'", "thinking.type")
    pos_int(cfg, "budget_tokens", "thinking.budget_tokens")
    return kind != "disabled"


def _conversation(body: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool | None]:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None)
    if body.get("thread") is not None:
        raise bad("'thread' (server-held message threads: create/continue) is not supported: this proxy keeps no "
                  "conversation state and would otherwise answer over a truncated prompt; send the whole "
                  "conversation in 'messages' without 'thread'", "thread")
    refs: set[str] = set()
    messages = _messages(body, refs)
    offered = _offered(body, _tools(body, refs))
    return messages, offered, _thinking(body)


def parse_request(body: Any) -> TurnRequest:
    """Validate a Messages body and map it (see the module docstring); 400 names the bad field."""
    messages, tools, thinking = _conversation(body)
    max_tokens = pos_int(body, "max_tokens")
    if max_tokens is None:
        raise bad("'max_tokens' is required (a positive integer)", "max_tokens")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        raise bad("'stop_sequences' must be a list of strings", "stop_sequences")
    pos_int(body, "top_k")
    return TurnRequest(messages=messages, tools=tools, max_tokens=max_tokens,
                       temperature=number(body, "temperature", 0.0, 1.0), top_p=number(body, "top_p", 0.0, 1.0),
                       stop=[s for s in stops or [] if s], stream=bool(flag(body, "stream")),
                       model=model_field(body), enable_thinking=thinking, tool_id_prefix="toolu_")


def count_tokens(body: Any, tokenizer: Any) -> dict[str, int]:
    """``{"input_tokens": N}``: the length of the prompt the template renders for this body."""
    messages, tools, thinking = _conversation(body)
    try:
        ids = render_prompt_ids(tokenizer, messages, tools or None, thinking)
    except Exception as exc:  # noqa: BLE001 - a template failure is a bad request
        raise bad(f"the chat template could not render these messages: {exc}", "messages") from exc
    return {"input_tokens": len(ids)}


def signature(thinking: str) -> str:
    """The signature sent with a thinking block (a digest of its text; never checked on the way back)."""
    return "clawgym-" + hashlib.sha256(thinking.encode("utf-8")).hexdigest()


def _blocks_out(res: TurnResult) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(final block, stream deltas) per content block, in order: thinking, text, tool_use."""
    out = split_output(res)
    blocks = []
    if out.reasoning:
        sig = signature(out.reasoning)
        deltas = [{"type": "thinking_delta", "thinking": c} for c in out.reasoning_chunks]
        blocks.append(({"type": "thinking", "thinking": out.reasoning, "signature": sig},
                       deltas + [{"type": "signature_delta", "signature": sig}]))
    if out.content or not out.calls:
        blocks.append(({"type": "text", "text": out.content},
                       [{"type": "text_delta", "text": c} for c in out.content_chunks]))
    for call in out.calls:
        args = json_object(call.arguments)
        chunks = call.chunks
        if args is None:  # not a JSON object: wrap it so ``input`` stays an object
            args = {"_raw_arguments": call.arguments}
            chunks = [json.dumps(args, ensure_ascii=False)]
        blocks.append(({"type": "tool_use", "id": call.id, "name": call.name, "input": args},
                       [{"type": "input_json_delta", "partial_json": c} for c in chunks]))
    return blocks


def _stop(res: TurnResult) -> tuple[str, str | None]:
    if res.stop_sequence is not None and res.finish_reason == "stop":
        return "stop_sequence", res.stop_sequence
    return _STOP.get(res.finish_reason, "end_turn"), None


def _usage(res: TurnResult) -> dict[str, int]:
    return {"input_tokens": res.prompt_tokens, "output_tokens": res.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _message(res: TurnResult, model: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": res.request.model or model,
            "content": content, "stop_reason": None, "stop_sequence": None, "usage": _usage(res)}


def render_response(res: TurnResult, model: str) -> dict[str, Any]:
    """The ``message`` object for a finished turn."""
    msg = _message(res, model, [block for block, _ in _blocks_out(res)])
    msg["stop_reason"], msg["stop_sequence"] = _stop(res)
    return msg


def stream_response(res: TurnResult, model: str) -> Iterator[str]:
    """SSE events: message_start, ping, per block content_block_start / _delta... / _stop,
    message_delta (stop_reason, usage), message_stop. Deltas follow the sampled tokens."""
    start = _message(res, model, [])
    start["usage"] = {**start["usage"], "output_tokens": 0}
    yield sse("message_start", {"type": "message_start", "message": start})
    yield sse("ping", {"type": "ping"})
    for index, (block, deltas) in enumerate(_blocks_out(res)):
        empty = {"thinking": {"thinking": "", "signature": ""}, "text": {"text": ""}, "tool_use": {"input": {}}}
        head = {k: v for k, v in block.items() if k in ("type", "id", "name")}
        yield sse("content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {**head, **empty[block["type"]]}})
        for delta in deltas:
            yield sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
    reason, seq = _stop(res)
    yield sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                                "usage": _usage(res)})
    yield sse("message_stop", {"type": "message_stop"})


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> dict[str, Any]:
    """Anthropic's error envelope ``{"type": "error", "error": {"type", "message"}}``."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": new_id("req_")}

