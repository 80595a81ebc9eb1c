"""Qwen3 chat format: messages+tools → prompt token ids, and sampled text → assistant message.

The prompt is rendered by the tokenizer's own chat template (Qwen3's: tools in the system turn,
``<tool_call>`` JSON, ``<think>`` reasoning). Generated text is parsed back into the API's
structures. :func:`assistant_text` writes an assistant turn exactly as the model would emit it,
so a scripted policy's tokens look like a model's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any, Iterable

IM_END = "<|im_end|>"
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


def normalize_messages(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-chat messages → the shape Qwen3's template expects (string contents, function calls)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        role = msg.get("role")
        if role == "developer":
            role = "system"
        new: dict[str, Any] = {"role": role, "content": content_to_text(msg.get("content"))}
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


def render_prompt_text(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                       enable_thinking: bool | None = None) -> str:
    kwargs: dict[str, Any] = {}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    return tokenizer.apply_chat_template(normalize_messages(messages), tools=tools or None,
                                         add_generation_prompt=True, tokenize=False, **kwargs)


def render_prompt_ids(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                      enable_thinking: bool | None = None) -> list[int]:
    """Prompt token ids for a chat request, ending with the assistant generation prompt."""
    text = render_prompt_text(tokenizer, messages, tools, enable_thinking)
    return list(tokenizer.encode(text, add_special_tokens=False))


def assistant_text(content: str = "", reasoning: str | None = None,
                   tool_calls: list[tuple[str, dict[str, Any] | str]] | None = None) -> str:
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
    content: str
    reasoning: str | None
    tool_calls: list[dict[str, Any]]  # [{"id", "name", "arguments" (JSON string)}]
    errors: list[str] = dataclasses.field(default_factory=list)

    def to_openai_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or (None if self.tool_calls else "")}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [{"id": tc["id"], "type": "function",
                                  "function": {"name": tc["name"], "arguments": tc["arguments"]}}
                                 for tc in self.tool_calls]
        return msg


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_assistant(text: str) -> ParsedAssistant:
    """Split sampled text into reasoning, content and tool calls (invalid tool JSON stays content)."""
    for tail in (IM_END, "<|endoftext|>"):  # either end-of-turn token may close a sample
        if text.endswith(tail):
            text = text[: -len(tail)]
            break
    reasoning = None
    m = _THINK_RE.match(text) if "</think>" in text else None
    if m:
        reasoning = m.group(1).strip("\n")
        text = text[m.end():]
    calls, errors, kept = [], [], []
    pos = 0
    for tm in _TOOL_RE.finditer(text):
        kept.append(text[pos:tm.start()])
        pos = tm.end()
        try:
            obj = json.loads(tm.group(1))
            name = obj["name"]
            args = obj.get("arguments", {})
            if not isinstance(name, str):
                raise ValueError("name is not a string")
            arg_str = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            calls.append({"id": new_call_id(), "name": name, "arguments": arg_str})
        except (ValueError, KeyError, TypeError) as exc:
            errors.append(f"unparseable tool call: {exc}")
            kept.append(tm.group(0))
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return ParsedAssistant(content=content, reasoning=reasoning, tool_calls=calls, errors=errors)
