"""The OpenAI Responses dialect: ``POST /v1/responses`` (stateless: every call sends its whole input).

The request is mapped onto the pipeline's OpenAI-chat shape, then rendered by the Qwen3 template:
  * ``instructions`` → a leading system message; ``input`` as a string → one user message.
  * ``message`` items (role user/system/developer/assistant; content a string or parts:
    ``input_text``/``output_text`` → text, ``refusal`` → its text, ``input_image``/``input_file``/
    ``input_audio`` → ``[image]``/``[file]``/``[audio]``) → messages (developer renders as system).
  * ``function_call`` items → ``tool_calls`` (``id`` = ``call_id``, ``arguments`` verbatim) of the
    assistant message right before them, or of a new one; the item ``id`` (``fc_...``) is dropped.
  * ``function_call_output`` → a ``tool`` message (``tool_call_id`` = ``call_id``).
  * ``reasoning`` items → ``reasoning_content`` of the next assistant message (from our own
    ``encrypted_content`` if present, else ``content`` reasoning texts, else ``summary`` texts);
    reasoning not followed by assistant output is dropped. Other item types are rejected (400), among
    them ``compaction_trigger`` and ``compaction`` (server-side compaction needs server state), with a
    message that names the item and says how to avoid it.
  * tools: only ``type: "function"`` tools reach the template; hosted/namespace/custom tools (e.g.
    ``web_search``) are skipped. ``tool_choice: "none"`` hides the tools; other choices offer them
    unchanged. ``reasoning.effort`` none|minimal → ``enable_thinking=False``, low..xhigh → True, absent →
    the template default. ``store``, ``include``, ``parallel_tool_calls``, ``prompt_cache_key``,
    ``client_metadata``, ``metadata``, ``text``, ``truncation`` ... are accepted and ignored;
    ``previous_response_id``, ``conversation`` and ``background: true`` need server-side state
    this proxy does not keep (400).

Requests are validated by :mod:`~clawgym_env.proxy.requests_responses`'s models; a 400 names the field.

Response: ``output`` = a ``reasoning`` item (if the model reasoned: the whole reasoning as one
summary part, plus an opaque, reversible ``encrypted_content`` when ``include`` asks for it), a
``message`` item (present unless the turn is only tool calls), ``function_call`` items (``fc_`` id,
``call_`` call id). A turn cut by the token limit is ``status: "incomplete"``. Keep-alives
(:func:`keepalive`) are the response's own lifecycle events (``response.created``, then repeated
``response.in_progress``); an in-stream error is ``response.failed`` followed by ``error``.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Iterator
from typing import Any

from clawgym_env.proxy.dialect_common import JOIN, new_id, reasoning_tokens, split_output, sse
from clawgym_env.proxy.live import Kind, LiveStart, rest
from clawgym_env.proxy.openai_chat import error_body as _openai_error_body
from clawgym_env.proxy.requests_base import bad, validate_body
from clawgym_env.proxy.requests_responses import (
    EFFORT_THINKS,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
    RefusalPart,
    ResponsesContent,
    ResponsesRequest,
    TextPart,
)
from clawgym_env.proxy.sessions import TurnRequest, TurnResult

_PLACEHOLDERS = {"input_image": "[image]", "input_file": "[file]", "input_audio": "[audio]"}
_ENC = "clawgym-reasoning-v1:"  # our "encrypted" reasoning is base64 text, so it round-trips exactly


def _parts_text(value: ResponsesContent) -> str:
    if isinstance(value, str):
        return value
    parts = []
    for part in value:
        if isinstance(part, TextPart):
            parts.append(part.text)
        elif isinstance(part, RefusalPart):
            parts.append(part.refusal)
        else:
            parts.append(_PLACEHOLDERS[part.type])
    return JOIN.join(parts)


def _reasoning_text(item: ReasoningItem) -> str:
    enc = item.encrypted_content
    if enc is not None and enc.startswith(_ENC):
        try:
            return base64.b64decode(enc[len(_ENC):], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            pass  # not ours after all: fall back to the readable parts
    for parts in (item.content, item.summary):
        texts = [p.text for p in parts or [] if isinstance(p, TextPart)]
        if texts:
            return JOIN.join(texts)
    return ""


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    reasoning: list[str] = []
    open_turn = False  # the last item was assistant output that a function_call may join
    for item in items:
        if isinstance(item, ReasoningItem):
            text = _reasoning_text(item)
            if text:
                reasoning.append(text)
            open_turn = False
            continue
        if isinstance(item, MessageItem):
            msg: dict[str, Any] = {"role": item.role, "content": _parts_text(item.content)}
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if open_turn and not reasoning:
                out[-1].setdefault("tool_calls", []).append(call)
                continue
            msg = {"role": "assistant", "content": "", "tool_calls": [call]}
        elif isinstance(item, FunctionCallOutputItem):
            msg = {"role": "tool", "tool_call_id": item.call_id, "content": _parts_text(item.output)}
        else:  # CompactionItem never validates; this keeps the mapping total
            raise bad("server-side compaction is not supported", "input")
        if msg["role"] == "assistant" and reasoning:
            msg["reasoning_content"] = JOIN.join(reasoning)
        reasoning = []
        open_turn = msg["role"] == "assistant"
        out.append(msg)
    if not out:
        raise bad("'input' must contain at least one item", "input")
    return out


def _tools(req: ResponsesRequest) -> list[dict[str, Any]]:
    if req.tool_choice == "none":
        return []
    out = []
    for tool in req.function_tools():  # hosted, namespace or custom tools: nothing the template can offer
        fn: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            fn["description"] = tool.description
        if tool.parameters is not None:
            fn["parameters"] = tool.parameters
        out.append({"type": "function", "function": fn})
    return out


def parse_request(body: Any) -> TurnRequest:
    """Validate a Responses body and map it (see the module docstring); 400 names the bad field."""
    req = validate_body(ResponsesRequest, body)
    effort = req.reasoning.effort if req.reasoning else None
    return TurnRequest(messages=_messages(req), tools=_tools(req), max_tokens=req.max_output_tokens,
                       temperature=req.temperature, top_p=req.top_p, stream=bool(req.stream), model=req.model,
                       enable_thinking=None if effort is None else EFFORT_THINKS[effort])


def _items(res: TurnResult) -> list[dict[str, Any]]:
    """The final output items, each with a private ``_chunks`` list (stream deltas) removed on render."""
    out = split_output(res)
    body = res.record.request
    items: list[dict[str, Any]] = []
    if out.reasoning:
        item = {"id": new_id("rs_"), "type": "reasoning", "summary": [{"type": "summary_text", "text": out.reasoning}]}
        if "reasoning.encrypted_content" in (body.get("include") or []):
            item["encrypted_content"] = _ENC + base64.b64encode(out.reasoning.encode("utf-8")).decode("ascii")
        items.append({**item, "_chunks": out.reasoning_chunks})
    if out.content or not out.calls:
        status = "incomplete" if res.finish_reason == "length" else "completed"
        items.append({"id": new_id("msg_"), "type": "message", "status": status, "role": "assistant",
                      "content": [{"type": "output_text", "text": out.content, "annotations": [], "logprobs": []}],
                      "_chunks": out.content_chunks})
    for call in out.calls:
        items.append({"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call", "status": "completed",
                      "call_id": call.id, "name": call.name, "arguments": call.arguments, "_chunks": call.chunks})
    return items


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k != "_chunks"}


def _response(res: TurnResult, model: str, rid: str, created: int, output: list[dict[str, Any]] | None,
              ) -> dict[str, Any]:
    done = output is not None
    status = "in_progress" if not done else "incomplete" if res.finish_reason == "length" else "completed"
    usage = {"input_tokens": res.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": res.completion_tokens,
             "output_tokens_details": {"reasoning_tokens": reasoning_tokens(res)},
             "total_tokens": res.prompt_tokens + res.completion_tokens}
    return _envelope(res.record.request, res.request.model or model, res.record.sampling, rid, created, status,
                     usage if done else None, output)


def _envelope(body: dict[str, Any], model: str, sampling: dict[str, Any], rid: str, created: int, status: str,
              usage: dict[str, Any] | None, output: list[dict[str, Any]] | None) -> dict[str, Any]:
    asked = body.get("reasoning")
    reasoning: dict[str, Any] = asked if isinstance(asked, dict) else {}
    return {"id": rid, "object": "response", "created_at": created, "status": status, "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "model": model, "output": output or [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "previous_response_id": None,
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "store": body.get("store", True), "temperature": sampling.get("temperature"),
            "text": {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "top_p": sampling.get("top_p"), "truncation": "disabled",
            "usage": usage, "metadata": body.get("metadata") or {}}


def render_response(res: TurnResult, model: str) -> dict[str, Any]:
    """The ``response`` object for a finished turn."""
    return _response(res, model, new_id("resp_"), int(time.time()), [_public(i) for i in _items(res)])


def _item_events(k: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    iid, kind, chunks = item["id"], item["type"], item["_chunks"]
    final = _public(item)
    where = {"item_id": iid, "output_index": k}
    if kind == "reasoning":
        yield {"type": "response.output_item.added", "output_index": k, "item": {**final, "summary": []}}
        text = final["summary"][0]["text"]
        yield {"type": "response.reasoning_summary_part.added", **where, "summary_index": 0,
               "part": {"type": "summary_text", "text": ""}}
        for c in chunks:
            yield {"type": "response.reasoning_summary_text.delta", **where, "summary_index": 0, "delta": c}
        yield {"type": "response.reasoning_summary_text.done", **where, "summary_index": 0, "text": text}
        yield {"type": "response.reasoning_summary_part.done", **where, "summary_index": 0,
               "part": {"type": "summary_text", "text": text}}
    elif kind == "message":
        yield {"type": "response.output_item.added", "output_index": k,
               "item": {**final, "status": "in_progress", "content": []}}
        part = final["content"][0]
        yield {"type": "response.content_part.added", **where, "content_index": 0, "part": {**part, "text": ""}}
        for c in chunks:
            yield {"type": "response.output_text.delta", **where, "content_index": 0, "delta": c, "logprobs": []}
        yield {"type": "response.output_text.done", **where, "content_index": 0, "text": part["text"],
               "logprobs": []}
        yield {"type": "response.content_part.done", **where, "content_index": 0, "part": part}
    else:
        yield {"type": "response.output_item.added", "output_index": k,
               "item": {**final, "status": "in_progress", "arguments": ""}}
        for c in chunks:
            yield {"type": "response.function_call_arguments.delta", **where, "delta": c}
        yield {"type": "response.function_call_arguments.done", **where, "name": final["name"],
               "arguments": final["arguments"]}
    yield {"type": "response.output_item.done", "output_index": k, "item": final}


def stream_response(res: TurnResult, model: str) -> Iterator[str]:
    """SSE events: response.created, response.in_progress, per output item its added / part / delta /
    done events, then response.completed (response.incomplete when cut by the token limit).
    ``sequence_number`` counts every event from 0."""
    return _stream(res, model, new_id("resp_"), int(time.time()), opened=False, first_seq=0)


def _stream(res: TurnResult, model: str, rid: str, created: int, *, opened: bool, first_seq: int) -> Iterator[str]:
    """The events of :func:`stream_response`; ``opened``: created/in_progress were sent already."""
    items = _items(res)
    final = _response(res, model, rid, created, [_public(i) for i in items])
    events: list[dict[str, Any]] = []
    if not opened:
        head = _response(res, model, rid, created, None)
        events += [{"type": "response.created", "response": head}, {"type": "response.in_progress", "response": head}]
    for k, item in enumerate(items):
        events.extend(_item_events(k, item))
    end = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    events.append({"type": end, "response": final})
    for seq, event in enumerate(events, first_seq):
        yield sse(event["type"], {**event, "sequence_number": seq})


class ResponsesKeepAlive:
    """Keep-alive stream of one Responses request (see :mod:`~clawgym_env.proxy.keepalive`): the first tick
    opens the response (``response.created``, ``response.in_progress``), later ticks repeat
    ``response.in_progress``; the answer and an error continue the same response id and sequence numbers."""

    def __init__(self, req: TurnRequest, body: dict[str, Any], model: str) -> None:
        self.model, self.body = model, body
        self.rid, self.created, self.seq = new_id("resp_"), int(time.time()), 0
        sampling = {"temperature": req.temperature, "top_p": req.top_p}
        self.head = _envelope(body, req.model or model, sampling, self.rid, self.created, "in_progress", None, None)

    def _event(self, event: dict[str, Any]) -> str:
        text = sse(event["type"], {**event, "sequence_number": self.seq})
        self.seq += 1
        return text

    def tick(self) -> str:
        """``response.created`` + ``response.in_progress`` the first time, ``response.in_progress`` after."""
        opening = self._event({"type": "response.created", "response": self.head}) if self.seq == 0 else ""
        return opening + self._event({"type": "response.in_progress", "response": self.head})

    def answer(self, res: TurnResult) -> Iterator[str]:
        """The item events and ``response.completed`` (or ``.incomplete``) of this response."""
        return _stream(res, self.model, self.rid, self.created, opened=self.seq > 0, first_seq=self.seq)

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """``response.failed`` (the response with ``status: "failed"`` and its ``error``), then an ``error``
        event that also carries the OpenAI error envelope (the SDKs raise it as an ``APIError``)."""
        envelope = error_body(status, message, field, code)["error"]
        failed = {**self.head, "status": "failed", "error": {"code": envelope["code"] or envelope["type"],
                                                             "message": message}}
        return (self._event({"type": "response.failed", "response": failed})
                + self._event({"type": "error", "code": envelope["code"] or envelope["type"], "message": message,
                               "param": field, "error": envelope}))


class ResponsesLive:
    """Live writer of one Responses request (see :mod:`~clawgym_env.proxy.live`): the events :func:`stream_response`
    sends, the reasoning and message items opened as the policy's text arrives (same ids to the end); response
    id, sequence numbers, keep-alives and errors as :class:`ResponsesKeepAlive`'s."""

    def __init__(self, req: TurnRequest, body: dict[str, Any], model: str) -> None:
        self.ka = ResponsesKeepAlive(req, body, model)
        self._event = self.ka._event
        self.tick, self.error = self.ka.tick, self.ka.error
        self.ids: dict[str, str] = {}  # item type -> id, for the items opened live
        self.open: str | None = None
        self.k = -1  # output index of the last item opened
        self.reasoning = ""

    def head(self) -> str:
        """``response.created`` and ``response.in_progress`` (once: keep-alives may have sent them)."""
        return self.tick() if self.ka.seq == 0 else ""

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.ids[self.open or ""], "output_index": self.k}

    def _add(self, kind: str) -> str:
        self.k += 1
        self.open = kind
        self.ids[kind] = new_id("rs_" if kind == "reasoning" else "msg_")
        if kind == "reasoning":
            item = {"id": self.ids[kind], "type": "reasoning", "summary": []}
            return (self._event({"type": "response.output_item.added", "output_index": self.k, "item": item})
                    + self._event({"type": "response.reasoning_summary_part.added", **self._where(),
                                   "summary_index": 0, "part": {"type": "summary_text", "text": ""}}))
        item = {"id": self.ids[kind], "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return (self._event({"type": "response.output_item.added", "output_index": self.k, "item": item})
                + self._event({"type": "response.content_part.added", **self._where(), "content_index": 0,
                               "part": part}))

    def _text(self, text: str) -> str:
        if self.open == "reasoning":
            self.reasoning += text
            return self._event({"type": "response.reasoning_summary_text.delta", **self._where(),
                                "summary_index": 0, "delta": text})
        return self._event({"type": "response.output_text.delta", **self._where(), "content_index": 0,
                            "delta": text, "logprobs": []})

    def _done(self, item: dict[str, Any]) -> str:
        """The events that close the open item, ``item`` being its final form."""
        where, out = self._where(), ""
        if self.open == "reasoning":
            text = item["summary"][0]["text"]
            out += self._event({"type": "response.reasoning_summary_text.done", **where, "summary_index": 0,
                                "text": text})
            out += self._event({"type": "response.reasoning_summary_part.done", **where, "summary_index": 0,
                                "part": {"type": "summary_text", "text": text}})
        else:
            part = item["content"][0]
            out += self._event({"type": "response.output_text.done", **where, "content_index": 0,
                                "text": part["text"], "logprobs": []})
            out += self._event({"type": "response.content_part.done", **where, "content_index": 0, "part": part})
        self.open = None
        return out + self._event({"type": "response.output_item.done", "output_index": self.k, "item": item})

    def _live_reasoning(self) -> dict[str, Any]:
        item: dict[str, Any] = {"id": self.ids["reasoning"], "type": "reasoning",
                                "summary": [{"type": "summary_text", "text": self.reasoning}]}
        if "reasoning.encrypted_content" in (self.ka.body.get("include") or []):
            item["encrypted_content"] = _ENC + base64.b64encode(self.reasoning.encode("utf-8")).decode("ascii")
        return item

    def delta(self, kind: Kind, text: str) -> str:
        """A reasoning-summary or output-text delta, opening (and closing the reasoning) item as needed."""
        out = ""
        if kind == "reasoning":
            if self.open is None and not self.ids:
                out += self._add("reasoning")
            return out + (self._text(text) if self.open == "reasoning" else "")
        if self.open == "reasoning":
            out += self._done(self._live_reasoning())
        if self.open is None:
            out += self._add("message")
        return out + self._text(text)

    def finish(self, res: TurnResult, sent: dict[Kind, str]) -> Iterator[str]:
        """The rest of the live items, the items not streamed (function calls), then ``response.completed``."""
        items = _items(res)
        for item in items:
            kind = item["type"]
            if kind in self.ids:
                item["id"] = self.ids[kind]
        for k, item in enumerate(items):
            kind = item["type"]
            if kind in self.ids:
                if self.open == kind:
                    final = item["summary"][0]["text"] if kind == "reasoning" else item["content"][0]["text"]
                    text = rest(sent["reasoning" if kind == "reasoning" else "content"], final, kind)
                    if text:
                        yield self._text(text)
                    yield self._done(_public(item))
                continue
            if self.open == "reasoning":
                yield self._done(self._live_reasoning())
            elif self.open is not None:
                yield self._done({"id": self.ids["message"], "type": "message", "status": "completed",
                                  "role": "assistant", "content": [{"type": "output_text", "text": sent["content"],
                                                                    "annotations": [], "logprobs": []}]})
            for event in _item_events(k, item):
                yield self._event(event)
        final = _response(res, self.ka.model, self.ka.rid, self.ka.created, [_public(i) for i in items])
        end = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield self._event({"type": end, "response": final})


def live(req: TurnRequest, body: Any, model: str, start: LiveStart) -> ResponsesLive:
    """The live writer of a streaming Responses request."""
    return ResponsesLive(req, body if isinstance(body, dict) else {}, model)


def keepalive(req: TurnRequest, body: Any, model: str) -> ResponsesKeepAlive:
    """The keep-alive stream of a streaming Responses request."""
    return ResponsesKeepAlive(req, body if isinstance(body, dict) else {}, model)


def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope ``{"error": {message, type, param, code}}`` (as in chat completions)."""
    return _openai_error_body(status, message, field, code)
