"""The Gemini API's request body (``GenerateContentRequest``, camelCase JSON as the SDKs send it), validated.

Invariants: unknown fields are ignored (the API grows); a malformed known field is a
:class:`~clawgym_env.errors.ProxyError` (400) naming the field as ``contents[2].parts[0].functionCall.name``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawgym_env.errors import ProxyError
from clawgym_env.jsontypes import JSONObject


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class FunctionCall(_Model):
    """A ``functionCall`` part: the model asked for a tool."""

    id: str | None = None
    name: str
    args: JSONObject = Field(default_factory=dict)


class FunctionResponse(_Model):
    """A ``functionResponse`` part: a tool's result (``id`` answers the call of that id)."""

    id: str | None = None
    name: str
    response: JSONObject = Field(default_factory=dict)


class Part(_Model):
    """One part of a content: text (``thought``: reasoning), a function call or response, or media."""

    text: str | None = None
    thought: bool | None = None
    function_call: FunctionCall | None = Field(default=None, alias="functionCall")
    function_response: FunctionResponse | None = Field(default=None, alias="functionResponse")
    inline_data: JSONObject | None = Field(default=None, alias="inlineData")
    file_data: JSONObject | None = Field(default=None, alias="fileData")


class Content(_Model):
    """One turn: ``user`` or ``model`` (absent: ``user``) and its parts."""

    role: str | None = None
    parts: list[Part] = Field(default_factory=list)


class FunctionDeclaration(_Model):
    """A tool the model may call: its JSON schema in ``parametersJsonSchema`` or (OpenAPI subset) ``parameters``."""

    name: str
    description: str | None = None
    parameters: JSONObject | None = None
    parameters_json_schema: JSONObject | None = Field(default=None, alias="parametersJsonSchema")


class Tool(_Model):
    """A ``tools`` entry: function declarations (built-in tools such as ``googleSearch`` are skipped)."""

    function_declarations: list[FunctionDeclaration] = Field(default_factory=list, alias="functionDeclarations")


class FunctionCallingConfig(_Model):
    """``toolConfig.functionCallingConfig``: ``AUTO``, ``ANY`` (offered unchanged: the proxy cannot force a call)
    or ``NONE`` (the tools are hidden)."""

    mode: str | None = None


class ToolConfig(_Model):
    """``toolConfig``."""

    function_calling_config: FunctionCallingConfig | None = Field(default=None, alias="functionCallingConfig")


class ThinkingConfig(_Model):
    """``generationConfig.thinkingConfig``: a budget of 0 turns thinking off; the budget is not enforced."""

    include_thoughts: bool | None = Field(default=None, alias="includeThoughts")
    thinking_budget: int | None = Field(default=None, alias="thinkingBudget")


class GenerationConfig(_Model):
    """``generationConfig``: the sampling settings the proxy honours (the rest is accepted and ignored)."""

    temperature: float | None = None
    top_p: float | None = Field(default=None, alias="topP")
    max_output_tokens: int | None = Field(default=None, alias="maxOutputTokens", gt=0)
    stop_sequences: list[str] | None = Field(default=None, alias="stopSequences")
    seed: int | None = None
    candidate_count: int | None = Field(default=None, alias="candidateCount")
    thinking_config: ThinkingConfig | None = Field(default=None, alias="thinkingConfig")


class GenerateContentRequest(_Model):
    """The body of ``generateContent`` / ``streamGenerateContent`` / ``countTokens``."""

    contents: list[Content] = Field(min_length=1)
    system_instruction: Content | None = Field(default=None, alias="systemInstruction")
    tools: list[Tool] = Field(default_factory=list)
    tool_config: ToolConfig | None = Field(default=None, alias="toolConfig")
    generation_config: GenerationConfig | None = Field(default=None, alias="generationConfig")


class CountTokensRequest(_Model):
    """``countTokens``: the contents alone, or a whole ``generateContentRequest``."""

    contents: list[Content] = Field(default_factory=list)
    generate_content_request: GenerateContentRequest | None = Field(default=None, alias="generateContentRequest")


def _where(loc: tuple[int | str, ...], model: type[BaseModel]) -> str:
    """The camelCase field path of a pydantic error location (``contents[0].parts[1].functionCall``)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part.split("_")[0] + "".join(w.title() for w in part.split("_")[1:]) if "_" in part else part
            out += ("." if out else "") + name
    return out or "body"


def validate(model: type[GenerateContentRequest] | type[CountTokensRequest], body: Any
             ) -> GenerateContentRequest | CountTokensRequest:
    """``body`` validated as ``model``; a 400 naming the first bad field (``INVALID_ARGUMENT``) otherwise."""
    if not isinstance(body, dict):
        raise ProxyError("the request body must be a JSON object", field="body")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = _where(tuple(err["loc"]), model)
        raise ProxyError(f"invalid value at '{field}': {err['msg']}", field=field) from None
