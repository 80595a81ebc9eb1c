"""Qwen3 chat format: messages+tools → prompt token ids, and sampled text → assistant message.

The prompt is rendered by the tokenizer's own chat template (Qwen3's: tools in the system turn,
``<tool_call>`` JSON, ``<think>`` reasoning). Generated text is parsed back into the API's
structures by :func:`segment`, the one parser of assistant text: :func:`parse_assistant` reads its
result as a message and the proxy streams from its spans (``clawgym_env.proxy.deltas``), so a streamed
and a non-streamed answer cannot disagree. :func:`assistant_text` writes an assistant turn exactly as the
model would emit it, so a scripted policy's tokens look like a model's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from clawgym_env.jsontypes import JSONObject

if TYPE_CHECKING:
    from clawgym_env.policy.hf import Tokenizer

IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
_TAILS = (IM_END, END_OF_TEXT)  # either end-of-turn token may close a sample
_THINK_RE = re.compile(r"^\s*(?:<think>)?(.*?)</think>\s*", re.S)
_TOOL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def content_to_text(content: Any) -> str:
    """Flatten OpenAI/Anthropic-style multi-part content into the template's plain string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                if kind in ("text", "input_text", "output_text"):
                    parts.append(str(part.get("text", "")))
                elif kind in ("image_url", "image", "input_image"):
                    parts.append("[image]")
                elif "text" in part:
                    parts.append(str(part["text"]))
        return "".join(parts)
    return str(content)


def normalize_messages(messages: Iterable[JSONObject]) -> list[JSONObject]:
    """OpenAI-chat messages → the shape Qwen3's template expects (string contents, function calls)."""
    out: list[JSONObject] = []
    for msg in messages:
        role = msg.get("role")
        if role == "developer":
            role = "system"
        new: JSONObject = {"role": role, "content": content_to_text(msg.get("content"))}
        if role == "assistant":
            if msg.get("reasoning_content"):
                new["reasoning_content"] = msg["reasoning_content"]
            calls = []
            for tc in msg.get("tool_calls") or []:
                fn = tc.get("function", tc)
                calls.append({"type": "function", "id": tc.get("id"),
                              "function": {"name": fn.get("name"), "arguments": fn.get("arguments", "{}")}})
            if calls:
                new["tool_calls"] = calls
        if role == "tool" and msg.get("tool_call_id"):
            new["tool_call_id"] = msg["tool_call_id"]
        out.append(new)
    return out


def render_prompt_text(tokenizer: Tokenizer, messages: list[JSONObject], tools: list[JSONObject] | None = None,
                       enable_thinking: bool | None = None) -> str:
    """The prompt text the tokenizer's chat template renders, ending with the assistant generation prompt."""
    kwargs: dict[str, bool] = {}  # the template's own switches
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    return tokenizer.apply_chat_template(normalize_messages(messages), tools=tools or None,
                                         add_generation_prompt=True, tokenize=False, **kwargs)


def render_prompt_ids(tokenizer: Tokenizer, messages: list[JSONObject], tools: list[JSONObject] | None = None,
                      enable_thinking: bool | None = None) -> list[int]:
    """Prompt token ids for a chat request, ending with the assistant generation prompt."""
    text = render_prompt_text(tokenizer, messages, tools, enable_thinking)
    return list(tokenizer.encode(text, add_special_tokens=False))


def assistant_text(content: str = "", reasoning: str | None = None,
                   tool_calls: list[tuple[str, JSONObject | str]] | None = None) -> str:
    """The text a Qwen3 model emits after ``<|im_start|>assistant\\n``, ``<|im_end|>`` included."""
    text = ""
    if reasoning is not None:
        text += "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
    text += content
    for i, (name, args) in enumerate(tool_calls or []):
        if content or i > 0:
            text += "\n"
        arg_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        text += '<tool_call>\n{"name": "' + name + '", "arguments": ' + arg_text + "}\n</tool_call>"
    return text + IM_END


@dataclasses.dataclass
class ParsedAssistant:
    """An assistant turn read from sampled text: content, reasoning (None: none), tool calls, parse errors."""

    content: str
    reasoning: str | None
    tool_calls: list[JSONObject]  # [{"id", "name", "arguments" (JSON string)}]
    errors: list[str] = dataclasses.field(default_factory=list)

    def to_openai_message(self) -> JSONObject:
        """The OpenAI-chat assistant message (content None when the turn is only tool calls)."""
        msg: JSONObject = {"role": "assistant", "content": self.content or (None if self.tool_calls else "")}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [{"id": tc["id"], "type": "function",
                                  "function": {"name": tc["name"], "arguments": tc["arguments"]}}
                                 for tc in self.tool_calls]
        return msg


