"""The dialect contract: what a wire-dialect module provides, so the proxy serves it with no edit to the engine.

A dialect is a module registered in :data:`clawgym_env.plugins.dialects` (built-ins, or an entry point of group
``clawgym.dialects``). It declares its routes and its history field in a module attribute ``DIALECT``
(a :class:`DialectSpec`) and provides the functions of :class:`DialectModule`. Example::

    DIALECT = DialectSpec(history_key="contents", routes=(
        Route("/v1beta/models/{model}:generateContent"),
        Route("/v1beta/models/{model}:streamGenerateContent", parse="parse_stream_request"),
        Route("/v1beta/models/{model}:countTokens", side="count_tokens"),
    ))

Invariants:
  * A route's ``path`` is a path pattern under ``/ep/{token}`` (``{name}`` matches one path segment's text up to
    the next literal; ``{name:path}`` matches across ``/``); the proxy mounts every registered dialect's routes when
    it starts, and two dialects claiming the same method and path is a
    :class:`~clawgym_env.errors.RegistrationError` naming both.
  * A turn route (``side`` is None) is a recorded model call: ``module.<parse>(body) -> TurnRequest`` (a malformed
    body raises a :class:`~clawgym_env.errors.ProxyError`, a 400 naming the field), then the engine renders,
    generates, records, and the module's ``render_response`` / ``stream_response`` answer it (streamed when the
    :class:`~clawgym_env.proxy.sessions.TurnRequest` says ``stream``). The record's ``dialect`` is the
    registered name, its ``path`` the request path, its ``request`` the body.
  * A side route (``side`` = a function name) is answered from the body and the tokenizer alone:
    ``module.<side>(body, tokenizer) -> JSON object``; no policy call and no record.
  * Every error of a dialect's routes is answered in its own envelope: ``module.error_body(status, message, field,
    code)``.
  * ``history_key`` names the request field that carries the conversation (a harness re-sends it on every call).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from clawgym_env.jsontypes import JSONObject

if TYPE_CHECKING:
    from clawgym_env.proxy.sessions import TurnRequest, TurnResult
    from clawgym_env.proxy.stream.keepalive import KeepAliveStream

__all__ = ["DialectModule", "DialectSpec", "Route"]


@dataclasses.dataclass(frozen=True)
class Route:
    """One HTTP route of a dialect, under ``/ep/{token}``: a turn (``parse``) or a side call (``side``)."""

    path: str
    """The path pattern under ``/ep/{token}``, starting with ``/`` (e.g. ``/v1/chat/completions``)."""
    parse: str = "parse_request"
    """For a turn route: the module function ``(body) -> TurnRequest``."""
    side: str | None = None
    """For a side route: the module function ``(body, tokenizer) -> JSON object`` (then ``parse`` is unused)."""
    method: str = "POST"

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"a dialect route's path starts with '/', got {self.path!r}")
        if self.method.upper() != self.method:
            raise ValueError(f"a dialect route's method is upper case (e.g. 'POST'), got {self.method!r}")


@dataclasses.dataclass(frozen=True)
class DialectSpec:
    """What a dialect module declares as ``DIALECT``: its routes and its history field."""

    routes: tuple[Route, ...]
    history_key: str
    """The request field that carries the conversation (a harness re-sends it on every call)."""

    def __post_init__(self) -> None:
        if not any(r.side is None for r in self.routes):
            raise ValueError("a dialect declares at least one turn route (a Route without side=)")

    @property
    def turn_routes(self) -> tuple[Route, ...]:
        """The recorded model-call routes."""
        return tuple(r for r in self.routes if r.side is None)

    @property
    def side_routes(self) -> tuple[Route, ...]:
        """The side-call routes (no policy call, no record)."""
        return tuple(r for r in self.routes if r.side is not None)


class DialectModule(Protocol):
    """What a dialect module provides (see ``openai_chat`` for the reference), besides ``DIALECT`` and each
    route's function. Optionally also ``live(req, body, model, start) -> LiveStream``: then a streaming policy's
    text is sent as it arrives (see :mod:`clawgym_env.proxy.stream.live`); without it such requests are answered
    whole, as for any policy."""

    DIALECT: DialectSpec

    def parse_request(self, body: Any) -> TurnRequest:
        """Validate a request body and map it; a malformed one raises a 400 naming the field. (A route may name
        another function of the same shape; this one also re-parses recorded requests.)"""
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
