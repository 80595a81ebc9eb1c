"""The Gemini API dialect (``generateContent``, ``streamGenerateContent``, ``countTokens``), built on the engine's
dialect seam (:mod:`clawgym_env.proxy.dialects.contract`) as any third-party dialect is: registered by the entry
point ``clawgym.dialects: gemini``, with no table of the engine naming it.

Routes, under ``/ep/{token}`` and both API versions ``v1beta`` and ``v1`` (a client's base URL is
``/ep/{token}``): ``POST /{version}/models/{model}:generateContent``, ``:streamGenerateContent`` (answered as
``alt=sse`` server-sent events, the form the SDKs ask for) and ``:countTokens`` (a side call: not recorded).

The request is mapped onto the pipeline's OpenAI-chat shape, then rendered by the chat template:
  * ``systemInstruction`` (its text parts joined) → one leading system message (absent when empty).
  * ``user`` contents (a missing role is ``user``): text parts → one user message (joined); media parts
    (``inlineData``, ``fileData``) → ``[image]`` / ``[file]``; each ``functionResponse`` → a ``tool`` message whose
    text is ``response.output`` when that is the response's only field and a string, else the response as JSON;
    its ``tool_call_id`` is its ``id``, or (no id) the earliest unanswered call of that name.
  * ``model`` contents: ``thought`` text parts → ``reasoning_content``; other text parts → ``content``;
    ``functionCall`` parts → ``tool_calls`` (``arguments = json.dumps(args)``; ``id`` kept, or ``call_<n>`` by its
    position in the conversation when absent: stable across the calls of one conversation).
  * ``tools[].functionDeclarations`` → function tools (``parametersJsonSchema``, else ``parameters``); built-in
    tools are skipped. ``toolConfig.functionCallingConfig.mode`` ``NONE`` hides the tools.
  * ``generationConfig``: ``temperature``, ``topP``, ``maxOutputTokens``, ``stopSequences``, ``seed`` are honoured;
    ``thinkingConfig.thinkingBudget`` 0 → thinking off, ``includeThoughts`` → on; ``candidateCount`` > 1 is
    refused (one candidate is served).

The answer side (parts, chunks, errors): :mod:`.render`.
"""

from __future__ import annotations

import json
from typing import Any

from clawgym_env.errors import ProxyError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.chat_format import render_prompt_ids
from clawgym_env.proxy.dialects.contract import DialectSpec, Route
from clawgym_env.proxy.sessions import TurnRequest
from harness_adapters.gemini_cli.dialect.render import (
    GeminiKeepAlive,
    error_body,
    keepalive,
    render_response,
    stream_response,
)
from harness_adapters.gemini_cli.dialect.request import (
    Content,
    CountTokensRequest,
    GenerateContentRequest,
    Part,
    validate,
)

__all__ = ["DIALECT", "GeminiKeepAlive", "count_tokens", "error_body", "keepalive", "parse_request",
           "parse_stream_request", "render_response", "stream_response"]

DIALECT = DialectSpec(history_key="contents", routes=tuple(
    route for version in ("v1beta", "v1") for route in (
        Route(f"/{version}/models/{{model}}:generateContent"),
        Route(f"/{version}/models/{{model}}:streamGenerateContent", parse="parse_stream_request"),
        Route(f"/{version}/models/{{model}}:countTokens", side="count_tokens"))))
"""The Gemini API's routes (both versions); the conversation is ``contents``."""


def _media(part: Part) -> str:
    data = part.inline_data or part.file_data or {}
    mime = str(data.get("mimeType") or "")
    return "[image]" if mime.startswith("image/") else "[file]"


def _tool_text(response: JSONObject) -> str:
    output = response.get("output")
    if len(response) == 1 and isinstance(output, str):
        return output
    return json.dumps(response, ensure_ascii=False)


def _model_turn(content: Content, pending: list[tuple[str, str]], n_calls: int) -> tuple[JSONObject, int]:
    thoughts = [p.text for p in content.parts if p.thought and p.text]
    texts = [p.text for p in content.parts if not p.thought and p.text]
    msg: JSONObject = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    calls: list[JSONObject] = []
    for part in content.parts:
        if part.function_call is not None:
            fc = part.function_call
            cid = fc.id or f"call_{n_calls}"
            n_calls += 1
            pending.append((cid, fc.name))
            calls.append({"id": cid, "type": "function",
                          "function": {"name": fc.name, "arguments": json.dumps(fc.args, ensure_ascii=False)}})
    if calls:
        msg["tool_calls"] = calls
    return msg, n_calls


