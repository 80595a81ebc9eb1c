"""The proxy's listening side: uvicorn with guarded connections, and one unix socket per episode.

Invariants:
  * Every accepted TCP connection has ``TCP_NODELAY`` set (asyncio sets it only for sockets created
    with ``IPPROTO_TCP``; we set it on the listener and on each accepted connection), so a response
    never waits for the client's delayed ACK.
  * A connection that has no request in progress for ``idle_timeout_s`` — idle after connecting, idle
    between keep-alive requests, or stalled half-way through its request line/headers — is closed,
    however slowly it trickles bytes. (A stalled *body* is bounded by the per-read timeout of
    :func:`clawgym_env.proxy.guards.limits.read_body`.)
  * A request's line and headers are bounded whichever parser runs: ``httptools`` (C, the default when
    importable) refuses them past :data:`MAX_HEAD_BYTES`; ``h11`` (pure Python) past the same bound while
    incomplete, so a head that completes in one more read (the transport reads at most 256 KiB) gets
    through. Refused: a 400 answer, and the connection is closed.
  * An episode's listener passes ``{"clawgym_episode": token}`` as the ASGI ``state`` of every request
    it accepts; the shared listeners pass no episode. The app uses it to accept only that episode's
    token on that socket.
  * Every connection is counted on the server's :class:`~clawgym_env.proxy.guards.bounds.Budget` from
    ``connection_made`` to ``connection_lost`` (an episode socket's against its episode too), and its
    requests carry the verdict (``state["clawgym_connection"]``: the bound it is past, or None): the app
    answers a request on a connection past a bound with the refusal and closes it; a connection past
    twice a bound is closed as soon as it is made.
  * Episode sockets live in the server's private 0700 folder, are root/owner-owned with mode 0666
    (the sandbox's unprivileged uid must be able to connect; the folder keeps host users out, and the
    sandbox gets the socket bind-mounted read-only, so it cannot chmod or remove it) and are unlinked
    when their episode closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from clawgym_env.proxy.guards.bounds import Budget

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is a dependency; without it the proxy runs h11, slower but the same
    HttpToolsProtocol = None  # type: ignore[assignment, misc]

log = logging.getLogger("clawgym.proxy")

EPISODE_STATE_KEY = "clawgym_episode"
CONNECTION_VERDICT_KEY = "clawgym_connection"
MAX_HEAD_BYTES = 64 << 10
"""The most bytes a request's line plus headers may take (both parsers; h11's own default is 16 KiB)."""


def set_nodelay(sock: socket.socket | None) -> None:
    """``TCP_NODELAY`` on a TCP socket; a no-op for unix sockets."""
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


def tcp_listener(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket created as ``IPPROTO_TCP`` (so asyncio treats it as TCP) with NODELAY."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    tcp = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        set_nodelay(tcp)
        tcp.bind((host, port))
        tcp.listen(backlog)
    except BaseException:
        tcp.close()
        raise
    return tcp


def unix_listener(path: Path, mode: int = 0o666, backlog: int = 1024) -> socket.socket:
    """A listening unix socket at ``path`` with ``mode`` (a stale socket there is replaced)."""
    if path.is_socket():
        path.unlink()
    elif path.exists():
        raise OSError(f"cannot create the unix socket at {path}: a non-socket file is there")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        unix.bind(str(path))
        os.chmod(path, mode)
        unix.listen(backlog)
    except BaseException:
        unix.close()
        raise
    return unix


class _Guard:
    """NODELAY and the idle/stalled-connection watchdog (module doc), mixed into a uvicorn HTTP protocol."""

    idle_timeout_s: float = 30.0
    budget: Budget | None = None
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    app_state: dict[str, Any]  # uvicorn's attribute, typed as uvicorn types it (its ASGI state)

    def connection_made(self, transport: asyncio.Transport) -> None:
        """Set ``TCP_NODELAY`` on the new connection, count it and start its idle watchdog."""
        super().connection_made(transport)  # type: ignore[misc]
        set_nodelay(transport.get_extra_info("socket"))
        if self.budget is not None:
            token = self.app_state.get(EPISODE_STATE_KEY)
            admission = self.budget.connect(token)
            if admission.verdict == "drop":
                log.debug("closing a connection past twice the %s connection bound", "episode" if token else "proxy")
                transport.close()
            else:
                self._counted = (token, admission)
            self.app_state = {**self.app_state, CONNECTION_VERDICT_KEY: admission.verdict}  # this connection's own
            if admission.verdict in ("proxy", "episode"):
                log.info("connection past the %s connection bound: its requests are refused", admission.verdict)
        self._seen_cycle: Any = None
        self._idle_since = time.monotonic()
        self._watch_handle = self.loop.call_later(self.idle_timeout_s, self._watch)

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the connection's watchdog, uncount it, then let uvicorn clean up."""
        handle = getattr(self, "_watch_handle", None)
        if handle is not None:
            handle.cancel()
        counted = self.__dict__.pop("_counted", None)
        if self.budget is not None and counted is not None:
            self.budget.disconnect(*counted)
        super().connection_lost(exc)  # type: ignore[misc]

    def _watch(self) -> None:
        if self.transport.is_closing():
            return
        now = time.monotonic()
        cycle = self.cycle
        busy = cycle is not None and not cycle.response_complete
        if busy or cycle is not self._seen_cycle:
            self._seen_cycle, self._idle_since = cycle, now
        elif now - self._idle_since >= self.idle_timeout_s:
            log.info("closing a connection with no request in progress for %.0fs (idle or stalled headers)",
                     now - self._idle_since)
            self.transport.close()
            return
        wait = max(0.05, self.idle_timeout_s - (now - self._idle_since))
        self._watch_handle = self.loop.call_later(wait, self._watch)


