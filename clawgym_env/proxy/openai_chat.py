"""The OpenAI Chat Completions dialect: request validation, response rendering and SSE streaming.

A dialect module provides ``NAME``, ``parse_request(body) -> TurnRequest``,
``render_response(result, model) -> dict``, ``stream_response(result, model) -> Iterator[str]`` and
``error_body(status, message, field, code) -> dict``; the server routes to it (see ``server.py``).

Invariants:
  * ``parse_request`` raises :class:`ProxyError` (HTTP 400, ``field`` set, message naming the field)
    for every malformed input it can see and never anything else; unknown fields are ignored.
  * The non-streamed message and the concatenation of the streamed deltas are the same message
    (both come from one :class:`~clawgym_env.proxy.streaming.Segmentation` of the recorded ids).
  * ``usage`` counts are the lengths of the recorded prompt and output ids.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any, Iterator

from clawgym_env.errors import ProxyError
from clawgym_env.proxy.sessions import TurnRequest, TurnResult
from clawgym_env.proxy.streaming import iter_deltas

NAME = "openai_chat"
ROLES = ("system", "developer", "user", "assistant", "tool")


def _bad(message: str, field: str | None) -> ProxyError:
    return ProxyError(message, status=400, field=field)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _number(body: dict, key: str, lo: float, hi: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not _is_num(value) or not lo <= value <= hi:
        raise _bad(f"'{key}' must be a number between {lo:g} and {hi:g}, got {value!r}", key)
    return float(value)


def _pos_int(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _bad(f"'{key}' must be a positive integer, got {value!r}", key)
    return value


def _flag(obj: dict, key: str, where: str) -> bool | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise _bad(f"'{where}' must be true or false, got {value!r}", where)
    return value


def _content(value: Any, field: str) -> Any:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _bad(f"'{field}' must be a string, a list of content parts or null", field)
    for j, part in enumerate(value):
        if isinstance(part, str):
            continue
        if not isinstance(part, dict):
            raise _bad(f"'{field}[{j}]' must be a content part object", f"{field}[{j}]")
        if part.get("type") in ("text", "input_text") and not isinstance(part.get("text"), str):
            raise _bad(f"'{field}[{j}].text' must be a string", f"{field}[{j}].text")
    return value


def _tool_calls(value: Any, field: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(f"'{field}' must be a list", field)
    out = []
    for j, call in enumerate(value):
        f = f"{field}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        # an empty name is accepted: a sampled tool call may carry one, and the harness sends it back
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"'{f}.function.name' is required (a tool call is {{id, type, function: {{name, "
                       "arguments}}}})", f"{f}.function.name")
        args = fn.get("arguments")
        if args is None:
            args = "{}"
        elif isinstance(args, dict):
            args = json.dumps(args, ensure_ascii=False)
        elif not isinstance(args, str):
            raise _bad(f"'{f}.function.arguments' must be a JSON string", f"{f}.function.arguments")
        out.append({"id": call.get("id") if isinstance(call.get("id"), str) else None, "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def _messages(body: dict) -> list[dict[str, Any]]:
    msgs = body.get("messages")
    if msgs is None:
        raise _bad("'messages' is required: a list of {role, content} objects", "messages")
    if not isinstance(msgs, list):
        raise _bad(f"'messages' must be a list, got {type(msgs).__name__}", "messages")
    if not msgs:
        raise _bad("'messages' must contain at least one message", "messages")
    out = []
    for i, msg in enumerate(msgs):
        f = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise _bad(f"'{f}' must be an object with a role", f)
        role = msg.get("role")
        if role is None:
            raise _bad(f"'{f}.role' is required", f"{f}.role")
        if role not in ROLES:
            raise _bad(f"'{f}.role' must be one of {', '.join(ROLES)}; got {role!r}", f"{f}.role")
        new: dict[str, Any] = {"role": role, "content": _content(msg.get("content"), f"{f}.content")}
        if role == "tool":
            tcid = msg.get("tool_call_id")
            if not isinstance(tcid, str) or not tcid:
                raise _bad(f"'{f}.tool_call_id' is required for a tool message (a string)", f"{f}.tool_call_id")
            new["tool_call_id"] = tcid
        if role == "assistant":
            calls = _tool_calls(msg.get("tool_calls"), f"{f}.tool_calls")
            if calls:
                new["tool_calls"] = calls
            reasoning = msg.get("reasoning_content", msg.get("reasoning"))
            if reasoning is not None and not isinstance(reasoning, str):
                raise _bad(f"'{f}.reasoning_content' must be a string", f"{f}.reasoning_content")
            if reasoning:
                new["reasoning_content"] = reasoning
        out.append(new)
    return out


def _tools(body: dict) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("'tools' must be a list of {type: 'function', function: {...}} objects", "tools")
    for i, tool in enumerate(tools):
        f = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise _bad(f"'{f}' must be an object with type 'function' (other tool types are not served)", f)
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"'{f}.function.name' is required", f"{f}.function.name")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _bad(f"'{f}.function.parameters' must be a JSON schema object", f"{f}.function.parameters")
    return [dict(t, type="function") for t in tools]


def _offered_tools(body: dict, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "required"):
        return tools
    if choice == "none":
        return []
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if not isinstance(name, str):
            raise _bad("'tool_choice.function.name' is required for a named tool choice", "tool_choice.function.name")
        if tools and name not in {t["function"]["name"] for t in tools}:
            raise _bad(f"'tool_choice' names {name!r}, which is not among 'tools'", "tool_choice")
        return tools
    raise _bad("'tool_choice' must be 'none', 'auto', 'required' or {type: 'function', function: {name}}",
               "tool_choice")


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise _bad("'stop' must be a string or a list of strings", "stop")


def parse_request(body: Any) -> TurnRequest:
    """Validate a Chat Completions body (see the module invariants)."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    messages = _messages(body)
    tools = _tools(body)
    offered = _offered_tools(body, tools)
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad(f"'n' must be 1 (the proxy samples one choice per call), got {n!r}", "n")
    max_tokens = _pos_int(body, "max_tokens")
    max_completion = _pos_int(body, "max_completion_tokens")
    limits = [x for x in (max_tokens, max_completion) if x is not None]
    stream = _flag(body, "stream", "stream") or False
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    include_usage = bool(_flag(opts or {}, "include_usage", "stream_options.include_usage"))
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad(f"'seed' must be an integer, got {seed!r}", "seed")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("'model' must be a string", "model")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _bad("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    thinking = _flag(kwargs or {}, "enable_thinking", "chat_template_kwargs.enable_thinking")
    return TurnRequest(
        messages=messages, tools=offered, max_tokens=min(limits) if limits else None,
        temperature=_number(body, "temperature", 0.0, 2.0), top_p=_number(body, "top_p", 0.0, 1.0),
        stop=_stop(body), seed=seed, stream=stream, include_usage=include_usage and stream,
        want_logprobs=bool(_flag(body, "logprobs", "logprobs")), model=model, enable_thinking=thinking)


def _usage(res: TurnResult) -> dict[str, int]:
    return {"prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
            "total_tokens": res.prompt_tokens + res.completion_tokens}


def _head(res: TurnResult, model: str, obj: str) -> dict[str, Any]:
    return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": obj, "created": int(time.time()),
            "model": res.request.model or model,
            "system_fingerprint": f"clawgym-{res.record.policy_name}-v{res.record.policy_version}"}


