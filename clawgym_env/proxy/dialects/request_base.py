"""The base of the dialects' request models, and the one translation of a validation error into a 400.

Each dialect declares its request body as pydantic models (each dialect folder's ``request.py``:
``openai_chat``, ``anthropic``, ``responses``) and validates a parsed JSON body with :func:`validate_body`.

Invariants:
  * Models are strict (no coercion: ``"1"`` is not an integer, ``true`` is not a number, ``1`` is not a
    string) and ignore unknown fields: harnesses send many fields this proxy has no use for.
  * Every union of alternatives is discriminated (:func:`by_kind`, :func:`by_field`, :func:`by_function`), so
    one input fails in one branch only; union tags are written ``<...>`` and never appear in a field path.
  * :func:`validate_body` returns the model or raises :class:`ProxyError` (HTTP 400) whose ``field`` is the
    path of the first offending value in the body (``messages[3].content``, ``tools[0].function.name``;
    ``None`` when the body itself is not an object) and whose message starts with that path in quotes.
  * A rule a type cannot state (a field required only for one role, a refused feature) is raised from a
    validator with :func:`rule`, which names the field below the model it is checked on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from clawgym_env.errors import ProxyError

M = TypeVar("M", bound=BaseModel)

#: Tags of :func:`by_kind` unions, one per JSON kind.
STRING, ARRAY, OBJECT = "<string>", "<array>", "<object>"
_KINDS: dict[type, str] = {str: STRING, list: ARRAY, dict: OBJECT}
_RULE = "clawgym_rule"
_TAG_ERROR = "clawgym_tag:"  # + the tag field's name


class RequestModel(BaseModel):
    """A part of a request body: strict types, unknown fields ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)


def bad(message: str, field: str | None) -> ProxyError:
    """A 400 naming ``field`` (for rules checked after validation, e.g. against the offered tools)."""
    return ProxyError(message, status=400, field=field)


def rule(field: str, message: str) -> PydanticCustomError:
    """An error for ``field`` (a path below the validated model) with a message of its own."""
    return PydanticCustomError(_RULE, "{message}", {"field": field, "message": message})


def json_kind(value: Any) -> str | None:
    """The :func:`by_kind` tag of a JSON value (None for numbers, booleans and null)."""
    return _KINDS.get(type(value))


def by_kind(expected: str) -> Discriminator:
    """Discriminate a union by the JSON kind of the value; any other kind fails with ``must be {expected}``."""
    return by_function(json_kind, expected)


def by_field(name: str, branches: Mapping[str, str], expected: str, *, default: str | None = None,
             other: str | None = None) -> Discriminator:
    """Discriminate objects by their string field ``name`` (``default`` when it is absent).

    ``branches`` maps a value of the field to the tag of its branch; any other string selects the
    ``other`` branch when there is one. Anything else (not an object, no string there, an unknown value
    without ``other``) fails on the path ``...{name}`` with ``must be {expected}``.
    """
    def pick(value: Any) -> str | None:
        if not isinstance(value, dict):
            return None
        found = value.get(name, default)
        if not isinstance(found, str):
            return None
        return branches.get(found, other)

    return Discriminator(pick, custom_error_type=_TAG_ERROR + name, custom_error_message=f"must be {expected}")


def by_function(pick: Callable[[Any], str | None], expected: str) -> Discriminator:
    """Discriminate by ``pick(value)`` (a tag or None); None fails on the union's own path."""
    return Discriminator(pick, custom_error_type="clawgym_kind", custom_error_message=f"must be {expected}")


def refused(message: str) -> Callable[[Any], Any]:
    """A before-validator refusing any value but null with ``message`` (a feature this proxy cannot serve)."""
    def check(value: Any) -> Any:
        if value is not None:
            raise rule("", message)
        return value
    return check


def _str_or_none(value: Any) -> Any:
    return value if isinstance(value, str) else None


#: A string field tolerated in any other shape (read as absent): ids and titles a harness echoes back.
LooseStr = Annotated[str | None, BeforeValidator(_str_or_none)]
#: A positive JSON integer (booleans are not integers).
PositiveInt = Annotated[int, Field(gt=0)]
#: A non-empty string (ids and names that must be there).
Name = Annotated[str, Field(min_length=1)]
#: Finite JSON numbers (an integer counts) within [0, 1] and [0, 2]: sampling knobs.
ZeroToOne = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
ZeroToTwo = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)]


def validate_body(model: type[M], body: Any) -> M:
    """``body`` as ``model`` or a :class:`ProxyError` (see the module invariants)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise _to_proxy_error(errors[0], len(errors) - 1) from None
    except RecursionError:  # parse_json bounds depth already; belt and braces for direct callers
        raise bad("the request body is nested too deeply", "body") from None


def field_path(loc: Iterable[int | str]) -> str:
    """``("messages", 3, "<user>", "content")`` → ``messages[3].content`` (union tags dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part and not part.startswith("<"):
            out += ("." if out else "") + part
    return out


def _to_proxy_error(err: ErrorDetails, more: int) -> ProxyError:
    loc = [p for p in err["loc"] if isinstance(p, (int, str))]
    kind, ctx, value = err["type"], err.get("ctx") or {}, err["input"]
    if kind == _RULE:
        loc.append(str(ctx.get("field", "")))
        what = str(ctx.get("message", err["msg"]))
    elif kind.startswith(_TAG_ERROR):
        name = kind[len(_TAG_ERROR):]
        loc.append(name)
        got = value.get(name) if isinstance(value, dict) else value
        what = f"{err['msg']}; got {_short(got)}"
    elif kind == "missing":
        what = "is required"
    elif kind in ("too_short", "string_too_short") and not value:
        what = "must not be empty"
    elif kind == "model_type" and not loc:
        return bad("the request body must be a JSON object", None)
    elif kind == "model_type":
        what = f"must be an object; got {_short(value)}"
    else:
        what = f"{_lower(err['msg'])}; got {_short(value)}"
    path = field_path(loc)
    if not path:
        return bad(what, None)
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return bad(f"'{path}' {what}{tail}", path)


def _lower(msg: str) -> str:
    msg = msg.removeprefix("Value error, ")
    if msg.startswith("Input should be"):
        return "must be" + msg[len("Input should be"):]
    return msg[:1].lower() + msg[1:]


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
