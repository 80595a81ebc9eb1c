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

Requests are validated by :mod:`~clawgym_env.proxy.requests_anthropic`'s models; a 400 names the field.

Response: a ``thinking`` block (if the model reasoned; signature = a hash of its text), one
``text`` block (present unless the turn is only tool calls), ``tool_use`` blocks (``toolu_`` ids).
Streaming emits the same blocks token by token (see :func:`stream_response`). ``count_tokens`` is
a side call: it renders the prompt with the real template and is not recorded. Keep-alives
(:func:`keepalive`) are the API's ``ping`` events; an in-stream error is ``event: error`` with the
error envelope, which the SDKs raise. A live answer (:func:`live`, :mod:`~clawgym_env.proxy.live`) sends
the same blocks, the thinking and text ones as the policy's text arrives.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from clawgym_env.policy.chat_format import render_prompt_ids
from clawgym_env.proxy.dialect_common import JOIN, json_object, new_id, split_output, sse
from clawgym_env.proxy.live import Kind, LiveStart, rest
from clawgym_env.proxy.requests_anthropic import (
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
from clawgym_env.proxy.requests_base import bad, validate_body
from clawgym_env.proxy.sessions import TurnRequest, TurnResult

_PLACEHOLDERS = {"image": "[image]", "document": "[document]"}
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


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


def _user(content: UserContent, out: list[dict[str, Any]], refs: set[str]) -> None:
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


def _assistant(content: AssistantContent) -> dict[str, Any]:
    texts, thoughts, calls = [], [], []
    for block in [TextBlock(text=content)] if isinstance(content, str) else content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
    msg: dict[str, Any] = {"role": "assistant", "content": JOIN.join(texts)}
    if any(thoughts):
        msg["reasoning_content"] = JOIN.join(t for t in thoughts if t)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _system_text(content: SystemContent) -> str:
    return content if isinstance(content, str) else JOIN.join(block.text for block in content)


def _messages(conv: Conversation, refs: set[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
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


def _tools(conv: Conversation, refs: set[str]) -> list[dict[str, Any]]:
    out = []
    for tool in conv.tools or []:
        if not isinstance(tool, CustomTool):
            continue  # a server tool (web search, code execution...): nothing the template can offer
        if tool.defer_loading and tool.name not in refs:
            continue
        fn: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            fn["description"] = tool.description
        fn["parameters"] = tool.input_schema
        out.append({"type": "function", "function": fn})
    return out


def _offered(conv: Conversation, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    choice = conv.tool_choice
    if choice is None:
        return tools
    if choice.type == "none":
        return []
    if choice.type == "tool" and choice.name not in {t["function"]["name"] for t in tools}:
        raise bad(f"'tool_choice.name' names {choice.name!r}, which is not among 'tools'", "tool_choice.name")
    return tools


def _conversation(conv: Conversation) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool | None]:
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
                       model=req.model, enable_thinking=thinking, tool_id_prefix="toolu_")


def count_tokens(body: Any, tokenizer: Any) -> dict[str, int]:
    """``{"input_tokens": N}``: the length of the prompt the template renders for this body."""
    messages, tools, thinking = _conversation(validate_body(Conversation, body))
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
    blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
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
        yield _block_start(index, block)
        for delta in deltas:
            yield _block_delta(index, delta)
        yield _block_stop(index)
    yield from _end(res)


_EMPTY: dict[str, dict[str, Any]] = {"thinking": {"thinking": "", "signature": ""}, "text": {"text": ""},
                                     "tool_use": {"input": {}}}


def _block_start(index: int, block: dict[str, Any]) -> str:
    head = {k: v for k, v in block.items() if k in ("type", "id", "name")}
    return sse("content_block_start", {"type": "content_block_start", "index": index,
                                       "content_block": {**head, **_EMPTY[block["type"]]}})


def _block_delta(index: int, delta: dict[str, Any]) -> str:
    return sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _block_stop(index: int) -> str:
    return sse("content_block_stop", {"type": "content_block_stop", "index": index})


def _end(res: TurnResult) -> Iterator[str]:
    reason, seq = _stop(res)
    yield sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                                "usage": _usage(res)})
    yield sse("message_stop", {"type": "message_stop"})


