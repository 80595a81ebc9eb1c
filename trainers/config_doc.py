"""Configs that document and validate themselves: an algorithm's ``Args`` dataclass is the schema.

* **Docs.** Every field of an ``Args`` (and of nested dataclasses such as ``PolicyConfig``) carries a
  docstring: the string literal right under the field, as in the class body. :func:`field_docs`
  reads them from the source (an ``ast`` walk; nothing is executed) and :func:`describe` renders the
  whole schema — name, type, default, doc — for ``clawgym train --help-config ALGO``.
* **Validation.** :func:`validate` builds the dataclass with pydantic (lax where YAML is loose: an
  int for a float; extra keys forbidden at every level), then runs the dataclass's own
  ``__post_init__`` checks. A failure is one :class:`ConfigError` naming every bad key as a dotted
  path (``policy.lora_rank``), what was wrong, and close names for a misspelt key; a key that moved into a
  section (the class's ``MOVED_KEYS``, e.g. ``generation`` → ``scale.generation``) is named with its new place.
  A key that is a Python keyword (``async:``) is the field of that name plus ``_`` (``async_``), at every level.
* **Inheritance.** Fields an ``Args`` inherits (:mod:`trainers.run_args`) keep the docstring of the class that
  declared them; a subclass restating a field only to change its default keeps that docstring.

Invariant: :func:`undocumented` lists the fields without a docstring; the tests require it empty for
every shipped algorithm, so a new field cannot land undocumented.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import keyword
import textwrap
import typing
from typing import Any

import pydantic

from clawgym_env.errors import ClawGymError, ConfigError
from clawgym_env.jsontypes import JSONObject

__all__ = ["ConfigError", "describe", "field_docs", "undocumented", "validate"]


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of a dataclass, from the string literals under its fields in the source of the class
    and of its dataclass bases (the nearest class that documents a field wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object and dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    """The field docstrings written in the body of ``cls`` itself."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = next((n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)), None)
    docs: dict[str, str] = {}
    if body is None:
        return docs
    for stmt, nxt in zip(body.body, body.body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _nested(hint: Any) -> type | None:
    """The dataclass inside a field's type (``PolicyConfig`` or ``PolicyConfig | None``), if any."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    return next((a for a in typing.get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)), None)


def undocumented(cls: type, prefix: str = "") -> list[str]:
    """Dotted names of the fields of ``cls`` (nested dataclasses included) that have no docstring."""
    docs, hints, missing = field_docs(cls), typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        if f.name not in docs:
            missing.append(prefix + f.name)
        sub = _nested(hints[f.name])
        if sub is not None:
            missing += undocumented(sub, f"{prefix}{f.name}.")
    return missing


def _type_name(hint: Any) -> str:
    text = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
    return text or str(hint).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "(see below)" if dataclasses.is_dataclass(value) else value
    return "(required)"


def describe(cls: type, prefix: str = "") -> str:
    """Every field of ``cls`` as ``name: type = default`` plus its docstring, nested ones dotted."""
    docs, hints, lines = field_docs(cls), typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        key = f.name[:-1] if _keyword_field(f.name) else f.name  # async_: async
        lines.append(f"{prefix}{key}: {_type_name(hints[f.name])} = {_default(f)!r}")
        for doc_line in (docs.get(f.name) or "(undocumented)").splitlines():
            lines.append(f"    {doc_line}")
        sub = _nested(hints[f.name])
        if sub is not None:
            lines.append(describe(sub, f"{prefix}{key}."))
    return "\n".join(lines)


def _forbid_extra(cls: type) -> None:
    """Forbid unknown keys at every level (pydantic reads ``__pydantic_config__`` on stdlib dataclasses)."""
    if "__pydantic_config__" not in cls.__dict__:
        cls.__pydantic_config__ = pydantic.ConfigDict(extra="forbid")  # type: ignore[attr-defined]
    for hint in typing.get_type_hints(cls).values():
        sub = _nested(hint)
        if sub is not None:
            _forbid_extra(sub)


def _names_at(cls: type, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the dataclass that the (parent) location ``loc`` points into."""
    for part in loc:
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        sub = _nested(hints.get(part)) if isinstance(part, str) else None
        if sub is None:
            break
        cls = sub
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []


def _keyword_field(name: object) -> bool:
    """``async_``: the field of a config key that is a Python keyword."""
    return isinstance(name, str) and name.endswith("_") and keyword.iskeyword(name[:-1])


def keyword_keys(cls: type, data: JSONObject) -> JSONObject:
    """``data`` with every key that is a Python keyword renamed to its field (``async`` → ``async_``), in ``cls``
    and in its nested dataclass sections."""
    hints = typing.get_type_hints(cls)
    out: JSONObject = {}
    for key, value in data.items():
        name = f"{key}_" if isinstance(key, str) and keyword.iskeyword(key) else key
        sub = _nested(hints.get(name)) if isinstance(name, str) else None
        out[name] = keyword_keys(sub, value) if sub is not None and isinstance(value, dict) else value
    return out


def moved_keys(cls: type, data: JSONObject) -> list[str]:
    """One line per top-level key of ``data`` that ``cls`` no longer has because it moved into a section."""
    moved: dict[str, str] = getattr(cls, "MOVED_KEYS", {})
    fields = {f.name for f in dataclasses.fields(cls)}
    return [f"`{key}` moved to `{moved[key]}`" for key in data if key in moved and key not in fields]


def validate(cls: type, data: JSONObject, where: str = "config") -> Any:
    """``cls(**data)`` validated by pydantic; a :class:`ConfigError` naming each bad key otherwise (a moved key
    with its new place)."""
    _forbid_extra(cls)
    moved = moved_keys(cls, data)
    if moved:
        raise ConfigError(f"{where}: " + "; ".join(moved))
    data = keyword_keys(cls, data)
    try:
        return pydantic.TypeAdapter(cls).validate_python(data)
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if p != cls.__name__)
            key = ".".join(str(p)[:-1] if _keyword_field(p) else str(p) for p in (where, *loc))
            if err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
                names = _names_at(cls, loc[:-1])
                close = difflib.get_close_matches(str(loc[-1]), names, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else f" (fields: {', '.join(names)})"
                problems.append(f"{key}: unknown key{hint}")
            elif err["type"] == "value_error" and isinstance((err.get("ctx") or {}).get("error"), ClawGymError):
                problems.append(f"{key}: {err['ctx']['error']}")  # a section's own check (ConfigError)
            else:
                problems.append(f"{key}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError("; ".join(problems)) from None
    except (ValueError, TypeError, ClawGymError) as exc:  # a __post_init__ check
        raise ConfigError(f"{where}: {exc}") from None