def _logprobs(res: TurnResult) -> dict[str, Any] | None:
    if res.token_bytes is None:
        return None
    return {"content": [{"token": raw.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(raw),
                         "top_logprobs": []} for raw, lp in zip(res.token_bytes, res.logprobs)],
            "refusal": None}


def render_response(res: TurnResult, model: str) -> dict[str, Any]:
    """The ``chat.completion`` object for a finished turn."""
    return {**_head(res, model, "chat.completion"),
            "choices": [{"index": 0, "message": res.message, "logprobs": _logprobs(res),
                         "finish_reason": res.finish_reason}],
            "usage": _usage(res)}


def stream_response(res: TurnResult, model: str) -> Iterator[str]:
    """SSE lines (``data: {...}\\n\\n``) of ``chat.completion.chunk`` objects, then ``data: [DONE]``.

    Order: a role delta; reasoning/content/tool-call deltas token by token in text order (a tool
    call's first chunk carries index, id, type, name and empty arguments, later ones argument text);
    a chunk with ``finish_reason``; a usage chunk with empty choices if ``include_usage``; ``[DONE]``.
    """
    head = _head(res, model, "chat.completion.chunk")
    if res.request.include_usage:
        head["usage"] = None

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        obj = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"

    yield chunk({"role": "assistant", "content": ""})
    for d in iter_deltas(res.pieces, res.seg):
        if d.kind == "content":
            yield chunk({"content": d.text})
        elif d.kind == "reasoning":
            yield chunk({"reasoning_content": d.text})
        elif d.kind == "tool_start":
            yield chunk({"tool_calls": [{"index": d.index, "id": d.call_id, "type": "function",
                                         "function": {"name": d.name, "arguments": ""}}]})
        elif d.kind == "tool_args":
            yield chunk({"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]})
    yield chunk({}, res.finish_reason)
    if res.request.include_usage:
        yield "data: " + json.dumps({**head, "choices": [], "usage": _usage(res)}, ensure_ascii=False) + "\n\n"
    yield "data: [DONE]\n\n"


def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope ``{"error": {message, type, param, code}}``."""
    if status == 500:
        kind = "server_error"
    elif status >= 500:
        kind = "api_error"
    elif status == 401:
        kind = "authentication_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": field,
                      "code": None if code == kind else code}}


def models_body(model: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_body(model, created)]}


def model_body(model: str, created: int) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": created, "owned_by": "clawgym"}
