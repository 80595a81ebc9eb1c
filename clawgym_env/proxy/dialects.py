"""The wire dialects the proxy speaks: one table of their modules, routes and history fields.

Invariants:
  * :data:`DIALECTS` is the only table of dialects: the proxy's routes (``app.py``), the plugin registry's
    built-in dialects (:func:`builtin_modules`) and the conformance check's history field
    (:attr:`DialectSpec.history_key`) all derive from it.
  * Its names are exactly those of :data:`DialectName`, the type of ``CallRecord.dialect``, which lives with
    the records (the capture package sits below the proxy and may not import it); a dialect added to one
    and not the other fails this module's import.
  * This module imports no dialect module (:meth:`DialectSpec.load` imports on first use).
  * A dialect module provides what :class:`DialectModule` lists; its routes are ``/ep/{token}/v1`` + ``path``
    (and + each side route's path).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast, get_args

from clawgym_env.capture.records import Dialect

if TYPE_CHECKING:
    from clawgym_env.proxy.sessions import TurnRequest, TurnResult

DialectName = Dialect
"""The name of a dialect, as calls are recorded (``CallRecord.dialect``)."""


class DialectModule(Protocol):
    """What a dialect module provides (see ``openai_chat`` for the reference)."""

    def parse_request(self, body: Any) -> TurnRequest:
        """Validate a request body and map it; a malformed one raises a 400 naming the field."""
        ...

    def render_response(self, res: TurnResult, model: str) -> dict[str, Any]:
        """The non-streamed answer for a finished turn."""
        ...

    def stream_response(self, res: TurnResult, model: str) -> Iterator[str]:
        """The streamed answer (server-sent events) for a finished turn."""
        ...

    def error_body(self, status: int, message: str, field: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
        """The dialect's own error envelope."""
        ...


@dataclasses.dataclass(frozen=True)
class SideRoute:
    """A side call answered from the body and the tokenizer alone: ``module.<function>(body, tokenizer) -> dict``;
    no policy call and no record."""

    path: str
    function: str


@dataclasses.dataclass(frozen=True)
class DialectSpec:
    """One dialect: its recorded name, module, route and history field."""

    name: DialectName
    module: str
    """The dialect's module (imported by :meth:`load`)."""
    path: str
    """Its route under ``/ep/{token}/v1``."""
    history_key: str
    """The request field that carries the conversation (a harness re-sends it on every call)."""
    side_routes: tuple[SideRoute, ...] = ()

    def load(self) -> DialectModule:
        """The dialect's module (imported on first use)."""
        return cast(DialectModule, importlib.import_module(self.module))


DIALECTS: tuple[DialectSpec, ...] = (
    DialectSpec("openai_chat", "clawgym_env.proxy.openai_chat", "/chat/completions", "messages"),
    DialectSpec("anthropic_messages", "clawgym_env.proxy.anthropic_messages", "/messages", "messages",
                (SideRoute("/messages/count_tokens", "count_tokens"),)),
    DialectSpec("openai_responses", "clawgym_env.proxy.openai_responses", "/responses", "input"),
)
NAMES: tuple[DialectName, ...] = tuple(d.name for d in DIALECTS)
BY_NAME: dict[str, DialectSpec] = {d.name: d for d in DIALECTS}

if NAMES != get_args(DialectName):  # pragma: no cover - a dialect added to one list and not the other
    raise ImportError(f"DialectName {get_args(DialectName)} and DIALECTS {NAMES} disagree")


def spec(name: str) -> DialectSpec:
    """The dialect called ``name``; ``KeyError`` naming the known ones otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown dialect {name!r} (known: {', '.join(NAMES)})") from None


def builtin_modules() -> dict[str, str]:
    """``{name: module}`` of every dialect (the plugin registry's built-ins)."""
    return {d.name: d.module for d in DIALECTS}
