"""Request bodies of the two OpenAI dialects: Chat Completions (:class:`ChatRequest`) and Responses
(:class:`ResponsesRequest`), as pydantic models validated by :func:`~clawgym_env.proxy.requests_base.validate_body`.

Invariants (beyond :mod:`~clawgym_env.proxy.requests_base`'s):
  * Only fields the proxy reads are declared; every other field is accepted and ignored.
  * A value that passes validation maps onto the pipeline without further checks, except the rules
    that need the whole request (a named ``tool_choice`` must name an offered tool), which the request
    models check themselves.
  * Parts the pipeline receives unchanged (chat content parts, chat tool definitions) are validated and
    then passed on exactly as sent (:class:`PassedOn`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (BeforeValidator, Field, ModelWrapValidatorHandler, PrivateAttr, Tag, field_validator,
                      model_validator)

from clawgym_env.proxy.requests_base import (ARRAY, OBJECT, STRING, Name, PositiveInt, RequestModel, ZeroToOne,
                                             ZeroToTwo, by_field, by_function, by_kind, refused, rule)

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
RESPONSES_ROLES = ("user", "system", "developer", "assistant")
#: ``reasoning.effort`` → the template's ``enable_thinking``.
EFFORT_THINKS = {"none": False, "minimal": False, "low": True, "medium": True, "high": True, "xhigh": True}


def _str_or_none(value: Any) -> Any:
    return value if isinstance(value, str) else None


#: A string field tolerated in any other shape (read as absent): ids a harness echoes back.
LooseStr = Annotated[Union[str, None], BeforeValidator(_str_or_none)]


class PassedOn(RequestModel):
    """A part the pipeline receives as sent (:attr:`sent`: the same keys, values and key order; the chat
    template renders tool definitions with ``tojson``, so even the order reaches the prompt)."""

    _sent: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_sent(cls, value: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        model = handler(value)
        model._sent = value
        return model

    @property
    def sent(self) -> dict[str, Any]:
        return self._sent


# ----------------------------------------------------------------------------- Chat Completions

class ChatTextPart(PassedOn):
    type: str
    text: str


def _chat_part(value: Any) -> str | None:
    if isinstance(value, str):
        return STRING
    if isinstance(value, dict):
        return "<text>" if value.get("type") in ("text", "input_text") else "<other>"
    return None


ChatPart = Annotated[Union[Annotated[str, Tag(STRING)], Annotated[ChatTextPart, Tag("<text>")],
                           Annotated[dict[str, Any], Tag("<other>")]],
                     by_function(_chat_part, "a content part object")]
ChatContent = Annotated[Union[Annotated[str, Tag(STRING)], Annotated[list[ChatPart], Tag(ARRAY)]],
                        by_kind("a string, a list of content parts or null")]
ToolArguments = Annotated[Union[Annotated[str, Tag(STRING)], Annotated[dict[str, Any], Tag(OBJECT)]],
                          by_kind("a JSON string")]


class CalledFunction(RequestModel):
    name: str  # may be empty: a sampled call the harness sends back
    arguments: ToolArguments | None = None


class ChatToolCall(RequestModel):
    id: LooseStr = None
    function: CalledFunction = Field(default_factory=dict, validate_default=True)  # type: ignore[arg-type]


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user"]
    content: ChatContent | None = None


class ChatToolMessage(RequestModel):
    role: Literal["tool"]
    content: ChatContent | None = None
    tool_call_id: Name


class ChatAssistantMessage(RequestModel):
    role: Literal["assistant"]
    content: ChatContent | None = None
    tool_calls: list[ChatToolCall] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # another name for reasoning_content, read when that is absent

    def reasoning_text(self) -> str | None:
        return self.reasoning_content if "reasoning_content" in self.model_fields_set else self.reasoning


AnyChatMessage = Annotated[Union[Annotated[ChatMessage, Tag("<plain>")],
                                 Annotated[ChatToolMessage, Tag("<tool>")],
                                 Annotated[ChatAssistantMessage, Tag("<assistant>")]],
                           by_field("role", {"system": "<plain>", "developer": "<plain>", "user": "<plain>",
                                             "tool": "<tool>", "assistant": "<assistant>"},
                                    "one of " + ", ".join(CHAT_ROLES))]


class ChatFunction(PassedOn):
    name: Name
    parameters: dict[str, Any] | None = None


class ChatTool(PassedOn):
    type: Literal["function"] = "function"  # other tool types are not served
    function: ChatFunction = Field(default_factory=dict, validate_default=True)  # type: ignore[arg-type]


class ChosenFunction(RequestModel):
    name: str


class ChatNamedChoice(RequestModel):
    function: ChosenFunction = Field(default_factory=dict, validate_default=True)  # type: ignore[arg-type]


ChatToolChoice = Annotated[Union[Annotated[Literal["none", "auto", "required"], Tag(STRING)],
                                 Annotated[ChatNamedChoice, Tag(OBJECT)]],
                           by_kind("'none', 'auto', 'required' or {type: 'function', function: {name}}")]
Stop = Annotated[Union[Annotated[str, Tag(STRING)], Annotated[list[str], Tag(ARRAY)]],
                 by_kind("a string or a list of strings")]


class StreamOptions(RequestModel):
    include_usage: bool | None = None


class TemplateKwargs(RequestModel):
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
    def _choice_is_offered(self) -> "ChatRequest":
        choice = self.tool_choice
        if isinstance(choice, ChatNamedChoice) and self.tools:
            if choice.function.name not in {t.function.name for t in self.tools}:
                raise rule("tool_choice", f"names {choice.function.name!r}, which is not among 'tools'")
        return self


# ----------------------------------------------------------------------------- Responses

class TextPart(RequestModel):
    text: str


class RefusalPart(RequestModel):
    refusal: str


class PlaceholderPart(RequestModel):
    type: str  # input_image, input_file, input_audio: the template has no slot, a placeholder stands in


ResponsesPart = Annotated[Union[Annotated[TextPart, Tag("<text>")], Annotated[RefusalPart, Tag("<refusal>")],
                                Annotated[PlaceholderPart, Tag("<placeholder>")]],
                          by_field("type", {"input_text": "<text>", "output_text": "<text>", "text": "<text>",
                                            "refusal": "<refusal>", "input_image": "<placeholder>",
                                            "input_file": "<placeholder>", "input_audio": "<placeholder>"},
                                   "input_text, output_text, refusal, input_image, input_file or input_audio")]
ResponsesContent = Annotated[Union[Annotated[str, Tag(STRING)], Annotated[list[ResponsesPart], Tag(ARRAY)]],
                             by_kind("a string or a list of content parts")]


class MessageItem(RequestModel):
    role: Literal["user", "system", "developer", "assistant"]
    content: ResponsesContent


class FunctionCallItem(RequestModel):
    call_id: Name
    name: str  # may be empty: a sampled call the harness sends back
    arguments: str


class FunctionCallOutputItem(RequestModel):
    call_id: Name
    output: ResponsesContent


def _reasoning_part(kind: str) -> Any:
    def pick(value: Any) -> str:
        ours = isinstance(value, dict) and value.get("type", kind) == kind
        return "<text>" if ours else "<other>"
    # parts of other types (and non-objects) are skipped, never refused
    return Annotated[Union[Annotated[TextPart, Tag("<text>")], Annotated[Any, Tag("<other>")]],
                     by_function(pick, "a part")]


ReasoningTextPart = _reasoning_part("reasoning_text")
SummaryTextPart = _reasoning_part("summary_text")


class ReasoningItem(RequestModel):
    encrypted_content: LooseStr = None
    content: list[ReasoningTextPart] | None = None  # type: ignore[valid-type]
    summary: list[SummaryTextPart] | None = None  # type: ignore[valid-type]


class CompactionItem(RequestModel):
    """``compaction_trigger`` / ``compaction``: server-side compaction needs server state, so always refused."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, value: Any) -> Any:
        raise rule("type", f"{value.get('type')!r} (server-side compaction) is not supported: this proxy keeps no "
                   "state and cannot produce or read an encrypted compaction item; configure the harness to "
                   "compact on its own side and send the conversation as message/function_call items")


