"""The wire side of the passthrough policy: request shapes for the upstream APIs and their answers read back.

:class:`Answer` is what the capture reads of an upstream reply (content, reasoning, tool calls, finish),
whichever way it came: an SDK object (:func:`openai_answer`, :func:`anthropic_answer`), an SDK stream
(:func:`openai_stream`, :func:`anthropic_stream`), or the raw JSON body or server-sent events of an OpenAI
Chat Completions reply (:func:`openai_json_answer`, :func:`openai_raw_stream`), which the policy reads through
the SDK's own ``post`` (its retries, auth and error types) without building typed models for every reply
and chunk; likewise the raw events of an Anthropic Messages stream (:func:`anthropic_raw_stream`). Each pair
reads the same fields alike, so a reply is captured the same whichever way it came.

Invariants of the stream readers (the bounds: :mod:`~clawgym_env.policy.passthrough.bounds`):
  * a stream that ends before its end — OpenAI: ``data: [DONE]`` (a reader that cannot see it, the SDK's own
    iterator: a ``finish_reason``); Anthropic: ``message_stop`` (through the SDK's helper: a
    ``stop_reason``) — is a :class:`PolicyError`, never a complete answer;
  * with ``bounds``, an answer whose text passes ``bounds.max_chars`` is ended there (``finish="length"``)
    and the rest of the stream is not read;
  * with ``watch``, every data event (not a keep-alive: an OpenAI chunk without choices, an Anthropic
    ``ping``) is reported to it (:meth:`~clawgym_env.policy.passthrough.bounds.SilenceWatch.progress`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from clawgym_env.errors import PolicyError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.base import TextDelta
from clawgym_env.policy.passthrough.bounds import SilenceWatch, StreamBounds, TextBudget


def _budget(bounds: StreamBounds | None) -> TextBudget:
    return TextBudget(bounds.max_chars if bounds is not None else 1 << 62)


def _progress(watch: SilenceWatch | None) -> None:
    if watch is not None:
        watch.progress()


def _cut(model: str, end: str) -> PolicyError:
    return PolicyError(f"upstream {model!r} ended its stream without {end}: the answer was cut short (a dropped "
                       "connection or a misbehaving upstream); it is not recorded as complete")


def tool_arguments(arguments: Any) -> JSONObject | str:
    """Tool-call arguments as an object when they are valid JSON (canonical rendering), else as given."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return str(arguments)
    return value if isinstance(value, dict) else str(arguments)


def openai_messages(messages: list[JSONObject]) -> list[JSONObject]:
    """Normalised chat messages → the Chat Completions request shape (only the fields it accepts)."""
    out = []
    for m in messages:
        role = m.get("role")
        msg: JSONObject = {"role": role, "content": m.get("content") or ""}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [{"id": tc.get("id") or f"call_{i}", "type": "function",
                                  "function": {"name": tc["function"]["name"],
                                               "arguments": tc["function"].get("arguments") or "{}"}}
                                 for i, tc in enumerate(m["tool_calls"])]
            if not msg["content"]:
                msg["content"] = None
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id") or ""
        out.append(msg)
    return out


