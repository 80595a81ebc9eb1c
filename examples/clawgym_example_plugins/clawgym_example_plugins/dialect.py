"""The ``example-turns`` wire dialect: a small JSON chat API of our own, served by the proxy with no engine edit.

A request (``POST /ep/<token>/example/v1/turn``; the harness's base URL without ``/v1``, then this path)::

    {"model": "m", "max_tokens": 256, "temperature": 1.0, "stream": false,
     "tools": [{"name": "shell", "about": "...", "params": {JSON schema}}],
     "turns": [{"from": "system", "text": "..."}, {"from": "user", "text": "..."},
               {"from": "agent", "text": null, "calls": [{"id": "call_1", "tool": "shell", "args": "{...}"}]},
               {"from": "tool", "call_id": "call_1", "text": "..."}]}

The answer: ``{"turn": {"from": "agent", "text": ..., "calls": [...]}, "stop": "stop" | "length" | "tool_calls",
"usage": {"in": prompt tokens, "out": sampled tokens}}``; with ``"stream": true`` the same object as one
server-sent event, then ``data: [DONE]`` (keep-alives before it are SSE comments). A side route
``POST /ep/<token>/example/v1/count`` answers ``{"tokens": n}`` (the text of the turns, tokenised; no model call,
no record). Errors: ``{"error": {"status", "message", "field"}}``.

Invariants: a call's ``args`` is the JSON text exactly as the model wrote it, and the agent sends it back
unchanged, so a conversation's history re-renders to the ids the policy produced (token-exact calls); every
malformed body is a 400 naming the field (a :class:`ProxyError`), never anything else; ``turns`` is the history
field (the harness re-sends it on every call).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawgym_env.errors import ProxyError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.dialects.contract import DialectSpec, Route
from clawgym_env.proxy.sessions import TurnRequest, TurnResult

DIALECT = DialectSpec(routes=(Route("/example/v1/turn"), Route("/example/v1/count", side="count_tokens")),
                      history_key="turns")
"""The turn route and the token-count side route; the conversation is ``turns``."""


class Tool(BaseModel):
    """One offered tool."""

    name: str = Field(min_length=1)
    about: str = ""
    params: JSONObject = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Call(BaseModel):
    """One tool call of an agent turn; ``args`` is JSON text."""

    id: str = Field(min_length=1)
    tool: str = Field(min_length=1)
    args: str = "{}"


class Turn(BaseModel):
    """One turn of the conversation."""

    model_config = ConfigDict(populate_by_name=True)
    speaker: Literal["system", "user", "agent", "tool"] = Field(alias="from")
    text: str | None = None
    calls: list[Call] = Field(default_factory=list)
    call_id: str | None = None
    """the call a ``tool`` turn answers"""


class Body(BaseModel):
    """A request body (unknown fields are ignored)."""

    model: str | None = None
    turns: list[Turn] = Field(min_length=1)
    tools: list[Tool] = Field(default_factory=list)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    stream: bool = False


def _message(turn: Turn) -> JSONObject:
    """A turn as the OpenAI-chat-shaped message the proxy's pipeline reads."""
    if turn.speaker == "tool":
        if not turn.call_id:
            raise ProxyError("a 'tool' turn needs the 'call_id' of the call it answers", field="turns.call_id")
        return {"role": "tool", "tool_call_id": turn.call_id, "content": turn.text or ""}
    role = {"system": "system", "user": "user", "agent": "assistant"}[turn.speaker]
    message: JSONObject = {"role": role, "content": turn.text}
    if turn.calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.tool, "arguments": c.args}}
                                 for c in turn.calls]
    return message


def parse_request(body: Any) -> TurnRequest:
    """Validate a body and map it (module docstring); a malformed one is a :class:`ProxyError` naming the field."""
    try:
        req = Body.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise ProxyError(f"{field}: {first['msg']}", field=field) from None
    tools = [{"type": "function", "function": {"name": t.name, "description": t.about, "parameters": t.params}}
             for t in req.tools]
    return TurnRequest(messages=[_message(t) for t in req.turns], tools=tools, max_tokens=req.max_tokens,
                       temperature=req.temperature, stream=req.stream, model=req.model, source=req)


def _turn(message: JSONObject) -> JSONObject:
    """The assistant message the pipeline produced, as an ``agent`` turn."""
    calls = [{"id": c.get("id"), "tool": c.get("function", {}).get("name"),
              "args": c.get("function", {}).get("arguments") or "{}"} for c in message.get("tool_calls") or []]
    return {"from": "agent", "text": message.get("content"), "calls": calls}


def render_response(res: TurnResult, model: str) -> JSONObject:
    """The answer object of a finished turn."""
    return {"model": res.request.model or model, "turn": _turn(res.message), "stop": res.finish_reason,
            "usage": {"in": res.prompt_tokens, "out": res.completion_tokens}}


def stream_response(res: TurnResult, model: str) -> Iterator[str]:
    """The streamed answer: the whole answer object as one event, then ``[DONE]``."""
    yield f"data: {json.dumps(render_response(res, model), ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"


def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> JSONObject:
    """This dialect's error envelope."""
    return {"error": {"status": status, "message": message, "field": field}}


class KeepAlive:
    """Keep-alives of one streaming answer: SSE comments, which clients skip, then the answer."""

    def __init__(self, model: str) -> None:
        self.model = model

    def tick(self) -> str:
        """One keep-alive (an SSE comment)."""
        return ": keep-alive\n\n"

    def answer(self, res: TurnResult) -> Iterator[str]:
        """The answer's events."""
        return stream_response(res, self.model)

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """The in-stream error event."""
        return f"data: {json.dumps(error_body(status, message, field, code))}\n\n"


def keepalive(req: TurnRequest, body: Any, model: str) -> KeepAlive:
    """The keep-alive stream of one streaming request."""
    return KeepAlive(req.model or model)


def count_tokens(body: Any, tokenizer: Any) -> JSONObject:
    """Side route: the tokens of the turns' text (no model call, no record)."""
    req = parse_request(body).source
    text = "\n".join(t.text or "" for t in req.turns)
    return {"tokens": len(tokenizer.encode(text, add_special_tokens=False))}
