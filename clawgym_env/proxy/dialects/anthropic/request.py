"""Request bodies of the Anthropic Messages dialect (``/v1/messages`` and ``/v1/messages/count_tokens``), as
pydantic models validated by :func:`~clawgym_env.proxy.dialects.request_base.validate_body`.

Invariants (beyond :mod:`~clawgym_env.proxy.dialects.request_base`'s):
  * Only fields the proxy reads are declared; ``cache_control``, ``citations``, ``metadata``,
    ``output_config``, ``context_management`` and every other field are accepted and ignored.
  * :class:`Conversation` is what both routes read (``count_tokens`` needs no ``max_tokens``);
    :class:`MessagesRequest` adds the sampling fields of a real turn.
  * ``thread`` (server-held message threads) is refused before anything else is reported.
  * Content blocks are discriminated by ``type``: user, assistant and system messages each accept
    their own block types; inside a ``tool_result`` any block type is accepted (unknown ones become
    placeholders), and server tools (any ``type`` but ``custom``) are read for their name only.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, Tag, model_validator

from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.dialects.request_base import (
    ARRAY,
    STRING,
    LooseStr,
    Name,
    PositiveInt,
    RequestModel,
    ZeroToOne,
    by_field,
    by_function,
    by_kind,
    refused,
    rule,
)

USER_BLOCKS = ("text", "image", "document", "search_result", "tool_result")
ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")


class TextBlock(RequestModel):
    """A ``text`` block."""

    text: str


class PlaceholderBlock(RequestModel):
    """A block the template has no slot for (image, document, browser state ...): a placeholder stands in."""

    type: str


class InnerTextBlock(RequestModel):
    """A block inside a ``search_result``: any type, read for its text."""

    type: str
    text: str


SearchContent = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[list[InnerTextBlock], Tag(ARRAY)],
    by_kind("a string or a list of content blocks")]


def _falsy_is_none(value: Any) -> Any:
    return value or None


class SearchResultBlock(RequestModel):
    """A ``search_result``: rendered as its title and texts."""

    title: LooseStr = None
    content: Annotated[SearchContent | None, BeforeValidator(_falsy_is_none)] = None  # "", 0, [] ...: no content


class ToolReferenceBlock(RequestModel):
    """A ``tool_reference`` in a tool result: renders as ``[tool_reference: NAME]`` and unlocks a deferred tool."""

    tool_name: Name


ResultBlock = Annotated[
    Annotated[TextBlock, Tag("<text>")] | Annotated[ToolReferenceBlock, Tag("<ref>")]
    | Annotated[SearchResultBlock, Tag("<search>")] | Annotated[PlaceholderBlock, Tag("<other>")],
    by_field("type", {"text": "<text>", "tool_reference": "<ref>", "search_result": "<search>"},
             "a block type (a string)", other="<other>")]
ResultContent = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[list[ResultBlock], Tag(ARRAY)],
    by_kind("a string or a list of content blocks")]


class ToolResultBlock(RequestModel):
    """A ``tool_result``: becomes a ``tool`` message."""

    tool_use_id: Name
    is_error: bool | None = None  # not rendered: the template has no slot for it
    content: ResultContent | None = None


UserBlock = Annotated[
    Annotated[TextBlock, Tag("<text>")] | Annotated[PlaceholderBlock, Tag("<placeholder>")]
    | Annotated[SearchResultBlock, Tag("<search>")] | Annotated[ToolResultBlock, Tag("<result>")],
    by_field("type", {"text": "<text>", "image": "<placeholder>", "document": "<placeholder>",
                      "search_result": "<search>", "tool_result": "<result>"},
             f"one of {', '.join(USER_BLOCKS)} in a user message")]
UserContent = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[list[UserBlock], Tag(ARRAY)],
    by_kind("a string or a list of content blocks")]


class ThinkingBlock(RequestModel):
    """A ``thinking`` block sent back (the signature is accepted and not checked)."""

    thinking: str


class RedactedThinkingBlock(RequestModel):
    """A ``redacted_thinking`` block: opaque, dropped."""


class ToolUseBlock(RequestModel):
    """A ``tool_use`` block sent back: becomes a tool call (``arguments = json.dumps(input)``)."""

    id: Name
    name: str  # may be empty: a sampled call the harness sends back
    input: JSONObject = Field(default_factory=dict)


AssistantBlock = Annotated[
    Annotated[TextBlock, Tag("<text>")] | Annotated[ThinkingBlock, Tag("<thinking>")]
    | Annotated[RedactedThinkingBlock, Tag("<redacted>")] | Annotated[ToolUseBlock, Tag("<tool_use>")],
    by_field("type", {"text": "<text>", "thinking": "<thinking>", "redacted_thinking": "<redacted>",
                      "tool_use": "<tool_use>"},
             f"one of {', '.join(ASSISTANT_BLOCKS)} in an assistant message")]
AssistantContent = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[list[AssistantBlock], Tag(ARRAY)],
    by_kind("a string or a list of content blocks")]
SystemBlock = Annotated[Annotated[TextBlock, Tag("<text>")],
                        by_field("type", {"text": "<text>"}, "'text' in a system prompt")]
SystemContent = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[list[SystemBlock], Tag(ARRAY)],
    by_kind("a string or a list of text blocks")]


class UserMessage(RequestModel):
    """A user message: text around tool results becomes user messages, each tool result a tool message."""

    content: UserContent


class AssistantMessage(RequestModel):
    """An assistant message (a trailing one, a prefill, renders as a finished turn)."""

    content: AssistantContent


class SystemMessage(RequestModel):
    """A ``role: "system"`` message inside ``messages`` (Claude Code sends them)."""

    content: SystemContent


Message = Annotated[
    Annotated[UserMessage, Tag("<user>")] | Annotated[AssistantMessage, Tag("<assistant>")]
    | Annotated[SystemMessage, Tag("<system>")],
    by_field("role", {"user": "<user>", "assistant": "<assistant>", "system": "<system>"},
             "'user' or 'assistant' (or 'system')")]


class CustomTool(RequestModel):
    """A custom tool (no ``type`` or ``"custom"``): offered as a function tool."""

    name: Name
    input_schema: JSONObject
    description: str | None = None
    defer_loading: bool | None = None  # offered only once a tool_reference names it


class ServerTool(RequestModel):
    """``web_search_*``, ``bash_*`` ...: nothing the template can offer, skipped."""

    name: Name


def _tool_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    return "<custom>" if value.get("type") in (None, "custom") else "<server>"


Tool = Annotated[Annotated[CustomTool, Tag("<custom>")] | Annotated[ServerTool, Tag("<server>")],
                 by_function(_tool_kind, "a tool object")]


class ToolChoice(RequestModel):
    """``tool_choice``: ``none`` hides the tools; the others offer them (a named tool must be offered)."""

    type: Literal["auto", "any", "tool", "none"]
    disable_parallel_tool_use: bool | None = None
    name: LooseStr = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise rule("name", "is required for a named tool choice (a non-empty string)")
        return self


class ThinkingConfig(RequestModel):
    """``thinking``: enabled|adaptive → ``enable_thinking=True``, disabled → False."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: PositiveInt | None = None  # accepted, not enforced


_NO_THREADS = ("(server-held message threads: create/continue) is not supported: this proxy keeps no "
               "conversation state and would otherwise answer over a truncated prompt; send the whole "
               "conversation in 'messages' without 'thread'")


class Conversation(RequestModel):
    """What a Messages body says about the prompt (all that ``count_tokens`` reads)."""

    thread: Annotated[Any, BeforeValidator(refused(_NO_THREADS))] = None
    system: SystemContent | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(Conversation):
    """``POST /v1/messages``."""

    max_tokens: PositiveInt
    stop_sequences: list[str] | None = None
    top_k: PositiveInt | None = None  # accepted, not enforced
    temperature: ZeroToOne | None = None
    top_p: ZeroToOne | None = None
    stream: bool | None = None
    model: str | None = None
