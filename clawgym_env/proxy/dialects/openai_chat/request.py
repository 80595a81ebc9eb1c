"""Request bodies of the OpenAI Chat Completions dialect (:class:`ChatRequest`), as pydantic models validated by
:func:`~clawgym_env.proxy.dialects.request_base.validate_body`.

Invariants (beyond :mod:`~clawgym_env.proxy.dialects.request_base`'s):
  * Only fields the proxy reads are declared; every other field is accepted and ignored.
  * A body that validates maps onto the pipeline without further checks: the one rule that needs the
    whole request (a named ``tool_choice`` must name an offered tool) is checked by :class:`ChatRequest`.
  * Parts the pipeline receives unchanged (content parts, tool definitions) are validated and then passed
    on exactly as sent (:class:`PassedOn`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    Tag,
    model_validator,
)

from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.dialects.request_base import (
    ARRAY,
    OBJECT,
    STRING,
    LooseStr,
    Name,
    PositiveInt,
    RequestModel,
    ZeroToOne,
    ZeroToTwo,
    by_field,
    by_function,
    by_kind,
    rule,
)

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class PassedOn(RequestModel):
    """A part the pipeline receives as sent (:attr:`sent`: the same keys, values and key order; the chat
    template renders tool definitions with ``tojson``, so even the order reaches the prompt)."""

    _sent: JSONObject = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_sent(cls, value: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        model = handler(value)
        model._sent = value
        return model

    @property
    def sent(self) -> JSONObject:
        """The object as the request carried it."""
        return self._sent


class ChatTextPart(PassedOn):
    """A ``text``/``input_text`` content part (other parts are passed on unread)."""

    type: str
    text: str


def _chat_part(value: Any) -> str | None:
    if isinstance(value, str):
        return STRING
    if isinstance(value, dict):
        return "<text>" if value.get("type") in ("text", "input_text") else "<other>"
    return None


ChatPart = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[ChatTextPart, Tag("<text>")] | Annotated[JSONObject, Tag("<other>")],
    by_function(_chat_part, "a content part object")]
ChatContent = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[list[ChatPart], Tag(ARRAY)],
    by_kind("a string, a list of content parts or null")]
ToolArguments = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[JSONObject, Tag(OBJECT)],
    by_kind("a JSON string")]


class CalledFunction(RequestModel):
    """The function of a tool call an assistant message carries (``arguments``: a JSON string or object)."""

    name: str  # may be empty: a sampled call the harness sends back
    arguments: ToolArguments | None = None


class ChatToolCall(RequestModel):
    """A tool call of an assistant message (an id that is no string is read as absent)."""

    id: LooseStr = None
    function: CalledFunction = Field(default_factory=dict, validate_default=True)


class ChatMessage(RequestModel):
    """A system, developer or user message."""

    role: Literal["system", "developer", "user"]
    content: ChatContent | None = None


class ChatToolMessage(RequestModel):
    """A tool result."""

    role: Literal["tool"]
    content: ChatContent | None = None
    tool_call_id: Name


class ChatAssistantMessage(RequestModel):
    """An assistant turn sent back: text, tool calls and reasoning."""

    role: Literal["assistant"]
    content: ChatContent | None = None
    tool_calls: list[ChatToolCall] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # another name for reasoning_content, read when that is absent

    def reasoning_text(self) -> str | None:
        """``reasoning_content`` if the message has that field, else ``reasoning``."""
        return self.reasoning_content if "reasoning_content" in self.model_fields_set else self.reasoning


AnyChatMessage = Annotated[
    Annotated[ChatMessage, Tag("<plain>")] | Annotated[ChatToolMessage, Tag("<tool>")]
    | Annotated[ChatAssistantMessage, Tag("<assistant>")],
    by_field("role", {"system": "<plain>", "developer": "<plain>", "user": "<plain>", "tool": "<tool>",
                      "assistant": "<assistant>"}, "one of " + ", ".join(CHAT_ROLES))]


class ChatFunction(PassedOn):
    """A function tool's definition."""

    name: Name
    parameters: JSONObject | None = None


class ChatTool(PassedOn):
    """A tool offered to the model (only function tools are served)."""

    type: Literal["function"] = "function"
    function: ChatFunction = Field(default_factory=dict, validate_default=True)


class ChosenFunction(RequestModel):
    """The function a named ``tool_choice`` names."""

    name: str


class ChatNamedChoice(RequestModel):
    """``{type: "function", function: {name}}`` (the proxy cannot force a call; the name must be offered)."""

    function: ChosenFunction = Field(default_factory=dict, validate_default=True)


ChatToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag(STRING)] | Annotated[ChatNamedChoice, Tag(OBJECT)],
    by_kind("'none', 'auto', 'required' or {type: 'function', function: {name}}")]
Stop = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[list[str], Tag(ARRAY)],
    by_kind("a string or a list of strings")]


class StreamOptions(RequestModel):
    """``stream_options``."""

    include_usage: bool | None = None


class TemplateKwargs(RequestModel):
    """``chat_template_kwargs`` (only ``enable_thinking`` reaches the template)."""

    enable_thinking: bool | None = None


class ChatRequest(RequestModel):
    """``POST /v1/chat/completions``."""

    messages: list[AnyChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    tool_choice: ChatToolChoice | None = None
    n: Literal[1] | None = None  # the proxy samples one choice per call
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    seed: int | None = None
    model: str | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    temperature: ZeroToTwo | None = None
    top_p: ZeroToOne | None = None
    stop: Stop | None = None
    logprobs: bool | None = None

    @model_validator(mode="after")
    def _choice_is_offered(self) -> ChatRequest:
        choice = self.tool_choice
        if isinstance(choice, ChatNamedChoice) and self.tools:
            if choice.function.name not in {t.function.name for t in self.tools}:
                raise rule("tool_choice", f"names {choice.function.name!r}, which is not among 'tools'")
        return self
