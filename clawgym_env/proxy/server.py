"""The serving proxy: a starlette app, run by uvicorn in a background thread (or the foreground).

Routes: ``POST /ep/{token}/v1/chat/completions`` (OpenAI chat dialect), ``/v1/messages`` (Anthropic
Messages; ``/v1/messages/count_tokens`` is a side route, see :data:`SIDE_ROUTES`), ``/v1/responses``
(OpenAI Responses), ``GET /ep/{token}/v1/models``
(and ``/models/{id}``), ``GET /healthz``. A dialect is a module (see ``openai_chat.py``) and one
entry of :data:`DIALECT_ROUTES`; the server reads the body, looks up the episode, lets the dialect
parse, runs the dialect-neutral pipeline (:func:`~clawgym_env.proxy.sessions.run_turn`) in a worker
thread, and lets the dialect render or stream the result.

Invariants:
  * Streaming is emitted *after* the policy generated the whole continuation (``generate`` is
    blocking and runs in a thread pool, so the event loop keeps serving other episodes meanwhile).
    A call is recorded once its response is ready, just before it is sent.
  * Every answer is JSON in the dialect's error shape: bad input → 4xx naming the field, an unknown
    token → 404, a policy failure → 502, shutting down → 503; 500 (type ``server_error``) only for a
    genuine bug in the proxy, which is logged with its traceback.
  * The same app listens on TCP (``url``) and on a unix socket (``socket_path``, mode 0666 inside a
    private 0700 directory unless a path was given); sandboxes reach it only through the socket.
  * ``start()`` and ``stop()`` are idempotent; a failed ``start()`` leaves no thread, socket or
    directory behind; ``stop()`` shuts down gracefully, then forcibly, and removes the socket.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from clawgym_env.capture.records import CallRecord, write_jsonl
from clawgym_env.errors import PolicyError, ProxyError
from clawgym_env.policy.base import PolicyBackend
from clawgym_env.proxy import anthropic_messages, openai_chat, openai_responses
from clawgym_env.proxy.sessions import EpisodeSession, Limits, SessionRegistry, TurnMeta, redact_headers, run_turn

log = logging.getLogger("clawgym.proxy")

#: (path under ``/ep/{token}/v1``, dialect module). Later dialects add an entry here.
DIALECT_ROUTES: list[tuple[str, ModuleType]] = [("/chat/completions", openai_chat),
                                                ("/messages", anthropic_messages),
                                                ("/responses", openai_responses)]
#: (path under ``/ep/{token}/v1``, dialect module, function name): side calls answered from the body
#: and the tokenizer alone, ``fn(body, tokenizer) -> dict``; no policy call and no record.
SIDE_ROUTES: list[tuple[str, ModuleType, str]] = [("/messages/count_tokens", anthropic_messages, "count_tokens")]


def _error(dialect: ModuleType, status: int, message: str, field: str | None = None,
           code: str | None = None) -> JSONResponse:
    return JSONResponse(dialect.error_body(status, message, field, code), status_code=status)


class _App:
    """The ASGI app's state and handlers (one per :class:`ProxyServer`)."""

    def __init__(self, server: "ProxyServer") -> None:
        self.server = server
        routes = [Route("/healthz", self.healthz, methods=["GET"]),
                  Route("/ep/{token}/v1/models", self.models, methods=["GET"]),
                  Route("/ep/{token}/v1/models/{model:path}", self.model, methods=["GET"])]
        routes += [Route("/ep/{token}/v1" + path, self._endpoint(d), methods=["POST"]) for path, d in DIALECT_ROUTES]
        routes += [Route("/ep/{token}/v1" + path, self._side_endpoint(d, fn), methods=["POST"])
                   for path, d, fn in SIDE_ROUTES]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: self._http_error,
                                                                Exception: self._crash})

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = {404: f"no route for {request.method} {request.url.path}",
                  405: f"method {request.method} is not allowed on {request.url.path}"}.get(status, str(exc))
        return _error(openai_chat, status, detail, code="not_found" if status == 404 else None)

    async def _crash(self, request: Request, exc: Exception) -> Response:
        log.error("internal proxy error on %s", request.url.path, exc_info=exc)
        return _error(openai_chat, 500, f"internal proxy error ({type(exc).__name__}); see the proxy log")

    async def healthz(self, request: Request) -> Response:
        s = self.server
        return JSONResponse({"status": "ok", "policy": s.policy.name, "model": s.model_name,
                             "episodes": len(s.registry)})

    def _session(self, request: Request) -> EpisodeSession:
        session = self.server.registry.get(request.path_params["token"])
        if session is None:
            raise ProxyError("unknown or closed episode token in the base URL (/ep/<token>/v1)", status=404,
                             code="episode_not_found")
        return session

    async def models(self, request: Request) -> Response:
        return await self._guard(openai_chat, self._models, request)

    async def model(self, request: Request) -> Response:
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

    def _side_endpoint(self, dialect: ModuleType, fn_name: str) -> Callable:
        async def endpoint(request: Request) -> Response:
            return await self._guard(dialect, self._side, request, getattr(dialect, fn_name))
        return endpoint

    async def _side(self, request: Request, fn: Callable) -> Response:
        self._session(request)
        body = await self._read_json(request)
        executor = self.server._executor
        if executor is None:
            raise ProxyError("the proxy is shutting down", status=503, code="unavailable")
        result = await asyncio.get_running_loop().run_in_executor(executor, fn, body, self.server.policy.tokenizer)
        return JSONResponse(result)

    def _endpoint(self, dialect: ModuleType) -> Callable:
        async def endpoint(request: Request) -> Response:
            return await self._guard(dialect, self._turn, request, dialect)
        return endpoint

    async def _guard(self, dialect: ModuleType, fn: Callable, *args: Any) -> Response:
        try:
            return await fn(*args)
        except ProxyError as exc:
            return _error(dialect, exc.status, str(exc), exc.field, exc.code)
        except PolicyError as exc:
            log.warning("policy failure: %s", exc, exc_info=exc.__cause__)
            return _error(dialect, 502, f"the policy failed to generate: {exc}", code="policy_error")
        except Exception as exc:  # noqa: BLE001 - the one place a bug becomes a JSON 500
            log.error("internal proxy error", exc_info=exc)
            return _error(dialect, 500, f"internal proxy error ({type(exc).__name__}); see the proxy log")

    async def _turn(self, request: Request, dialect: ModuleType) -> Response:
        started = time.time()
        session = self._session(request)
        body = await self._read_json(request)
        treq = dialect.parse_request(body)
        meta = TurnMeta(dialect=dialect.NAME, path=request.url.path, body=body,
                        headers=redact_headers(request.headers), started_at=started)
        executor = self.server._executor
        if executor is None:
            raise ProxyError("the proxy is shutting down", status=503, code="unavailable")
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(executor, run_turn, session, self.server.policy, treq, meta,
                                       self.server.limits)
        except RuntimeError as exc:  # executor shut down under us
            raise ProxyError("the proxy is shutting down", status=503, code="unavailable") from exc
        result = await fut
        model = self.server.model_name
        if not treq.stream:
            return JSONResponse(dialect.render_response(result, model))
        chunks = list(dialect.stream_response(result, model))

        async def body_iter():
            for c in chunks:
                yield c

        return StreamingResponse(body_iter(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _read_json(self, request: Request) -> Any:
        ctype = request.headers.get("content-type")
        if ctype is not None:
            media = ctype.split(";")[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                raise ProxyError(f"the content-type must be application/json, got {ctype!r}", field="content-type")
        limit = self.server.max_body_bytes
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > limit:
                raise ProxyError(f"the request body is larger than {limit} bytes", status=413)
        if not raw.strip():
            raise ProxyError("the request body is empty; send a JSON object", field="body")

        def no_constants(name: str) -> Any:
            raise ValueError(f"{name} is not valid JSON")

        try:
            return json.loads(bytes(raw), parse_constant=no_constants)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ProxyError(f"the request body is not valid JSON: {exc}", field="body") from exc


class ProxyServer:
    """Runs the proxy app on TCP and a unix socket in a background thread. A context manager.

    Thread safety: ``open_episode``/``close_episode`` may be called from any thread while serving.
    """

    def __init__(self, policy: PolicyBackend, host: str = "127.0.0.1", port: int = 0,
                 uds: str | Path | None = None, *, max_context_tokens: int = 32768, default_max_tokens: int = 4096,
                 model_name: str | None = None, workers: int = 64, max_body_bytes: int = 64 << 20,
                 graceful_s: float = 5.0, log_level: str = "warning") -> None:
        self.policy = policy
        self.host = host
        self.requested_port = port
        self.requested_uds = Path(uds) if uds is not None else None
        self.limits = Limits(max_context=max_context_tokens, default_max_tokens=default_max_tokens)
        self.model_name = model_name or policy.name
        self.workers = workers
        self.max_body_bytes = max_body_bytes
        self.graceful_s = graceful_s
        self.log_level = log_level
        self.registry = SessionRegistry()
        self.created = time.time()
        self.app = _App(self).app
        self.port: int | None = None
        self.socket_path: Path | None = None
        self._tmpdir: str | None = None
        self._sockets: list[socket.socket] = []
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the TCP listener (loopback when bound to all interfaces)."""
        if self.port is None:
            raise ProxyError("the proxy is not running; call start() first", status=503)
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "[::1]" if self.host == "::" else self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "ProxyServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> "ProxyServer":
        """Bind, serve in a daemon thread and return once connections are accepted (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return self
            try:
                self._start(timeout)
            except BaseException as exc:
                self._teardown(timeout=2.0)
                if isinstance(exc, OSError):
                    raise ProxyError(f"the proxy could not start: {exc}", status=503) from exc
                raise
        return self

    def _start(self, timeout: float) -> None:
        family = socket.getaddrinfo(self.host, self.requested_port, type=socket.SOCK_STREAM)[0][0]
        tcp = socket.socket(family, socket.SOCK_STREAM)
        self._sockets.append(tcp)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((self.host, self.requested_port))
        tcp.listen(1024)
        self.port = tcp.getsockname()[1]
        if self.requested_uds is None:
            self._tmpdir = tempfile.mkdtemp(prefix="clawgym-proxy-")
            path = Path(self._tmpdir) / "proxy.sock"
        else:
            path = self.requested_uds
            if path.is_socket():
                path.unlink()  # a stale socket of an earlier run
            elif path.exists():
                raise ProxyError(f"cannot create the unix socket at {path}: a non-socket file is there")
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sockets.append(unix)
        unix.bind(str(path))
        self.socket_path = path
        os.chmod(path, 0o666)  # sandboxes run as other uids; the episode token is the access control
        unix.listen(1024)
        self._executor = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="clawgym-proxy")
        config = uvicorn.Config(self.app, lifespan="off", log_config=None, log_level=self.log_level,
                                access_log=False, proxy_headers=False, server_header=False, loop="asyncio",
                                timeout_graceful_shutdown=int(max(1, self.graceful_s)))
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": list(self._sockets)},
                                        name=f"clawgym-proxy-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive():
                raise ProxyError("the proxy server thread exited during startup (see the log)", status=503)
            if time.monotonic() > deadline:
                raise ProxyError(f"the proxy did not start within {timeout:.0f}s", status=503)
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1" if self.host in ("0.0.0.0", "") else self.host, self.port),
                                      timeout=5):
            pass

    def stop(self, timeout: float | None = None) -> None:
        """Stop serving: graceful first (in-flight responses finish), then forced. Idempotent."""
        with self._lock:
            self._teardown(timeout=self.graceful_s + 2 if timeout is None else timeout)

    def _teardown(self, timeout: float) -> None:
        server, thread = self._uvicorn, self._thread
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(timeout)
            if thread.is_alive():
                server.force_exit = True
                thread.join(timeout)
            if thread.is_alive():
                log.warning("the proxy thread did not exit; abandoning it (daemon thread)")
        for sock in self._sockets:
            try:
                sock.close()
            except OSError:
                pass
        if self.socket_path is not None and self.socket_path.is_socket():
            try:
                self.socket_path.unlink()
            except OSError:
                pass
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._sockets, self._uvicorn, self._thread, self._executor = [], None, None, None
        self._tmpdir, self.socket_path, self.port = None, None, None

    def open_episode(self, episode_id: str | None = None, *, task: Any = None, harness: str | None = None,
                     sampling: dict[str, Any] | None = None, policy_version: int | None = None) -> EpisodeSession:
        """Register an episode; its harness uses ``session.base_url(server.url)`` (or the socket)."""
        return self.registry.open(episode_id, task=task, harness=harness, sampling=sampling,
                                  policy_version=policy_version)

    def close_episode(self, token: str) -> list[CallRecord]:
        """Unregister an episode and return its calls in order; its token is unknown afterwards.

        Raises :class:`ProxyError` (status 404) for an unknown or already closed token.
        """
        return self.registry.close(token)

    def get_episode(self, token: str) -> EpisodeSession | None:
        return self.registry.get(token)


def serve_proxy(policy: PolicyBackend, host: str = "127.0.0.1", port: int = 8000, *,
                uds: str | Path | None = None, episode_id: str | None = None, task: Any = None,
                harness: str | None = None, sampling: dict[str, Any] | None = None,
                calls_out: str | Path | None = None, announce: Callable[[str], Any] = print,
                stop_event: threading.Event | None = None, **server_kwargs: Any) -> list[CallRecord]:
    """Serve in the foreground with one open episode until SIGINT/SIGTERM (or ``stop_event``).

    Announces the episode's base URL; returns its calls and writes them as JSONL to ``calls_out``
    if given. ``server_kwargs`` go to :class:`ProxyServer` (``max_context_tokens``, ``model_name``...).
    Signal handlers are installed only when called from the main thread (and restored after).
    """
    stop = stop_event or threading.Event()
    restore: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            restore[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        with ProxyServer(policy, host, port, uds, **server_kwargs) as server:
            session = server.open_episode(episode_id, task=task, harness=harness, sampling=sampling)
            announce(f"clawgym proxy: policy {policy.name!r}; OpenAI base URL {session.base_url(server.url)} "
                     f"(unix socket {server.socket_path}); Anthropic base URL "
                     f"{session.base_url(server.url).removesuffix('/v1')}; Ctrl-C to stop")
            while not stop.wait(0.5):
                pass
            calls = server.close_episode(session.token)
    finally:
        for sig, handler in restore.items():
            signal.signal(sig, handler)
    if calls_out is not None:
        write_jsonl(calls_out, calls)
        announce(f"wrote {len(calls)} call(s) to {calls_out}")
    return calls