InputItem = Annotated[Union[Annotated[MessageItem, Tag("<message>")], Annotated[FunctionCallItem, Tag("<call>")],
                            Annotated[FunctionCallOutputItem, Tag("<output>")],
                            Annotated[ReasoningItem, Tag("<reasoning>")],
                            Annotated[CompactionItem, Tag("<compaction>")]],
                      by_field("type", {"message": "<message>", "function_call": "<call>",
                                        "function_call_output": "<output>", "reasoning": "<reasoning>",
                                        "compaction_trigger": "<compaction>", "compaction": "<compaction>"},
                               "message, function_call, function_call_output or reasoning", default="message")]
ResponsesInput = Annotated[Union[Annotated[str, Tag(STRING)], Annotated[list[InputItem], Tag(ARRAY)]],
                           by_kind("a string or a list of input items")]


class FunctionTool(RequestModel):
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None


class HostedTool(RequestModel):
    """A hosted, namespace or custom tool: nothing the template can offer, skipped unread."""


ResponsesTool = Annotated[Union[Annotated[FunctionTool, Tag("<function>")], Annotated[HostedTool, Tag("<hosted>")]],
                          by_field("type", {"function": "<function>"}, "a tool type (a string)", other="<hosted>")]


class FunctionChoice(RequestModel):
    name: Name


class OtherChoice(RequestModel):
    """A choice of a hosted tool: offers the tools unchanged."""


ResponsesChoiceObject = Annotated[Union[Annotated[FunctionChoice, Tag("<function>")],
                                        Annotated[OtherChoice, Tag("<other>")]],
                                  by_field("type", {"function": "<function>"}, "a tool choice type (a string)",
                                           other="<other>")]
ResponsesToolChoice = Annotated[Union[Annotated[Literal["none", "auto", "required"], Tag(STRING)],
                                      Annotated[ResponsesChoiceObject, Tag(OBJECT)]],
                                by_kind("'none', 'auto', 'required' or a tool choice object")]


class ReasoningConfig(RequestModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


_STATELESS = "is not supported: this proxy stores no responses; send the whole conversation in 'input' (store: false)"


class ResponsesRequest(RequestModel):
    """``POST /v1/responses``."""

    previous_response_id: Annotated[Any, BeforeValidator(refused(_STATELESS))] = None
    conversation: Annotated[Any, BeforeValidator(refused(_STATELESS))] = None
    background: bool | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    include: list[str] | None = None
    instructions: str | None = None
    input: ResponsesInput
    tools: list[ResponsesTool] | None = None
    tool_choice: ResponsesToolChoice | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: ZeroToTwo | None = None
    top_p: ZeroToOne | None = None
    stream: bool | None = None
    model: str | None = None
    reasoning: ReasoningConfig | None = None

    @field_validator("background")
    @classmethod
    def _foreground(cls, value: bool | None) -> bool | None:
        if value:
            raise rule("", "responses are not supported; use stream or a plain request")
        return value

    def function_tools(self) -> list[FunctionTool]:
        return [t for t in self.tools or [] if isinstance(t, FunctionTool)]

    @model_validator(mode="after")
    def _choice_is_offered(self) -> "ResponsesRequest":
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice) and choice.name not in {t.name for t in self.function_tools()}:
            raise rule("tool_choice", f"names {choice.name!r}, which is not among the function 'tools'")
        return self