class MessagesLive:
    """Live writer of one Messages request (see :mod:`~clawgym_env.proxy.live`): the events
    :func:`stream_response` sends, the thinking and text blocks opened as the policy's text arrives."""

    def __init__(self, req: TurnRequest, model: str, start: LiveStart) -> None:
        usage = {"input_tokens": start.prompt_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        self.start: dict[str, Any] = {"id": new_id("msg_"), "type": "message", "role": "assistant",
                                      "model": req.model or model, "content": [], "stop_reason": None,
                                      "stop_sequence": None, "usage": usage}
        self.index = -1
        self.streamed: list[str] = []  # block types opened live, in order
        self.open: str | None = None  # the live block still open
        self.thinking = ""  # the thinking text sent so far

    def tick(self) -> str:
        """A ``ping`` event (as :class:`MessagesKeepAlive`)."""
        return sse("ping", {"type": "ping"})

    def head(self) -> str:
        """``message_start`` and a ``ping``."""
        return sse("message_start", {"type": "message_start", "message": self.start}) + self.tick()

    def _open(self, kind: str) -> str:
        self.index += 1
        self.open = kind
        self.streamed.append(kind)
        return _block_start(self.index, {"type": kind})

    def _close(self, thinking: str | None = None) -> str:
        out = ""
        if self.open == "thinking":
            sig = signature(self.thinking if thinking is None else thinking)
            out += _block_delta(self.index, {"type": "signature_delta", "signature": sig})
        self.open = None
        return out + _block_stop(self.index)

    def delta(self, kind: Kind, text: str) -> str:
        """A thinking or text delta, opening (and closing the thinking) block as needed."""
        out = ""
        if kind == "reasoning":
            if self.open is None and not self.streamed:
                out += self._open("thinking")
            if self.open != "thinking":
                return out
            self.thinking += text
            return out + _block_delta(self.index, {"type": "thinking_delta", "thinking": text})
        if self.open == "thinking":
            out += self._close()
        if self.open is None:
            out += self._open("text")
        return out + _block_delta(self.index, {"type": "text_delta", "text": text})

    def finish(self, res: TurnResult, sent: dict[Kind, str]) -> Iterator[str]:
        """The rest of the live blocks, the blocks not streamed (tool uses), then :func:`stream_response`'s end."""
        out = split_output(res)
        for block, deltas in _blocks_out(res):
            kind = block["type"]
            if kind in self.streamed:
                if self.open == kind:
                    final = out.reasoning if kind == "thinking" else out.content
                    text = rest(sent["reasoning" if kind == "thinking" else "content"], final, kind)
                    if text:
                        key = "thinking" if kind == "thinking" else "text"
                        yield _block_delta(self.index, {"type": f"{key}_delta", key: text})
                    yield self._close(final)
                continue
            if self.open is not None:
                yield self._close()
            self.index += 1
            yield _block_start(self.index, block)
            for delta in deltas:
                yield _block_delta(self.index, delta)
            yield _block_stop(self.index)
        if self.open is not None:
            yield self._close()
        yield from _end(res)

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """``event: error`` with :func:`error_body` (as :class:`MessagesKeepAlive`)."""
        return sse("error", error_body(status, message, field, code))


def live(req: TurnRequest, body: Any, model: str, start: LiveStart) -> MessagesLive:
    """The live writer of a streaming Messages request."""
    return MessagesLive(req, model, start)


class MessagesKeepAlive:
    """Keep-alive stream of one Messages request (see :mod:`~clawgym_env.proxy.keepalive`)."""

    def __init__(self, model: str) -> None:
        self.model = model

    def tick(self) -> str:
        """The API's own ``ping`` event."""
        return sse("ping", {"type": "ping"})

    def answer(self, res: TurnResult) -> Iterator[str]:
        """The events :func:`stream_response` sends."""
        return stream_response(res, self.model)

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """``event: error`` with :func:`error_body`."""
        return sse("error", error_body(status, message, field, code))


def keepalive(req: TurnRequest, body: Any, model: str) -> MessagesKeepAlive:
    """The keep-alive stream of a streaming Messages request."""
    return MessagesKeepAlive(model)


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> dict[str, Any]:
    """Anthropic's error envelope ``{"type": "error", "error": {"type", "message"}}``."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": new_id("req_")}