def new_call_id() -> str:
    """A fresh tool-call id, ``call_`` + 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclasses.dataclass
class ToolCallSpan:
    """One parsed tool call and where it lies in the text."""

    start: int  # of "<tool_call>"
    end: int  # after "</tool_call>"
    id: str
    name: str
    arguments: str  # the JSON string of the parsed call
    args_span: tuple[int, int] | None  # where ``arguments`` appears verbatim in the text, if it does


@dataclasses.dataclass
class Segmentation:
    """Where reasoning, content and tool calls lie in a sampled text (spans into :attr:`text`)."""

    text: str
    reasoning_span: tuple[int, int] | None
    content_spans: list[tuple[int, int]]
    tool_calls: list[ToolCallSpan]
    errors: list[str]

    @property
    def content(self) -> str:
        """The content text (the spans joined)."""
        return "".join(self.text[a:b] for a, b in self.content_spans)

    @property
    def reasoning(self) -> str | None:
        """The reasoning text, None when the text has no ``</think>``."""
        return None if self.reasoning_span is None else self.text[slice(*self.reasoning_span)]

    def parsed(self) -> ParsedAssistant:
        """The same parse as a :class:`ParsedAssistant`."""
        calls = [{"id": t.id, "name": t.name, "arguments": t.arguments} for t in self.tool_calls]
        return ParsedAssistant(content=self.content, reasoning=self.reasoning, tool_calls=calls,
                               errors=list(self.errors))


def segment(text: str) -> Segmentation:
    """The one Qwen3 assistant-text parser: locate reasoning, content and tool calls in sampled text.

    One trailing ``<|im_end|>`` or ``<|endoftext|>`` is dropped. Reasoning is the text before the first
    ``</think>`` (after an optional ``<think>``), newlines trimmed. Each ``<tool_call>{json}</tool_call>``
    whose JSON has a string ``name`` is a call (``arguments`` kept as a JSON string); one that does not
    parse stays content and adds an error. Content is the rest, joined and stripped.
    """
    end = len(text)
    for tail in _TAILS:
        if text.endswith(tail):
            end -= len(tail)
            break
    body = text[:end]
    reasoning_span = None
    start = 0
    if "</think>" in body:
        m = _THINK_RE.match(body)
        if m:
            a, b = m.span(1)
            while a < b and body[a] == "\n":
                a += 1
            while b > a and body[b - 1] == "\n":
                b -= 1
            reasoning_span = (a, b)
            start = m.end()
    kept: list[tuple[int, int]] = []
    calls: list[ToolCallSpan] = []
    errors: list[str] = []
    pos = start
    for tm in _TOOL_RE.finditer(body, start):
        kept.append((pos, tm.start()))
        pos = tm.end()
        try:
            obj = json.loads(tm.group(1))
            name = obj["name"]
            args = obj.get("arguments", {})
            if not isinstance(name, str):
                raise ValueError("name is not a string")  # noqa: TRY004 - reported as an unparseable call
            arg_str = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            calls.append(ToolCallSpan(tm.start(), tm.end(), new_call_id(), name, arg_str,
                                      _args_span(body, tm.span(1), arg_str)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            errors.append(f"unparseable tool call: {exc}")
            kept.append(tm.span(0))
    kept.append((pos, end))
    return Segmentation(text, reasoning_span, _strip_spans(text, kept), calls, errors)


def _args_span(text: str, json_span: tuple[int, int], arg_str: str) -> tuple[int, int] | None:
    a, b = json_span
    idx = text.rfind(arg_str, a, b) if arg_str else -1
    if idx < 0 or text[idx + len(arg_str):b].strip() != "}":
        return None
    return idx, idx + len(arg_str)


def _strip_spans(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans whose joined text is ``"".join(text[a:b] ...).strip()``."""
    spans = [s for s in spans if s[1] > s[0]]
    while spans:
        a, b = spans[0]
        while a < b and text[a].isspace():
            a += 1
        if a < b:
            spans[0] = (a, b)
            break
        spans.pop(0)
    while spans:
        a, b = spans[-1]
        while b > a and text[b - 1].isspace():
            b -= 1
        if b > a:
            spans[-1] = (a, b)
            break
        spans.pop()
    return spans


def parse_assistant(text: str) -> ParsedAssistant:
    """Split sampled text into reasoning, content and tool calls (invalid tool JSON stays content); see
    :func:`segment`, whose spans the proxy also streams from, so both always agree."""
    return segment(text).parsed()