def anthropic_request(messages: list[JSONObject], tools: list[JSONObject]) -> tuple[str, list, list]:
    """Normalised chat messages and function tools → (system, messages, tools) for the Messages API.

    System messages join into ``system``; tool results become ``tool_result`` blocks of a user turn;
    consecutive turns of one role merge (the API wants them alternating).
    """
    system: list[str] = []
    out: list[JSONObject] = []

    def add(role: str, blocks: list[JSONObject]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": list(blocks)})

    for m in messages:
        role, text = m.get("role"), m.get("content") or ""
        if role == "system":
            system.append(text)
        elif role == "assistant":
            blocks: list[JSONObject] = [{"type": "text", "text": text}] if text.strip() else []
            for i, tc in enumerate(m.get("tool_calls") or []):
                args = tool_arguments(tc["function"].get("arguments"))
                blocks.append({"type": "tool_use", "id": tc.get("id") or f"toolu_{len(out)}_{i}",
                               "name": tc["function"]["name"], "input": args if isinstance(args, dict) else {}})
            add("assistant", blocks)
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m.get("tool_call_id") or "", "content": text}])
        elif text:
            add("user", [{"type": "text", "text": text}])
    specs = []
    for t in tools:
        fn = t.get("function", t)
        specs.append({"name": fn["name"], "description": fn.get("description") or "",
                      "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}})
    return "\n\n".join(s for s in system if s), out, specs


@dataclasses.dataclass
class Answer:
    """The upstream's answer as the capture reads it (filled in by a stream as it ends)."""

    content: str = ""
    reasoning: str | None = None
    calls: list[tuple[str, JSONObject | str]] = dataclasses.field(default_factory=list)
    finish: str = "stop"


def reasoning_of(obj: Any) -> str | None:
    """The reasoning text an SDK object carries beyond the API's fields (``reasoning_content`` or ``reasoning``)."""
    extra = getattr(obj, "model_extra", None) or {}
    value = extra.get("reasoning_content") or extra.get("reasoning") or None
    return value if isinstance(value, str) else None


def openai_answer(resp: Any, model: str) -> Answer:
    """The answer of a Chat Completions reply (the SDK's model): its first choice."""
    if not resp.choices:
        raise PolicyError(f"upstream {model!r} returned no choices")
    choice = resp.choices[0]
    msg = choice.message
    calls = [(tc.function.name, tool_arguments(tc.function.arguments)) for tc in (msg.tool_calls or [])
             if getattr(tc, "function", None) is not None]
    return Answer(msg.content or "", reasoning_of(msg), calls, "length" if choice.finish_reason == "length" else "stop")


async def openai_stream(client: Any, kwargs: JSONObject, model: str, answer: Answer,
                        bounds: StreamBounds | None = None,
                        watch: SilenceWatch | None = None) -> AsyncIterator[TextDelta]:
    """Chat Completions streamed: yield text as it comes, then fill ``answer`` as :func:`openai_answer` would
    (the SDK's iterator hides ``[DONE]``: a stream without a ``finish_reason`` is cut)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}  # index -> [name, arguments so far]
    finish, chosen, budget = None, False, _budget(bounds)
    stream = await client.chat.completions.create(**kwargs, stream=True)
    async with stream:
        async for chunk in stream:
            if not chunk.choices:
                continue
            _progress(watch)
            choice, chosen = chunk.choices[0], True
            delta = choice.delta
            think = reasoning_of(delta)
            if think:
                reasoning.append(think)
                yield TextDelta("reasoning", think)
            if delta.content:
                content.append(delta.content)
                yield TextDelta("content", delta.content)
            for tc in delta.tool_calls or []:
                slot = calls.setdefault(tc.index, ["", ""])
                if tc.function is not None:
                    slot[0] = slot[0] or tc.function.name or ""
                    slot[1] += tc.function.arguments or ""
                    budget.take(tc.function.arguments)
            finish = choice.finish_reason or finish
            if not (budget.take(think) and budget.take(delta.content)):
                break
    if chosen and finish is None and not budget.full:
        raise _cut(model, "a finish_reason")
    _fill(answer, model, chosen, content, reasoning, calls, "length" if budget.full else finish)


def anthropic_json_answer(data: Any, model: str) -> Answer:
    """:func:`anthropic_answer` for the raw JSON body of a Messages reply."""
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise PolicyError(f"upstream {model!r} returned no message content")
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[tuple[str, JSONObject | str]] = []
    for block in data["content"]:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking":
            thinking.append(block.get("thinking") if isinstance(block.get("thinking"), str) else "")
        elif kind == "tool_use":
            args = block.get("input")
            calls.append((str(block.get("name") or ""), dict(args) if isinstance(args, dict) else {}))
    finish = "length" if data.get("stop_reason") == "max_tokens" else "stop"
    return Answer("".join(texts), "\n".join(thinking) if thinking else None, calls, finish)


def clip_answer(answer: Answer, max_chars: int) -> Answer:
    """``answer`` with its text (reasoning, then content, then tool calls) ended at ``max_chars`` characters
    and ``finish="length"`` when it was longer; else ``answer`` itself."""
    reasoning, content = answer.reasoning or "", answer.content
    if len(reasoning) + len(content) + sum(len(str(a)) for _, a in answer.calls) <= max_chars:
        return answer
    reasoning = reasoning[:max_chars]
    content = content[:max_chars - len(reasoning)]
    left, calls = max_chars - len(reasoning) - len(content), []
    for name, args in answer.calls:
        left -= len(str(args))
        if left < 0:
            break
        calls.append((name, args))
    return Answer(content, reasoning if answer.reasoning is not None else None, calls, "length")


def anthropic_answer(resp: Any) -> Answer:
    """The answer of a Messages reply (the SDK's model): text, thinking and tool-use blocks in order."""
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[tuple[str, JSONObject | str]] = []
    for block in resp.content:
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(block.text)
        elif kind == "thinking":
            thinking.append(getattr(block, "thinking", ""))
        elif kind == "tool_use":
            calls.append((block.name, dict(block.input or {})))
    finish = "length" if resp.stop_reason == "max_tokens" else "stop"
    return Answer("".join(texts), "\n".join(thinking) if thinking else None, calls, finish)


async def anthropic_stream(client: Any, kwargs: JSONObject, answer: Answer, bounds: StreamBounds | None = None,
                           watch: SilenceWatch | None = None) -> AsyncIterator[TextDelta]:
    """Messages streamed (the SDK's stream helper, for clients other than the SDK's own): yield text as it comes,
    then fill ``answer`` from the final message exactly as :func:`anthropic_answer` reads a non-streamed one."""
    budget = _budget(bounds)
    async with client.messages.stream(**kwargs) as stream:
        async for event in stream:
            _progress(watch)
            if event.type == "text" and event.text:
                yield TextDelta("content", event.text)
                budget.take(event.text)
            elif event.type == "thinking" and event.thinking:
                yield TextDelta("reasoning", event.thinking)
                budget.take(event.thinking)
            elif event.type == "input_json":
                budget.take(getattr(event, "partial_json", None))
            if budget.full:
                break
        final = stream.current_message_snapshot if budget.full else await stream.get_final_message()
    if final.stop_reason is None and not budget.full:
        raise _cut(str(kwargs.get("model")), "a stop_reason")
    done = anthropic_answer(final)
    if budget.full:
        done.finish = "length"
    for field in dataclasses.fields(done):
        setattr(answer, field.name, getattr(done, field.name))


async def anthropic_raw_stream(lines: AsyncIterator[str], model: str, answer: Answer,
                               bounds: StreamBounds | None = None,
                               watch: SilenceWatch | None = None) -> AsyncIterator[TextDelta]:
    """:func:`anthropic_stream` over the raw server-sent event lines of a streamed Messages reply (the path of
    the SDK's own client): the same answer, read without the SDK's per-event models."""
    blocks: dict[int, JSONObject] = {}  # index -> {"type", "pieces", "name", "input"}
    started, ended, stop_reason, budget = False, False, None, _budget(bounds)
    async for data in _sse_data(lines):  # read to the end after message_stop: the connection is then reused
        event = json.loads(data)
        kind = event.get("type") if isinstance(event, dict) else None
        if kind in (None, "ping") or ended:
            continue
        _progress(watch)
        if kind == "error":
            raise PolicyError(f"upstream {model!r} sent an error in its stream: {json.dumps(event.get('error'))[:300]}")
        if kind == "message_start":
            started = True
        elif kind == "content_block_start":
            block = event.get("content_block") if isinstance(event.get("content_block"), dict) else {}
            first = block.get("text") if block.get("type") == "text" else block.get("thinking")
            blocks[_index(event)] = {"type": block.get("type"), "pieces": [first] if isinstance(first, str) else [],
                                     "name": block.get("name"), "input": block.get("input")}
        elif kind == "content_block_delta":
            slot = blocks.get(_index(event))
            delta = event.get("delta") if isinstance(event.get("delta"), dict) else {}
            piece = _delta_piece(slot, delta)
            if piece:
                assert slot is not None
                slot["pieces"].append(piece)
                if slot["type"] != "tool_use":
                    yield TextDelta("content" if slot["type"] == "text" else "reasoning", piece)
                if not budget.take(piece):
                    break
        elif kind == "message_delta":
            delta = event.get("delta") if isinstance(event.get("delta"), dict) else {}
            stop_reason = delta.get("stop_reason") or stop_reason
        elif kind == "message_stop":
            ended = True
    if not started:
        raise PolicyError(f"upstream {model!r} sent no message in its stream")
    if not ended and not budget.full:
        raise _cut(model, "message_stop")
    ordered = [blocks[i] for i in sorted(blocks)]
    thinking = ["".join(b["pieces"]) for b in ordered if b["type"] == "thinking"]
    answer.content = "".join("".join(b["pieces"]) for b in ordered if b["type"] == "text")
    answer.reasoning = "\n".join(thinking) if thinking else None
    answer.calls = [(str(b["name"] or ""), _tool_input(b)) for b in ordered if b["type"] == "tool_use"]
    answer.finish = "length" if budget.full or stop_reason == "max_tokens" else "stop"


def _index(event: JSONObject) -> int:
    index = event.get("index")
    return index if isinstance(index, int) else 0


def _delta_piece(slot: JSONObject | None, delta: JSONObject) -> str | None:
    """The text a content-block delta adds to its block (None: nothing the answer reads)."""
    if slot is None:
        return None
    key = {"text": ("text_delta", "text"), "thinking": ("thinking_delta", "thinking"),
           "tool_use": ("input_json_delta", "partial_json")}.get(slot["type"])
    if key is None or delta.get("type") != key[0]:
        return None
    piece = delta.get(key[1])
    return piece if isinstance(piece, str) else None


def _tool_input(block: JSONObject) -> JSONObject:
    """A tool_use block's input: its streamed JSON when it sent some, else the input its start carried."""
    if block["pieces"]:
        try:
            value = json.loads("".join(block["pieces"]))
        except ValueError:
            value = None
    else:
        value = block["input"]
    return dict(value) if isinstance(value, dict) else {}


def _json_reasoning(obj: JSONObject) -> str | None:
    value = obj.get("reasoning_content") or obj.get("reasoning") or None
    return value if isinstance(value, str) else None


def openai_json_answer(data: Any, model: str) -> Answer:
    """:func:`openai_answer` for the raw JSON body of a Chat Completions reply."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise PolicyError(f"upstream {model!r} returned no choices")
    choice = choices[0]
    msg = choice.get("message") or {}
    calls = [(tc["function"].get("name") or "", tool_arguments(tc["function"].get("arguments")))
             for tc in (msg.get("tool_calls") or []) if isinstance(tc.get("function"), dict)]
    return Answer(msg.get("content") or "", _json_reasoning(msg), calls,
                  "length" if choice.get("finish_reason") == "length" else "stop")


async def openai_raw_stream(lines: AsyncIterator[str], model: str, answer: Answer, bounds: StreamBounds | None = None,
                            watch: SilenceWatch | None = None) -> AsyncIterator[TextDelta]:
    """:func:`openai_stream` over the raw server-sent event lines of a streamed Chat Completions reply
    (a stream without ``data: [DONE]`` is cut)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}  # index -> [name, arguments so far]
    finish, chosen, budget = None, False, _budget(bounds)
    done = False
    async for data in _sse_data(lines):  # read to the end even after [DONE]: the connection is then reused
        if done or data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error"):
            raise PolicyError(f"upstream {model!r} sent an error in its stream: {json.dumps(chunk['error'])[:300]}")
        if not chunk.get("choices"):
            continue
        _progress(watch)
        choice, chosen = chunk["choices"][0], True
        delta = choice.get("delta") or {}
        think = _json_reasoning(delta)
        if think:
            reasoning.append(think)
            yield TextDelta("reasoning", think)
        text = delta.get("content") if isinstance(delta.get("content"), str) else None
        if text:
            content.append(text)
            yield TextDelta("content", text)
        for tc in delta.get("tool_calls") or []:
            slot = calls.setdefault(int(tc.get("index") or 0), ["", ""])
            fn = tc.get("function")
            if isinstance(fn, dict):
                slot[0] = slot[0] or fn.get("name") or ""
                slot[1] += fn.get("arguments") or ""
                budget.take(fn.get("arguments"))
        finish = choice.get("finish_reason") or finish
        if not (budget.take(think) and budget.take(text)):
            break
    if not done and not budget.full:
        raise _cut(model, "data: [DONE]")
    _fill(answer, model, chosen, content, reasoning, calls, "length" if budget.full else finish)


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The ``data`` of each server-sent event (its ``data:`` lines joined by newlines)."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])
    if data:
        yield "\n".join(data)


def _fill(answer: Answer, model: str, chosen: bool, content: Iterable[str], reasoning: list[str],
          calls: dict[int, list[str]], finish: str | None) -> None:
    """Fill ``answer`` from the pieces a stream gathered, as the non-streamed reply would read."""
    if not chosen:
        raise PolicyError(f"upstream {model!r} returned no choices")
    answer.content, answer.reasoning = "".join(content), ("".join(reasoning) if reasoning else None)
    answer.calls = [(name, tool_arguments(args)) for _, (name, args) in sorted(calls.items()) if name]
    answer.finish = "length" if finish == "length" else "stop"
