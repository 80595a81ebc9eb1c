"""The wire dialects the proxy speaks: one table of their routes and history fields.

Invariants:
  * :data:`DIALECTS` is the only table of dialect routes: the proxy's routes (``app.py``) and the
    conformance check's history field (:attr:`DialectSpec.history_key`) derive from it; each dialect's
    module is the one registered under its name in :data:`clawgym_env.plugins.dialects`.
  * Its names are exactly those of :data:`DialectName`, the type of ``CallRecord.dialect``, which lives with
    the records (the capture package sits below the proxy and may not import it); a dialect added to one
    and not the other fails this module's import.
  * This module imports no dialect module (:meth:`DialectSpec.load` imports on first use).
  * A dialect module provides what :class:`DialectModule` lists; its routes are ``/ep/{token}/v1`` + ``path``
    (and + each side route's path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, cast, get_args

from clawgym_env.capture.records import Dialect
from clawgym_env.jsontypes import JSONObject
from clawgym_env.proxy.dialects import dialects as dialect_registry

if TYPE_CHECKING:
    from clawgym_env.proxy.sessions import TurnRequest, TurnResult
    from clawgym_env.proxy.stream.keepalive import KeepAliveStream

DialectName = Dialect
"""The name of a dialect, as calls are recorded (``CallRecord.dialect``)."""


class DialectModule(Protocol):
    """What a dialect module provides (see ``openai_chat`` for the reference). Optionally also
    ``live(req, body, model, start) -> LiveStream``: then a streaming policy's text is sent as it arrives
    (see :mod:`clawgym_env.proxy.stream.live`); without it such requests are answered whole, as for any policy."""

    def parse_request(self, body: Any) -> TurnRequest:
        """Validate a request body and map it; a malformed one raises a 400 naming the field."""
        ...

    def render_response(self, res: TurnResult, model: str) -> JSONObject:
        """The non-streamed answer for a finished turn."""
        ...

    def stream_response(self, res: TurnResult, model: str) -> Iterator[str]:
        """The streamed answer (server-sent events) for a finished turn."""
        ...

    def error_body(self, status: int, message: str, field: str | None = None,
                   code: str | None = None) -> JSONObject:
        """The dialect's own error envelope."""
        ...

    def keepalive(self, req: TurnRequest, body: Any, model: str) -> KeepAliveStream:
        """The keep-alive stream of one streaming request (see :mod:`clawgym_env.proxy.stream.keepalive`)."""
        ...


@dataclasses.dataclass(frozen=True)
class SideRoute:
    """A side call answered from the body and the tokenizer alone: ``module.<function>(body, tokenizer) -> dict``;
    no policy call and no record."""

    path: str
    function: str


@dataclasses.dataclass(frozen=True)
class DialectSpec:
    """One dialect: its recorded name, route and history field (its module: the dialect registry)."""

    name: DialectName
    path: str
    """Its route under ``/ep/{token}/v1``."""
    history_key: str
    """The request field that carries the conversation (a harness re-sends it on every call)."""
    side_routes: tuple[SideRoute, ...] = ()

    def load(self) -> DialectModule:
        """The dialect's module, registered under its name in :data:`clawgym_env.plugins.dialects`
        (imported on first use)."""
        return cast(DialectModule, dialect_registry.load(self.name))


DIALECTS: tuple[DialectSpec, ...] = (
    DialectSpec("openai_chat", "/chat/completions", "messages"),
    DialectSpec("anthropic_messages", "/messages", "messages", (SideRoute("/messages/count_tokens", "count_tokens"),)),
    DialectSpec("openai_responses", "/responses", "input"),
)
NAMES: tuple[DialectName, ...] = tuple(d.name for d in DIALECTS)
BY_NAME: dict[str, DialectSpec] = {d.name: d for d in DIALECTS}

if NAMES != get_args(DialectName) or not all(n in dialect_registry for n in NAMES):  # pragma: no cover
    raise ImportError(f"DialectName {get_args(DialectName)}, DIALECTS {NAMES} and the dialect registry "
                      f"{dialect_registry.names()} disagree")


def spec(name: str) -> DialectSpec:
    """The dialect called ``name``; ``KeyError`` naming the known ones otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown dialect {name!r} (known: {', '.join(NAMES)})") from None