def _user_turn(content: Content, pending: list[tuple[str, str]], out: list[JSONObject]) -> None:
    text: list[str] = []

    def flush() -> None:
        if text:
            out.append({"role": "user", "content": "".join(text)})
            text.clear()

    for part in content.parts:
        if part.function_response is not None:
            flush()
            fr = part.function_response
            match = next((i for i, (cid, name) in enumerate(pending)
                          if (cid == fr.id if fr.id else name == fr.name)), None)
            cid = pending.pop(match)[0] if match is not None else (fr.id or fr.name)
            out.append({"role": "tool", "tool_call_id": cid, "content": _tool_text(fr.response)})
        elif part.text is not None:
            text.append(part.text)
        elif part.inline_data is not None or part.file_data is not None:
            text.append(_media(part))
    flush()


def _messages(system: Content | None, contents: list[Content]) -> list[JSONObject]:
    out: list[JSONObject] = []
    if system is not None:
        sys_text = "\n".join(p.text for p in system.parts if p.text)
        if sys_text:
            out.append({"role": "system", "content": sys_text})
    pending: list[tuple[str, str]] = []
    n_calls = 0
    for i, content in enumerate(contents):
        role = content.role or "user"
        if role == "model":
            msg, n_calls = _model_turn(content, pending, n_calls)
            out.append(msg)
        elif role in ("user", "function", "tool"):
            _user_turn(content, pending, out)
        else:
            raise ProxyError(f"invalid value at 'contents[{i}].role': {role!r} (expected 'user' or 'model')",
                             field=f"contents[{i}].role")
    return out


def _tools(req: GenerateContentRequest) -> list[JSONObject]:
    mode = (req.tool_config.function_calling_config.mode or "") if req.tool_config and \
        req.tool_config.function_calling_config else ""
    if mode.upper() == "NONE":
        return []
    tools: list[JSONObject] = []
    for tool in req.tools:
        for fd in tool.function_declarations:
            schema = fd.parameters_json_schema or fd.parameters or {"type": "object", "properties": {}}
            function: JSONObject = {"name": fd.name, "parameters": schema}
            if fd.description:
                function["description"] = fd.description
            tools.append({"type": "function", "function": function})
    return tools


def _thinking(req: GenerateContentRequest) -> bool | None:
    cfg = req.generation_config.thinking_config if req.generation_config else None
    if cfg is None:
        return None
    if cfg.thinking_budget == 0:
        return False
    return True if cfg.include_thoughts else None


def _parse(body: Any, stream: bool) -> TurnRequest:
    req = validate(GenerateContentRequest, body)
    assert isinstance(req, GenerateContentRequest)
    gen = req.generation_config
    if gen is not None and gen.candidate_count is not None and gen.candidate_count > 1:
        raise ProxyError("only one candidate is served: candidateCount must be 1",
                         field="generationConfig.candidateCount")
    return TurnRequest(messages=_messages(req.system_instruction, req.contents), tools=_tools(req),
                       max_tokens=gen.max_output_tokens if gen else None, temperature=gen.temperature if gen else None,
                       top_p=gen.top_p if gen else None, stop=[s for s in (gen.stop_sequences or []) if s] if gen
                       else [], seed=gen.seed if gen else None, stream=stream, enable_thinking=_thinking(req))


def parse_request(body: Any) -> TurnRequest:
    """A ``generateContent`` body, validated and mapped (see the module doc); a 400 names the bad field."""
    return _parse(body, stream=False)


def parse_stream_request(body: Any) -> TurnRequest:
    """A ``streamGenerateContent`` body: as :func:`parse_request`, answered as server-sent events."""
    return _parse(body, stream=True)


def count_tokens(body: Any, tokenizer: Any) -> JSONObject:
    """``{"totalTokens": N}``: the length of the prompt the template renders for this body."""
    req = validate(CountTokensRequest, body)
    assert isinstance(req, CountTokensRequest)
    full = req.generate_content_request
    messages = _messages(full.system_instruction, full.contents) if full else _messages(None, req.contents)
    tools = _tools(full) if full else []
    try:
        ids = render_prompt_ids(tokenizer, messages, tools or None)
    except Exception as exc:  # noqa: BLE001 - a template failure is a bad request
        raise ProxyError(f"the chat template could not render these contents: {exc}", field="contents") from exc
    return {"totalTokens": len(ids)}
