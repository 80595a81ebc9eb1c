"""Bounds that keep one request from taking the proxy down: body size and read time, JSON depth, prompt size.

Invariants:
  * :func:`read_body` never holds more than ``max_bytes`` (+ one chunk) of a body, and never waits more
    than ``read_timeout_s`` for the next chunk; a client that goes away mid-body raises
    :class:`ClientGone` (logged as a disconnect, never as a crash). Each chunk is charged (``charge``,
    :meth:`~clawgym_env.proxy.guards.bounds.Ticket.charge`) before it is kept.
  * :func:`json_values_bound` is an upper bound on the JSON values (and object keys) a body can parse to,
    counted on its bytes without parsing: every value but the outermost follows a ``:`` or is an array
    element (at most one more than its array's commas), and every key precedes a ``:``.
  * :func:`parse_json` returns a value at most ``max_depth`` containers deep, or raises
    :class:`ProxyError` (400, ``field="body"``); it never lets ``RecursionError`` escape, so nothing
    later (validation, records, serialisation) meets an unbounded nesting. Every string it returns is
    valid Unicode: a lone UTF-16 surrogate escape (``"\\udfff"``, which JSON allows and JavaScript
    harnesses emit when they cut a string mid-emoji) becomes U+FFFD, so answers and records can
    always be encoded as UTF-8.
  * :func:`check_prompt_size` runs *before* the chat template and the tokenizer: a prompt whose text is
    longer than ``max_prompt_chars`` is refused (400, code ``context_length_exceeded``, naming both
    the limit and the token context it is derived from), so tokenising is bounded too.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from starlette.requests import Request

from clawgym_env.errors import ProxyError

#: Prompt characters allowed per token of context: generous (Qwen3 averages ~4 characters per token on
#: English and code), so no prompt that fits the context is refused, while a 50 MB prompt is never
#: handed to the tokenizer.
CHARS_PER_TOKEN_BOUND = 16
DEFAULT_MAX_JSON_DEPTH = 64


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


async def read_body(request: Request, max_bytes: int, read_timeout_s: float,
                    charge: Callable[[int], None] | None = None) -> bytearray:
    """The whole body, bounded in size and in the wait for each chunk, each chunk charged (module invariants)."""
    raw = bytearray()
    while True:
        try:
            message = await asyncio.wait_for(request.receive(), timeout=read_timeout_s)
        except asyncio.TimeoutError:
            raise ProxyError(f"the request body stalled: no data for {read_timeout_s:g}s (the per-read "
                             "timeout); send the whole body promptly", status=408, field="body",
                             code="request_timeout") from None
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        if len(raw) + len(chunk) > max_bytes:
            raise ProxyError(f"the request body is larger than the limit of {max_bytes} bytes "
                             "(max_body_bytes)", status=413, field="body", code="request_too_large")
        if charge is not None and chunk:
            charge(len(chunk))
        raw += chunk
        if not message.get("more_body", False):
            return raw  # not copied: a body near the limit is held once


def json_values_bound(raw: bytes | bytearray) -> int:
    """At least the number of JSON values plus object keys ``raw`` parses to (see the module invariants);
    C-speed byte counts, no parsing and no copy."""
    return 1 + raw.count(b"[") + raw.count(b",") + 2 * raw.count(b":")


def json_depth_exceeds(value: Any, max_depth: int) -> bool:
    """True when ``value`` nests dicts/lists deeper than ``max_depth`` (iterative, no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        obj, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(obj, dict):
            children = obj.values()
        elif isinstance(obj, list):
            children = obj
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _clean(text: str) -> str:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def replace_lone_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys included) replaced by U+FFFD (iterative)."""
    if isinstance(value, str):
        return _clean(value)
    stack = [value]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            for k in list(obj):
                v = obj.pop(k)
                obj[_clean(k) if isinstance(k, str) else k] = _clean(v) if isinstance(v, str) else v
                if isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                if isinstance(v, str):
                    obj[i] = _clean(v)
                elif isinstance(v, (dict, list)):
                    stack.append(v)
    return value


def parse_json(raw: bytes | bytearray, max_depth: int) -> Any:
    """Parse a request body (NaN/Infinity refused) bounded in nesting depth (see the module invariants)."""
    if not raw or raw.isspace():
        raise ProxyError("the request body is empty; send a JSON object", field="body")

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        value = json.loads(raw, parse_constant=no_constants)
    except RecursionError:
        value = None
        deep = True
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProxyError(f"the request body is not valid JSON: {exc}", field="body") from None
    else:
        deep = json_depth_exceeds(value, max_depth)
    if deep:
        raise ProxyError(f"the request body nests JSON deeper than the limit of {max_depth} levels",
                         field="body", code="json_too_deep")
    if _SURROGATE_ESCAPE.search(raw):
        value = replace_lone_surrogates(value)
    return value


def text_chars(value: Any) -> int:
    """Total length of every string (keys included) inside a JSON-like value (iterative)."""
    total, stack = 0, [value]
    while stack:
        obj = stack.pop()
        if isinstance(obj, str):
            total += len(obj)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                total += len(k) if isinstance(k, str) else 0
                stack.append(v)
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total


def check_prompt_size(messages: Any, tools: Any, max_prompt_chars: int, max_context: int) -> None:
    """Refuse a prompt too long to fit the context, before it is rendered or tokenised."""
    size = text_chars(messages) + text_chars(tools)
    if size > max_prompt_chars:
        raise ProxyError(f"the prompt is {size} characters, over the limit of {max_prompt_chars} characters "
                         f"({CHARS_PER_TOKEN_BOUND} per token of the maximum context of {max_context} tokens); "
                         "shorten the conversation", field="messages", code="context_length_exceeded")