class GuardedH11Protocol(_Guard, H11Protocol):  # type: ignore[misc]
    """uvicorn's pure-Python ``h11`` protocol, guarded (its head bound: ``h11_max_incomplete_event_size``)."""


if HttpToolsProtocol is not None:
    class GuardedHttpToolsProtocol(_Guard, HttpToolsProtocol):  # type: ignore[misc]
        """uvicorn's ``httptools`` protocol, guarded, with the head bound ``h11`` has and ``httptools`` lacks."""

        _head_bytes = 0

        def on_message_begin(self) -> None:
            """A new request: its head count starts at 0."""
            self._head_bytes = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            """Count the request line's URL (a raise here answers 400 and closes: uvicorn's parser error)."""
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            """Count a header (each costs its bytes plus its separators)."""
            self._count_head(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _count_head(self, n: int) -> None:
            self._head_bytes += n
            if self._head_bytes > MAX_HEAD_BYTES:
                log.info("refusing a request whose line and headers exceed %d bytes", MAX_HEAD_BYTES)
                raise ValueError(f"the request line and headers exceed {MAX_HEAD_BYTES} bytes")
else:  # pragma: no cover - httptools is a dependency
    GuardedHttpToolsProtocol = None  # type: ignore[assignment, misc]

#: the guarded protocol the proxy runs by default: ``httptools`` when importable, else ``h11``
GuardedProtocol: type = GuardedH11Protocol if HttpToolsProtocol is None else GuardedHttpToolsProtocol
PARSERS = ("auto", "httptools", "h11")


def guarded_protocol(idle_timeout_s: float, parser: str = "auto", budget: Budget | None = None) -> type:
    """A guarded protocol class with its own idle timeout, counting its connections on ``budget``;
    ``parser``: one of :data:`PARSERS`."""
    if parser not in PARSERS:
        raise ValueError(f"unknown HTTP parser {parser!r}; use one of {list(PARSERS)}")
    if parser == "httptools" and HttpToolsProtocol is None:
        raise ValueError("the httptools parser is not installed: pip install httptools")
    base = GuardedH11Protocol if parser == "h11" else GuardedProtocol
    return type(base.__name__, (base,), {"idle_timeout_s": float(idle_timeout_s), "budget": budget})


class Server(uvicorn.Server):
    """uvicorn's server that can add and remove per-episode listeners while it runs (thread safe)."""

    loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Remember the serving loop (:meth:`add_listener` schedules onto it), then start uvicorn."""
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def _factory(self, state: Mapping[str, object]) -> Any:
        config = self.config

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(config=config, server_state=self.server_state,  # type: ignore
                                              app_state=dict(state))
        return create_protocol

    def add_listener(self, sock: socket.socket, state: Mapping[str, object], timeout: float = 10.0) -> Any:
        """Serve ``sock`` with ``state`` as every request's ASGI state; returns a handle for removal."""
        loop = self.loop
        if loop is None or not self.started:
            raise RuntimeError("the proxy server is not running")

        async def add() -> asyncio.base_events.Server:
            srv = await loop.create_server(self._factory(state), sock=sock, backlog=self.config.backlog)
            self.servers.append(srv)
            return srv
        return asyncio.run_coroutine_threadsafe(add(), loop).result(timeout)

    def remove_listener(self, handle: Any, timeout: float = 10.0) -> None:
        """Stop accepting on a listener added by :meth:`add_listener` (open connections finish)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return

        async def remove() -> None:
            handle.close()
            if handle in self.servers:
                self.servers.remove(handle)
        try:
            asyncio.run_coroutine_threadsafe(remove(), loop).result(timeout)
        except (RuntimeError, TimeoutError):  # the loop stopped meanwhile: it closed the listener itself
            pass
