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

Response: ``output`` = a ``reasoning`` item (if the model reasoned: the whole reasoning as one
summary part, plus an opaque, reversible ``encrypted_content`` when ``include`` asks for it), a
``message`` item (present unless the turn is only tool calls), ``function_call`` items (``fc_`` id,
``call_`` call id). A turn cut by the token limit is ``status: "incomplete"``.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any, Iterator

from clawgym_env.proxy.dialect_common import (JOIN, bad, flag, model_field, name_field, new_id, number, pos_int,
                                              reasoning_tokens, split_output, sse, text_field)
from clawgym_env.proxy.openai_chat import error_body as _openai_error_body
from clawgym_env.proxy.sessions import TurnRequest, TurnResult

NAME = "openai_responses"
ROLES = ("user", "system", "developer", "assistant")
_PLACEHOLDERS = {"input_image": "[image]", "input_file": "[file]", "input_audio": "[audio]"}
_ENC = "clawgym-reasoning-v1:"  # our "encrypted" reasoning is base64 text, so it round-trips exactly
_THINK = {"none": False, "minimal": False, "low": True, "medium": True, "high": True, "xhigh": True}


def _parts_text(value: Any, field: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad(f"'{field}' must be a string or a list of content parts", field)
    parts = []
    for j, part in enumerate(value):
        f = f"{field}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append(text_field(part, "text", f"{f}.text"))
        elif kind == "refusal":
            parts.append(text_field(part, "refusal", f"{f}.refusal"))
        elif kind in _PLACEHOLDERS:
            parts.append(_PLACEHOLDERS[kind])
        else:
            raise bad(f"'{f}.type' must be input_text, output_text, refusal, input_image, input_file or "
                      f"input_audio; got {kind!r}", f"{f}.type")
    return JOIN.join(parts)


def _reasoning_text(item: dict, field: str) -> str:
    enc = item.get("encrypted_content")
    if isinstance(enc, str) and enc.startswith(_ENC):
        try:
            return base64.b64decode(enc[len(_ENC):], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            pass  # not ours after all: fall back to the readable parts
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise bad(f"'{field}.{key}' must be a list", f"{field}.{key}")
        texts = [text_field(p, "text", f"{field}.{key}[{j}].text") for j, p in enumerate(parts)
                 if isinstance(p, dict) and p.get("type", kind) == kind]
        if texts:
            return JOIN.join(texts)
    return ""


def _messages(body: dict) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    instructions = text_field(body, "instructions", "instructions", required=False)
    if instructions:
        out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if items is None:
        raise bad("'input' is required: a string or a list of input items", "input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list):
        raise bad(f"'input' must be a string or a list of items, got {type(items).__name__}", "input")
    reasoning: list[str] = []
    open_turn = False  # the last item was assistant output that a function_call may join
    for i, item in enumerate(items):
        f = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"'{f}' must be an input item object", f)
        kind = item.get("type", "message")
        if kind == "reasoning":
            text = _reasoning_text(item, f)
            if text:
                reasoning.append(text)
            open_turn = False
            continue
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise bad(f"'{f}.role' must be one of {', '.join(ROLES)}; got {role!r}", f"{f}.role")
            if "content" not in item:
                raise bad(f"'{f}.content' is required", f"{f}.content")
            msg: dict[str, Any] = {"role": role, "content": _parts_text(item["content"], f"{f}.content")}
        elif kind == "function_call":
            call_id = name_field(item, "call_id", f"{f}.call_id")
            name = text_field(item, "name", f"{f}.name")  # may be empty: a sampled call sent back
            args = text_field(item, "arguments", f"{f}.arguments")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if open_turn and not reasoning:
                out[-1].setdefault("tool_calls", []).append(call)
                continue
            msg = {"role": "assistant", "content": "", "tool_calls": [call]}
        elif kind == "function_call_output":
            call_id = name_field(item, "call_id", f"{f}.call_id")
            if "output" not in item:
                raise bad(f"'{f}.output' is required", f"{f}.output")
            msg = {"role": "tool", "tool_call_id": call_id, "content": _parts_text(item["output"], f"{f}.output")}
        elif kind in ("compaction_trigger", "compaction"):
            raise bad(f"'{f}.type' {kind!r} (server-side compaction) is not supported: this proxy keeps no "
                      "state and cannot produce or read an encrypted compaction item; configure the harness to "
                      "compact on its own side and send the conversation as message/function_call items", f"{f}.type")
        else:
            raise bad(f"'{f}.type' must be message, function_call, function_call_output or reasoning; got "
                      f"{kind!r}", f"{f}.type")
        if msg["role"] == "assistant" and reasoning:
            msg["reasoning_content"] = JOIN.join(reasoning)
        reasoning = []
        open_turn = msg["role"] == "assistant"
        out.append(msg)
    if not out:
        raise bad("'input' must contain at least one item", "input")
    return out


def _tools(body: dict) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad("'tools' must be a list of tool objects", "tools")
    out = []
    for i, tool in enumerate(tools):
        f = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise bad(f"'{f}.type' is required", f"{f}.type")
        if tool["type"] != "function":
            continue  # hosted, namespace or custom tools: nothing the template can offer
        fn: dict[str, Any] = {"name": name_field(tool, "name", f"{f}.name")}
        desc = text_field(tool, "description", f"{f}.description", required=False)
        if desc is not None:
            fn["description"] = desc
        params = tool.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"'{f}.parameters' must be a JSON schema object", f"{f}.parameters")
        if params is not None:
            fn["parameters"] = params
        out.append({"type": "function", "function": fn})
    return out


def _offered(body: dict, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "required"):
        return tools
    if choice == "none":
        return []
    if isinstance(choice, dict) and isinstance(choice.get("type"), str):
        if choice["type"] == "function":
            name = name_field(choice, "name", "tool_choice.name")
            if name not in {t["function"]["name"] for t in tools}:
                raise bad(f"'tool_choice' names {name!r}, which is not among the function 'tools'", "tool_choice")
        return tools
    raise bad("'tool_choice' must be 'none', 'auto', 'required' or a tool choice object", "tool_choice")


def _thinking(body: dict) -> bool | None:
    cfg = body.get("reasoning")
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        raise bad("'reasoning' must be an object", "reasoning")
    effort = cfg.get("effort")
    if effort is not None and effort not in _THINK:
        raise bad(f"'reasoning.effort' must be one of {', '.join(_THINK)}; got {effort!r}", "reasoning.effort")
    return None if effort is None else _THINK[effort]


def parse_request(body: Any) -> TurnRequest:
    """Validate a Responses body and map it (see the module docstring); 400 names the bad field."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None)
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise bad(f"'{key}' is not supported: this proxy stores no responses; send the whole conversation "
                      "in 'input' (store: false)", key)
    if flag(body, "background"):
        raise bad("'background' responses are not supported; use stream or a plain request", "background")
    for key in ("store", "parallel_tool_calls"):
        flag(body, key)
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(x, str) for x in include)):
        raise bad("'include' must be a list of strings", "include")
    messages = _messages(body)
    return TurnRequest(messages=messages, tools=_offered(body, _tools(body)),
                       max_tokens=pos_int(body, "max_output_tokens"),
                       temperature=number(body, "temperature", 0.0, 2.0), top_p=number(body, "top_p", 0.0, 1.0),
                       stream=bool(flag(body, "stream")), model=model_field(body), enable_thinking=_thinking(body))


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
    body, done = res.record.request, output is not None
    status = "in_progress" if not done else "incomplete" if res.finish_reason == "length" else "completed"
    usage = {"input_tokens": res.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": res.completion_tokens,
             "output_tokens_details": {"reasoning_tokens": reasoning_tokens(res)},
             "total_tokens": res.prompt_tokens + res.completion_tokens}
    reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
    return {"id": rid, "object": "response", "created_at": created, "status": status, "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "model": res.request.model or model, "output": output or [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "previous_response_id": None,
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "store": body.get("store", True), "temperature": res.record.sampling.get("temperature"),
            "text": {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "top_p": res.record.sampling.get("top_p"), "truncation": "disabled",
            "usage": usage if done else None, "metadata": body.get("metadata") or {}}


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
    rid, created = new_id("resp_"), int(time.time())
    items = _items(res)
    head = _response(res, model, rid, created, None)
    final = _response(res, model, rid, created, [_public(i) for i in items])
    events: list[dict[str, Any]] = [{"type": "response.created", "response": head},
                                    {"type": "response.in_progress", "response": head}]
    for k, item in enumerate(items):
        events.extend(_item_events(k, item))
    end = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    events.append({"type": end, "response": final})
    for seq, event in enumerate(events):
        yield sse(event["type"], {**event, "sequence_number": seq})


def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope ``{"error": {message, type, param, code}}`` (as in chat completions)."""
    return _openai_error_body(status, message, field, code)
