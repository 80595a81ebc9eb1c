"""The proxy's ASGI app: routes, per-request guards and the dialect-neutral handler.

Routes: every registered dialect's own (:mod:`clawgym_env.proxy.dialects.contract`; the built-ins: ``POST
/ep/{token}/v1/chat/completions`` (OpenAI chat), ``/v1/messages`` (Anthropic Messages, and the side route
``/v1/messages/count_tokens``), ``/v1/responses`` (OpenAI Responses)), mounted when the app is built; ``GET
/ep/{token}/v1/models`` (and ``/models/{id}``), ``GET /healthz``. The invariants
are :mod:`clawgym_env.proxy.server`'s (error shapes, episode-bound sockets, failures, bounds) and
:mod:`clawgym_env.proxy.guards.bounds`'s (what one episode and all of them may hold). Every HTTP request holds a
:class:`~clawgym_env.proxy.guards.bounds.Ticket` from its first byte until its answer has been sent; a body larger
than :data:`PARSE_INLINE_BYTES` is parsed, validated and trimmed for its record in a worker thread, so the
event loop keeps serving other episodes meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from clawgym_env.errors import PolicyError, ProxyError
from clawgym_env.policy.base import PolicyBackend
from clawgym_env.proxy.dialects.openai_chat import dialect as openai_chat
from clawgym_env.proxy.dialects.registry import BoundDialect, DialectModule, registered
from clawgym_env.proxy.guards.bounds import VALUE_BYTES, Budget, ProxyLimits, Ticket
from clawgym_env.proxy.guards.limits import ClientGone, check_prompt_size, json_values_bound, parse_json, read_body
from clawgym_env.proxy.listeners import CONNECTION_VERDICT_KEY, EPISODE_STATE_KEY
from clawgym_env.proxy.recorded import recorded_body
from clawgym_env.proxy.sessions import (
    EpisodeSession,
    Limits,
    SessionRegistry,
    TurnMeta,
    TurnRequest,
    TurnResult,
    redact_headers,
)
from clawgym_env.proxy.stream.keepalive import Failure, first_wait, keepalive_body
from clawgym_env.proxy.stream.live import LiveStart, LiveTurn
from clawgym_env.proxy.turn import prepare_turn, run_turn
from clawgym_env.redact import redact


class ProxyHost(Protocol):
    """What the app reads of the server that hosts it (:class:`~clawgym_env.proxy.server.ProxyServer`)."""

    @property
    def registry(self) -> SessionRegistry: ...  # noqa: D102 - a field of the host

    @property
    def limits(self) -> Limits: ...  # noqa: D102 - a field of the host

    @property
    def policy(self) -> PolicyBackend: ...  # noqa: D102 - a field of the host

    @property
    def model_name(self) -> str: ...  # noqa: D102 - a field of the host

    @property
    def created(self) -> float: ...  # noqa: D102 - a field of the host

    @property
    def bounds(self) -> ProxyLimits: ...  # noqa: D102 - a field of the host

    @property
    def budget(self) -> Budget: ...  # noqa: D102 - a field of the host

    @property
    def read_timeout_s(self) -> float: ...  # noqa: D102 - a field of the host

    @property
    def max_json_depth(self) -> int: ...  # noqa: D102 - a field of the host

    @property
    def keepalive_s(self) -> float: ...  # noqa: D102 - a field of the host

    @property
    def inline_bytes(self) -> int: ...  # noqa: D102 - a field of the host

    @property
    def warmed(self) -> bool: ...  # noqa: D102 - a field of the host

    @property
    def _executor(self) -> Executor | None: ...

log = logging.getLogger("clawgym.proxy")


def dialect_routes(dialects: tuple[BoundDialect, ...]) -> list[tuple[str, str, BoundDialect, str, bool]]:
    """(method, path under ``/ep/{token}``, dialect, function name, is a side call) of every route the dialects
    declare: a turn's function parses the body, a side call's answers it from the body and the tokenizer alone
    (``fn(body, tokenizer) -> dict``; no policy call and no record)."""
    return [(r.method, r.path, d, r.side if r.side is not None else r.parse, r.side is not None)
            for d in dialects for r in d.spec.routes]


def _error(dialect: DialectModule, status: int, message: str, field: str | None = None,
           code: str | None = None) -> JSONResponse:
    return JSONResponse(dialect.error_body(status, redact(message), field, code), status_code=status)


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
TICKET_KEY = "clawgym_ticket"
"""The ASGI scope key of a request's :class:`~clawgym_env.proxy.guards.bounds.Ticket`."""
PARSE_INLINE_BYTES = 64 << 10
"""A body up to this size is parsed on the event loop (well under a millisecond); a larger one in a thread."""
_CLOSING = {"episode_connection_limit", "proxy_connection_limit"}  # answered, then the connection is closed


