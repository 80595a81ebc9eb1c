"""The OpenAI Responses dialect's events (see :mod:`~clawgym_env.proxy.dialects.responses.dialect`): a finished turn
streamed whole (:func:`stream_response`), a live answer written as the policy's text arrives
(:class:`ResponsesLive`, :mod:`~clawgym_env.proxy.stream.live`) and the keep-alive stream (:class:`ResponsesKeepAlive`,
:mod:`~clawgym_env.proxy.stream.keepalive`); one response id and one ``sequence_number`` count per response.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.dialects.common import new_id, sse
from clawgym_env.proxy.dialects.responses.render import (
    encrypted,
    envelope,
    error_body,
    output_items,
    public,
    response_object,
)
from clawgym_env.proxy.sessions import TurnRequest, TurnResult
from clawgym_env.proxy.stream.live import Kind, LiveStart, rest


def _item_events(k: int, item: JSONObject) -> Iterator[JSONObject]:
    iid, kind, chunks = item["id"], item["type"], item["_chunks"]
    final = public(item)
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
    items = output_items(res)
    final = response_object(res, model, rid, created, [public(i) for i in items])
    events: list[JSONObject] = []
    if not opened:
        head = response_object(res, model, rid, created, None)
        events += [{"type": "response.created", "response": head}, {"type": "response.in_progress", "response": head}]
    for k, item in enumerate(items):
        events.extend(_item_events(k, item))
    end = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    events.append({"type": end, "response": final})
    for seq, event in enumerate(events, first_seq):
        yield sse(event["type"], {**event, "sequence_number": seq})


class ResponsesKeepAlive:
    """Keep-alive stream of one Responses request (see :mod:`~clawgym_env.proxy.stream.keepalive`): the first tick
    opens the response (``response.created``, ``response.in_progress``), later ticks repeat
    ``response.in_progress``; the answer and an error continue the same response id and sequence numbers."""

    def __init__(self, req: TurnRequest, body: JSONObject, model: str) -> None:
        self.model, self.body = model, body
        self.rid, self.created, self.seq = new_id("resp_"), int(time.time()), 0
        sampling = {"temperature": req.temperature, "top_p": req.top_p}
        self.head = envelope(body, req.model or model, sampling, self.rid, self.created, "in_progress", None, None)

    def _event(self, event: JSONObject) -> str:
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
    """Live writer of one Responses request (see :mod:`~clawgym_env.proxy.stream.live`): the events
    :func:`stream_response` sends, the reasoning and message items opened as the policy's text arrives (same
    ids to the end); response id, sequence numbers, keep-alives and errors as :class:`ResponsesKeepAlive`'s."""

    def __init__(self, req: TurnRequest, body: JSONObject, model: str) -> None:
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

    def _where(self) -> JSONObject:
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

    def _done(self, item: JSONObject) -> str:
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

    def _live_reasoning(self) -> JSONObject:
        item: JSONObject = {"id": self.ids["reasoning"], "type": "reasoning",
                                "summary": [{"type": "summary_text", "text": self.reasoning}]}
        if "reasoning.encrypted_content" in (self.ka.body.get("include") or []):
            item["encrypted_content"] = encrypted(self.reasoning)
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
        items = output_items(res)
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
                    yield self._done(public(item))
                continue
            if self.open == "reasoning":
                yield self._done(self._live_reasoning())
            elif self.open is not None:
                yield self._done({"id": self.ids["message"], "type": "message", "status": "completed",
                                  "role": "assistant", "content": [{"type": "output_text", "text": sent["content"],
                                                                    "annotations": [], "logprobs": []}]})
            for event in _item_events(k, item):
                yield self._event(event)
        final = response_object(res, self.ka.model, self.ka.rid, self.ka.created, [public(i) for i in items])
        end = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield self._event({"type": end, "response": final})


def live(req: TurnRequest, body: Any, model: str, start: LiveStart) -> ResponsesLive:
    """The live writer of a streaming Responses request."""
    return ResponsesLive(req, body if isinstance(body, dict) else {}, model)


def keepalive(req: TurnRequest, body: Any, model: str) -> ResponsesKeepAlive:
    """The keep-alive stream of a streaming Responses request."""
    return ResponsesKeepAlive(req, body if isinstance(body, dict) else {}, model)
