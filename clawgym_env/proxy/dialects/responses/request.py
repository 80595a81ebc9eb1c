"""Request bodies of the OpenAI Responses dialect (:class:`ResponsesRequest`), as pydantic models validated by
:func:`~clawgym_env.proxy.dialects.request_base.validate_body`.

Invariants (beyond :mod:`~clawgym_env.proxy.dialects.request_base`'s):
  * Only fields the proxy reads are declared; ``store``, ``include``, ``prompt_cache_key``, ``metadata``,
    ``text``, ``truncation`` and every other field are accepted (and, when declared, type-checked) and ignored.
  * Features that need server-side state are refused with a message naming them: ``previous_response_id``,
    ``conversation``, ``background: true`` and ``compaction_trigger``/``compaction`` input items.
  * A body that validates maps onto the pipeline; the rule that needs the whole request (a named
    ``tool_choice`` must name a function tool) is checked by :class:`ResponsesRequest`. Only an ``input``
    of reasoning items alone is refused later, by the dialect (it holds no message).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Tag,
    field_validator,
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
    refused,
    rule,
)

RESPONSES_ROLES = ("user", "system", "developer", "assistant")
#: ``reasoning.effort`` → the template's ``enable_thinking``.
EFFORT_THINKS = {"none": False, "minimal": False, "low": True, "medium": True, "high": True, "xhigh": True}


class TextPart(RequestModel):
    """A text part (``input_text``, ``output_text``, ``text``; in reasoning, ``reasoning_text``/``summary_text``)."""

    text: str


class RefusalPart(RequestModel):
    """A ``refusal`` part: its text is rendered."""

    refusal: str


class PlaceholderPart(RequestModel):
    """``input_image``, ``input_file``, ``input_audio``: the template has no slot, a placeholder stands in."""

    type: str


ResponsesPart = Annotated[
    Annotated[TextPart, Tag("<text>")] | Annotated[RefusalPart, Tag("<refusal>")]
    | Annotated[PlaceholderPart, Tag("<placeholder>")],
    by_field("type", {"input_text": "<text>", "output_text": "<text>", "text": "<text>", "refusal": "<refusal>",
                      "input_image": "<placeholder>", "input_file": "<placeholder>", "input_audio": "<placeholder>"},
             "input_text, output_text, refusal, input_image, input_file or input_audio")]
ResponsesContent = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[list[ResponsesPart], Tag(ARRAY)],
    by_kind("a string or a list of content parts")]


class MessageItem(RequestModel):
    """A ``message`` input item (``developer`` renders as system)."""

    role: Literal["user", "system", "developer", "assistant"]
    content: ResponsesContent


class FunctionCallItem(RequestModel):
    """A ``function_call`` the model made, sent back (its item ``id`` is dropped)."""

    call_id: Name
    name: str  # may be empty: a sampled call the harness sends back
    arguments: str


class FunctionCallOutputItem(RequestModel):
    """A ``function_call_output``: a tool result."""

    call_id: Name
    output: ResponsesContent


def _reasoning_text_part(value: Any) -> str:
    ours = isinstance(value, dict) and value.get("type", "reasoning_text") == "reasoning_text"
    return "<text>" if ours else "<other>"


def _summary_text_part(value: Any) -> str:
    ours = isinstance(value, dict) and value.get("type", "summary_text") == "summary_text"
    return "<text>" if ours else "<other>"


# parts of other types (and non-objects) are skipped, never refused
ReasoningTextPart = Annotated[Annotated[TextPart, Tag("<text>")] | Annotated[Any, Tag("<other>")],
                              by_function(_reasoning_text_part, "a part")]
SummaryTextPart = Annotated[Annotated[TextPart, Tag("<text>")] | Annotated[Any, Tag("<other>")],
                            by_function(_summary_text_part, "a part")]


class ReasoningItem(RequestModel):
    """A ``reasoning`` item: its text becomes the next assistant message's reasoning."""

    encrypted_content: LooseStr = None
    content: list[ReasoningTextPart] | None = None
    summary: list[SummaryTextPart] | None = None


class CompactionItem(RequestModel):
    """``compaction_trigger`` / ``compaction``: server-side compaction needs server state, so always refused."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, value: Any) -> Any:
        raise rule("type", f"{value.get('type')!r} (server-side compaction) is not supported: this proxy keeps no "
                   "state and cannot produce or read an encrypted compaction item; configure the harness to "
                   "compact on its own side and send the conversation as message/function_call items")


InputItem = Annotated[
    Annotated[MessageItem, Tag("<message>")] | Annotated[FunctionCallItem, Tag("<call>")]
    | Annotated[FunctionCallOutputItem, Tag("<output>")] | Annotated[ReasoningItem, Tag("<reasoning>")]
    | Annotated[CompactionItem, Tag("<compaction>")],
    by_field("type", {"message": "<message>", "function_call": "<call>", "function_call_output": "<output>",
                      "reasoning": "<reasoning>", "compaction_trigger": "<compaction>", "compaction": "<compaction>"},
             "message, function_call, function_call_output or reasoning", default="message")]
ResponsesInput = Annotated[
    Annotated[str, Tag(STRING)] | Annotated[list[InputItem], Tag(ARRAY)],
    by_kind("a string or a list of input items")]


class FunctionTool(RequestModel):
    """A ``type: "function"`` tool: the only kind the template can offer."""

    name: Name
    description: str | None = None
    parameters: JSONObject | None = None


class HostedTool(RequestModel):
    """A hosted, namespace or custom tool: nothing the template can offer, skipped unread."""


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("<function>")] | Annotated[HostedTool, Tag("<hosted>")],
    by_field("type", {"function": "<function>"}, "a tool type (a string)", other="<hosted>")]


class FunctionChoice(RequestModel):
    """``{type: "function", name}``: the name must be among the function tools."""

    name: Name


class OtherChoice(RequestModel):
    """A choice of a hosted tool: offers the tools unchanged."""


ResponsesChoiceObject = Annotated[
    Annotated[FunctionChoice, Tag("<function>")] | Annotated[OtherChoice, Tag("<other>")],
    by_field("type", {"function": "<function>"}, "a tool choice type (a string)", other="<other>")]
ResponsesToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag(STRING)] | Annotated[ResponsesChoiceObject, Tag(OBJECT)],
    by_kind("'none', 'auto', 'required' or a tool choice object")]


class ReasoningConfig(RequestModel):
    """``reasoning``: ``effort`` picks the template's ``enable_thinking`` (:data:`EFFORT_THINKS`)."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


_STATELESS = "is not supported: this proxy stores no responses; send the whole conversation in 'input' (store: false)"


class ResponsesRequest(RequestModel):
    """``POST /v1/responses`` (stateless: every call sends its whole input)."""

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
        """The function tools, in order (the others are skipped)."""
        return [t for t in self.tools or [] if isinstance(t, FunctionTool)]

    @model_validator(mode="after")
    def _choice_is_offered(self) -> ResponsesRequest:
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice) and choice.name not in {t.name for t in self.function_tools()}:
            raise rule("tool_choice", f"names {choice.name!r}, which is not among the function 'tools'")
        return self