def _classify(exc: BaseException, path: str) -> Failure:
    """(status, message, field, code) of a failed request, as every error answer (and in-stream error) says it."""
    if isinstance(exc, ProxyError):
        return exc.status, str(exc), exc.field, exc.code
    if isinstance(exc, PolicyError):
        log.warning("policy failure: %s", redact(str(exc)), exc_info=exc.__cause__)
        return 502, f"the policy failed to generate: {exc}", None, "policy_error"
    if isinstance(exc, ClientGone):
        log.info("client disconnected mid-body on %s", path)
        return 400, "the client disconnected before the body was complete", "body", "client_disconnected"
    log.error("internal proxy error", exc_info=exc)
    return 500, f"internal proxy error ({type(exc).__name__}); see the proxy log", None, "internal_error"


def _sse(events: Iterator[str]) -> StreamingResponse:
    """A finished streaming answer (its events rendered whole before the first byte goes out)."""
    chunks = list(events)

    async def body_iter() -> AsyncIterator[str]:
        for c in chunks:
            yield c

    return StreamingResponse(body_iter(), media_type="text/event-stream", headers=_SSE_HEADERS)


class ProxyApp:
    """The ASGI app's state and handlers (one per :class:`ProxyServer`)."""

    def __init__(self, server: ProxyHost) -> None:
        self.server = server
        routes = [Route("/healthz", self.healthz, methods=["GET"]),
                  Route("/ep/{token}/v1/models", self.models, methods=["GET"]),
                  Route("/ep/{token}/v1/models/{model:path}", self.model, methods=["GET"])]
        self.dialects = registered()
        """The dialects served, resolved from the registry when the app is built (their routes mounted)."""
        routes += [Route("/ep/{token}" + path, self._side_endpoint(d.module, fn) if side else self._endpoint(d, fn),
                         methods=[method]) for method, path, d, fn, side in dialect_routes(self.dialects)]
        claims: dict[str, set[str]] = {}
        for _, path, d, _, _ in dialect_routes(self.dialects):
            claims.setdefault(path.split("/")[1], set()).add(d.name)
        by_name = {d.name: d.module for d in self.dialects}
        self._by_prefix: dict[str, DialectModule] = {seg: by_name[next(iter(names))]
                                                      for seg, names in claims.items() if len(names) == 1}
        """A path's first segment under ``/ep/{token}`` → the one dialect whose routes start with it (its
        envelope answers a 404 or 405 there; any other path: OpenAI's)."""
        self.routes = Starlette(routes=routes, exception_handlers={HTTPException: self._http_error,
                                                                   Exception: self._crash})

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        """The ASGI app: the routes, each HTTP request holding its budget ticket until its answer is sent."""
        if scope["type"] != "http":
            await self.routes(scope, receive, send)
            return
        ticket = self.server.budget.ticket()
        scope[TICKET_KEY] = ticket
        try:
            await self.routes(scope, receive, send)
        finally:
            ticket.close()

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = {404: f"no route for {request.method} {request.url.path}",
                  405: f"method {request.method} is not allowed on {request.url.path}"}.get(status, str(exc))
        parts = request.url.path.split("/")
        dialect = self._by_prefix.get(parts[3], openai_chat) if len(parts) > 3 and parts[1] == "ep" else openai_chat
        return _error(dialect, status, detail, code="not_found" if status == 404 else None)

    async def _crash(self, request: Request, exc: Exception) -> Response:
        log.error("internal proxy error on %s", request.url.path, exc_info=exc)
        return _error(openai_chat, 500, f"internal proxy error ({type(exc).__name__}); see the proxy log")

    async def healthz(self, request: Request) -> Response:
        """``GET /healthz``."""
        return JSONResponse({"status": "ok"})

    @staticmethod
    def _bound_token(request: Request) -> str | None:
        """The episode token of the socket the request came in on (None on shared listeners)."""
        state = request.scope.get("state") or {}
        return state.get(EPISODE_STATE_KEY)

    def _session(self, request: Request) -> EpisodeSession:
        token = request.path_params["token"]
        bound = self._bound_token(request)
        session = self.server.registry.get(token) if bound is None or bound == token else None
        state = request.scope.get("state") or {}
        verdict = state.get(CONNECTION_VERDICT_KEY)
        if session is None:
            if verdict == "proxy":
                self._ticket(request).enter(token, shared=False, verdict=verdict)  # raises: the proxy is full
            raise ProxyError("unknown or closed episode token in the base URL (/ep/<token>/v1)", status=404,
                             code="episode_not_found")
        request.state.clawgym_session = session
        self._ticket(request).enter(session.token, shared=bound is None, verdict=verdict)
        return session

    @staticmethod
    def _ticket(request: Request) -> Ticket:
        return request.scope[TICKET_KEY]

    def _check_records(self, session: EpisodeSession) -> None:
        """Refuse a call of an episode whose records reached their bound, or one that keeps its records in memory
        when the in-memory records of all open episodes reached theirs."""
        limits = self.server.bounds
        if session.recorded_bytes >= limits.max_episode_recorded_bytes:
            raise ProxyError(f"this episode has recorded {session.recorded_bytes} bytes of calls, its limit is "
                             f"{limits.max_episode_recorded_bytes} bytes (max_episode_recorded_bytes); end the "
                             "episode", status=413, code="episode_record_limit")
        if session.calls_path is not None:
            return  # its records go to its calls file: they take no memory
        held = self.server.registry.memory_bytes()
        if held >= limits.max_recorded_bytes:
            raise ProxyError(f"the open episodes keep {held} bytes of records in memory, the proxy's limit is "
                             f"{limits.max_recorded_bytes} bytes (max_recorded_bytes; stream records to a calls "
                             "file); retry later", status=503, code="proxy_record_limit")

    async def models(self, request: Request) -> Response:
        """``GET /ep/{token}/v1/models``: the one served model."""
        return await self._guard(openai_chat, self._models, request)

    async def model(self, request: Request) -> Response:
        """``GET /ep/{token}/v1/models/{id}``."""
        return await self._guard(openai_chat, self._models, request)

    async def _models(self, request: Request) -> Response:
        self._session(request)
        name, created = self.server.model_name, int(self.server.created)
        wanted = request.path_params.get("model")
        if wanted is None:
            return JSONResponse(openai_chat.models_body(name, created))
        if wanted != name:
            raise ProxyError(f"model {wanted!r} is not served here; the served model is {name!r}", status=404,
                             field="model", code="model_not_found")
        return JSONResponse(openai_chat.model_body(name, created))

    def _side_endpoint(self, dialect: DialectModule, fn_name: str) -> Callable:
        async def endpoint(request: Request) -> Response:
            return await self._guard(dialect, self._side, request, getattr(dialect, fn_name))
        return endpoint

    async def _side(self, request: Request, fn: Callable) -> Response:
        self._session(request)
        raw = await self._read_raw(request)
        body = await self._off_loop(len(raw), self._parse_side, raw)
        del raw
        executor = self.server._executor
        if executor is None:
            raise ProxyError("the proxy is shutting down", status=503, code="unavailable")
        result = await asyncio.get_running_loop().run_in_executor(executor, fn, body, self.server.policy.tokenizer)
        return JSONResponse(result)

    def _endpoint(self, bound: BoundDialect, parse_name: str) -> Callable:
        dialect, name, parse = bound.module, bound.name, getattr(bound.module, parse_name)

        async def endpoint(request: Request) -> Response:
            return await self._guard(dialect, self._turn, request, dialect, name, parse)
        return endpoint

    async def _guard(self, dialect: DialectModule, fn: Callable, request: Request, *args: Any) -> Response:
        try:
            return await fn(request, *args)
        except Exception as exc:  # noqa: BLE001 - classified below; a bug becomes a JSON 500
            status, message, field, code = _classify(exc, request.url.path)
        self._note_failure(request, status, code, message)
        answer = _error(dialect, status, message, field, code)
        if code in _CLOSING:
            answer.headers["connection"] = "close"
        return answer

    def _note_failure(self, request: Request, status: int, code: str | None, message: str) -> None:
        """Keep a non-2xx answer on the session it belongs to: the socket's episode when the request came
        in on an episode socket (never the episode a foreign token names), else the token's episode."""
        session = getattr(request.state, "clawgym_session", None)
        if session is None:
            token = self._bound_token(request) or request.path_params.get("token")
            session = self.server.registry.get(token) if token else None
        if session is not None:
            session.fail(status, code, message)

    async def _turn(self, request: Request, dialect: DialectModule, name: str,
                    parse: Callable[[Any], TurnRequest]) -> Response:
        started = time.time()
        session = self._session(request)
        self._check_records(session)
        raw = await self._read_raw(request)
        treq, body = await self._off_loop(len(raw), self._parse_turn, raw, parse)
        del raw
        meta = TurnMeta(dialect=name, path=request.url.path, body=body,
                        headers=redact_headers(request.headers), started_at=started)
        executor = self.server._executor
        if executor is None:
            raise ProxyError("the proxy is shutting down", status=503, code="unavailable")
        live = getattr(dialect, "live", None)
        if treq.stream and live is not None and self.server.policy.streams_text:
            return await self._live(request, session, dialect, live, treq, meta, executor)
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(executor, run_turn, session, self.server.policy, treq, meta,
                                       self.server.limits)
        except RuntimeError as exc:  # executor shut down under us
            raise ProxyError("the proxy is shutting down", status=503, code="unavailable") from exc
        model = self.server.model_name
        if treq.stream and not await first_wait(fut, self.server.keepalive_s):
            # the turn outlived keepalive_s: 200, keep-alives, then the answer or an in-stream error
            stream = dialect.keepalive(treq, body, model)
            classify, note = self._in_stream_failures(request)
            waiting = keepalive_body(fut, self.server.keepalive_s, stream, classify, note)
            return StreamingResponse(waiting, media_type="text/event-stream", headers=_SSE_HEADERS)
        result = await fut
        if not treq.stream:
            return JSONResponse(dialect.render_response(result, model))
        return _sse(dialect.stream_response(result, model))

    def _in_stream_failures(self, request: Request) -> tuple[Callable[[BaseException], Failure],
                                                             Callable[[Failure], None]]:
        """(classify, note) for failures once a streaming answer has started."""
        path = request.url.path

        def classify(exc: BaseException) -> Failure:
            status, message, field, code = _classify(exc, path)
            return status, redact(message), field, code

        def note(failure: Failure) -> None:
            status, message, _, code = failure
            self._note_failure(request, status, code, message)

        return classify, note

    async def _live(self, request: Request, session: EpisodeSession, dialect: DialectModule, live: Callable,
                    treq: TurnRequest, meta: TurnMeta, executor: Executor) -> Response:
        """A streaming request served while a streaming policy's text arrives (:mod:`clawgym_env.proxy.stream.live`)."""
        policy, keepalive_s = self.server.policy, self.server.keepalive_s
        # a small body is rendered here on the loop: cheaper than two thread hops (turn.py's invariants)
        size = getattr(request.state, "clawgym_body_bytes", None)
        inline = self.server.warmed and size is not None and size <= self.server.inline_bytes
        session.call_started()  # ended by the LiveTurn's pump once recorded or failed
        try:
            if inline:
                prep = prepare_turn(session, policy, treq, self.server.limits)
            else:
                try:
                    fut = asyncio.get_running_loop().run_in_executor(executor, prepare_turn, session, policy, treq,
                                                                     self.server.limits)
                except RuntimeError as exc:  # executor shut down under us
                    raise ProxyError("the proxy is shutting down", status=503, code="unavailable") from exc
                prep = await fut
        except BaseException:
            session.call_ended()
            raise
        classify, note = self._in_stream_failures(request)
        turn = LiveTurn(session, policy, treq, meta, prep, executor, lambda exc: note(classify(exc)), inline=inline)
        first = await turn.next_item(keepalive_s)
        if isinstance(first, BaseException):  # nothing sent yet: an HTTP error as for any call
            raise first
        model = self.server.model_name
        if isinstance(first, TurnResult):  # the whole answer came at once: sent as for any call
            return _sse(dialect.stream_response(first, model))
        version = session.policy_version if session.policy_version is not None else policy.version
        writer = live(treq, meta.body, model, LiveStart(len(prep.prompt_ids), policy.name, int(version)))
        body = turn.body(first, writer, keepalive_s, classify, note)
        return StreamingResponse(body, media_type="text/event-stream", headers=_SSE_HEADERS)

    def _parse_side(self, raw: bytearray) -> Any:
        """Parse a side call's body and bound it as a prompt (side calls tokenise the whole body)."""
        body = parse_json(raw, self.server.max_json_depth)
        limits = self.server.limits
        check_prompt_size(body, None, limits.max_prompt_chars, limits.max_context)
        return body

    def _parse_turn(self, raw: bytearray, parse: Callable[[Any], TurnRequest]) -> tuple[TurnRequest, Any]:
        """Parse and validate a turn's body with its route's parser; (the request, the body as its record keeps
        it)."""
        body = parse_json(raw, self.server.max_json_depth)
        treq = parse(body)
        return treq, recorded_body(body, treq.source, self.server.bounds.max_unknown_bytes)

    @staticmethod
    async def _off_loop(size: int, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` on the loop for a small body, in a worker thread for one over PARSE_INLINE_BYTES."""
        if size <= PARSE_INLINE_BYTES:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    async def _read_raw(self, request: Request) -> bytearray:
        """The request's JSON body, unparsed: bounded in bytes and in JSON values, and charged to its ticket."""
        ctype = request.headers.get("content-type")
        if ctype is not None:
            media = ctype.split(";")[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                raise ProxyError(f"the content-type must be application/json, got {ctype!r}", field="content-type")
        s, limits, ticket = self.server, self.server.bounds, self._ticket(request)
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            raise ProxyError(f"the request body is larger than the limit of {limits.max_body_bytes} bytes "
                             "(max_body_bytes)", status=413, field="body", code="request_too_large")
        raw = await read_body(request, limits.max_body_bytes, s.read_timeout_s, ticket.charge)
        request.state.clawgym_body_bytes = len(raw)
        values = json_values_bound(raw)
        if values > limits.max_json_values:
            raise ProxyError(f"the request body may hold up to {values} JSON values, over the limit of "
                             f"{limits.max_json_values} (max_json_values; counted as 1 + its '[' and ',' bytes "
                             "+ twice its ':' bytes)", status=413, field="body", code="request_too_large")
        ticket.charge(VALUE_BYTES * values, "parsed request bodies")
        return raw
