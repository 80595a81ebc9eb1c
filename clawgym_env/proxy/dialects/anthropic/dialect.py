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

Requests are validated by :mod:`~clawgym_env.proxy.dialects.anthropic.request`'s models; a 400 names the field.

Response: a ``thinking`` block (if the model reasoned; signature = a hash of its text), one
``text`` block (present unless the turn is only tool calls), ``tool_use`` blocks (``toolu_`` ids).
Streaming emits the same blocks token by token (see :func:`stream_response`). ``count_tokens`` is
a side call: it renders the prompt with the real template and is not recorded. Keep-alives
(:func:`keepalive`) are the API's ``ping`` events; an in-stream error is ``event: error`` with the
error envelope, which the SDKs raise. A live answer (:func:`live`, :mod:`~clawgym_env.proxy.stream.live`) sends
the same blocks, the thinking and text ones as the policy's text arrives.

This module maps requests; the answer side lives in :mod:`~clawgym_env.proxy.dialects.anthropic.render` (the
``message`` object, the error envelope) and :mod:`~clawgym_env.proxy.dialects.anthropic.stream` (the events: whole,
live and keep-alive), and is re-exported here, where the dialect registry finds it.
"""

from __future__ import annotations

import json
from typing import Any

from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.chat_format import render_prompt_ids
from clawgym_env.proxy.dialects.anthropic.render import error_body, render_response, signature
from clawgym_env.proxy.dialects.anthropic.request import (
    AssistantContent,
    Conversation,
    CustomTool,
    MessagesRequest,
    PlaceholderBlock,
    ResultContent,
    SearchResultBlock,
    SystemContent,
    SystemMessage,
    TextBlock,
    ThinkingBlock,
    ToolReferenceBlock,
    ToolUseBlock,
    UserContent,
    UserMessage,
)
from clawgym_env.proxy.dialects.anthropic.stream import (
    MessagesKeepAlive,
    MessagesLive,
    keepalive,
    live,
    stream_response,
)
from clawgym_env.proxy.dialects.common import JOIN
from clawgym_env.proxy.dialects.contract import DialectSpec, Route
from clawgym_env.proxy.dialects.request_base import bad, validate_body
from clawgym_env.proxy.sessions import TurnRequest

__all__ = ["DIALECT", "MessagesKeepAlive", "MessagesLive", "count_tokens", "error_body", "keepalive", "live",
           "parse_request", "render_response", "signature", "stream_response"]

_PLACEHOLDERS = {"image": "[image]", "document": "[document]"}



DIALECT = DialectSpec(routes=(Route("/v1/messages"), Route("/v1/messages/count_tokens", side="count_tokens")),
                      history_key="messages")
"""``POST /ep/{token}/v1/messages`` (and the side call ``/v1/messages/count_tokens``); the conversation is
``messages``."""


def _placeholder(block: PlaceholderBlock) -> str:
    return _PLACEHOLDERS.get(block.type, f"[{block.type}]")


def _search_text(block: SearchResultBlock) -> str:
    parts = [block.title] if block.title is not None else []
    content = block.content
    if isinstance(content, str):
        parts += [content] if content else []
    else:
        parts += [inner.text for inner in content or []]
    return JOIN.join(parts)


def _result_text(content: ResultContent | None, refs: set[str]) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for block in content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolReferenceBlock):
            refs.add(block.tool_name)
            parts.append(f"[tool_reference: {block.tool_name}]")
        elif isinstance(block, SearchResultBlock):
            parts.append(_search_text(block))
        else:
            parts.append(_placeholder(block))
    return JOIN.join(parts)


def _user(content: UserContent, out: list[JSONObject], refs: set[str]) -> None:
    texts: list[str] = []
    start = len(out)

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": JOIN.join(texts)})
            texts.clear()

    for block in [TextBlock(text=content)] if isinstance(content, str) else content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, SearchResultBlock):
            texts.append(_search_text(block))
        elif isinstance(block, PlaceholderBlock):
            texts.append(_placeholder(block))
        else:
            flush()
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": _result_text(block.content, refs)})
    flush()
    if len(out) == start:
        out.append({"role": "user", "content": ""})


def _assistant(content: AssistantContent) -> JSONObject:
    texts, thoughts, calls = [], [], []
    for block in [TextBlock(text=content)] if isinstance(content, str) else content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
    msg: JSONObject = {"role": "assistant", "content": JOIN.join(texts)}
    if any(thoughts):
        msg["reasoning_content"] = JOIN.join(t for t in thoughts if t)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _system_text(content: SystemContent) -> str:
    return content if isinstance(content, str) else JOIN.join(block.text for block in content)


def _messages(conv: Conversation, refs: set[str]) -> list[JSONObject]:
    out: list[JSONObject] = []
    system = _system_text(conv.system) if conv.system is not None else ""
    if system:  # an empty system prompt adds no turn, as if it were absent
        out.append({"role": "system", "content": system})
    for msg in conv.messages:
        if isinstance(msg, UserMessage):
            _user(msg.content, out, refs)
        elif isinstance(msg, SystemMessage):
            out.append({"role": "system", "content": _system_text(msg.content)})
        else:
            out.append(_assistant(msg.content))
    return out


def _tools(conv: Conversation, refs: set[str]) -> list[JSONObject]:
    out = []
    for tool in conv.tools or []:
        if not isinstance(tool, CustomTool):
            continue  # a server tool (web search, code execution...): nothing the template can offer
        if tool.defer_loading and tool.name not in refs:
            continue
        fn: JSONObject = {"name": tool.name}
        if tool.description is not None:
            fn["description"] = tool.description
        fn["parameters"] = tool.input_schema
        out.append({"type": "function", "function": fn})
    return out


def _offered(conv: Conversation, tools: list[JSONObject]) -> list[JSONObject]:
    choice = conv.tool_choice
    if choice is None:
        return tools
    if choice.type == "none":
        return []
    if choice.type == "tool" and choice.name not in {t["function"]["name"] for t in tools}:
        raise bad(f"'tool_choice.name' names {choice.name!r}, which is not among 'tools'", "tool_choice.name")
    return tools


def _conversation(conv: Conversation) -> tuple[list[JSONObject], list[JSONObject], bool | None]:
    refs: set[str] = set()
    messages = _messages(conv, refs)
    offered = _offered(conv, _tools(conv, refs))
    thinking = None if conv.thinking is None else conv.thinking.type != "disabled"
    return messages, offered, thinking


def parse_request(body: Any) -> TurnRequest:
    """Validate a Messages body and map it (see the module docstring); 400 names the bad field."""
    req = validate_body(MessagesRequest, body)
    messages, tools, thinking = _conversation(req)
    return TurnRequest(messages=messages, tools=tools, max_tokens=req.max_tokens, temperature=req.temperature,
                       top_p=req.top_p, stop=[s for s in req.stop_sequences or [] if s], stream=bool(req.stream),
                       model=req.model, enable_thinking=thinking, tool_id_prefix="toolu_", source=req)


def count_tokens(body: Any, tokenizer: Any) -> dict[str, int]:
    """``{"input_tokens": N}``: the length of the prompt the template renders for this body."""
    messages, tools, thinking = _conversation(validate_body(Conversation, body))
    try:
        ids = render_prompt_ids(tokenizer, messages, tools or None, thinking)
    except Exception as exc:  # noqa: BLE001 - a template failure is a bad request
        raise bad(f"the chat template could not render these messages: {exc}", "messages") from exc
    return {"input_tokens": len(ids)}
