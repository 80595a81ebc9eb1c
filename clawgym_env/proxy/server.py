"""The serving proxy: a starlette app, run by uvicorn in a background thread (or the foreground).

Routes: every registered dialect's own, e.g. ``POST /ep/{token}/v1/chat/completions`` (OpenAI chat dialect),
``/v1/messages`` (Anthropic Messages; ``/v1/messages/count_tokens`` is a side route), ``/v1/responses``
(OpenAI Responses), ``GET /ep/{token}/v1/models``
(and ``/models/{id}``), ``GET /healthz``. A dialect is a registered module that declares its routes
(:mod:`~clawgym_env.proxy.dialects.contract`), mounted when the server starts; the app (``app.py``) reads the
body, looks up the episode, lets the dialect parse, runs the dialect-neutral pipeline
(:func:`~clawgym_env.proxy.turn.run_turn`) in a worker thread (a live stream: its short halves on the
loop, see :mod:`~clawgym_env.proxy.turn`), and lets the dialect render or stream the result.

Invariants:
  * Streaming is emitted *after* the policy generated the whole continuation (``generate`` is
    blocking and runs in a thread pool, so the event loop keeps serving other episodes meanwhile).
    A call is recorded once its response is ready, just before it is sent. A streaming turn still
    running after ``keepalive_s`` gets a 200 and keep-alive events meanwhile, and a failure after that
    point is an in-stream error event (see :mod:`~clawgym_env.proxy.stream.keepalive`). The exception: a
    text-level policy that streams (``policy.streams_text``, a passthrough) is served live, its text sent
    as it arrives and the call recorded when its stream ends (see :mod:`~clawgym_env.proxy.stream.live`).
  * Every answer is JSON in the dialect's error shape: bad input → 4xx naming the field, an unknown
    token → 404, a policy failure → 502, shutting down → 503; 500 (type ``server_error``) only for a
    genuine bug in the proxy, which is logged with its traceback.
  * The same app listens on TCP (``url``) and on a shared unix socket (``socket_path``, mode 0666
    inside a private 0700 directory unless a path was given) for host-side clients, and on one unix
    socket per episode (``session.socket_path``, see :mod:`~clawgym_env.proxy.listeners`), the only
    path a sandbox gets. A request on an episode's socket is served only for that episode's token;
    any other token is answered exactly like an unknown one (404) and touches no other episode.
  * ``/healthz`` says ``{"status": "ok"}`` and nothing else (no policy, paths or episode counts).
  * Every non-2xx answer for a known episode is kept on ``session.failures`` (boundary-classified,
    redacted); error messages are redacted before they leave (:func:`clawgym_env.redact.redact`).
  * Bounds (see :mod:`~clawgym_env.proxy.guards.limits`): body bytes and per-read time, JSON depth, prompt
    characters before tokenising; idle/stalled connections are closed; a client that disconnects
    mid-body is logged as a disconnect. Resource bounds per episode and overall (``bounds``, a
    :class:`~clawgym_env.proxy.guards.bounds.ProxyLimits`; see :mod:`~clawgym_env.proxy.guards.bounds`): connections,
    request bytes in flight (JSON values counted), unknown fields and bytes recorded. ``budget.usage()``
    says where the server stands.
  * ``close_episode`` first waits up to ``drain_s`` for the episode's calls still in flight (a slow answer
    whose client gave up and retried is recorded, as a dead attempt, rather than lost); a call that ends
    later still is not recorded, and is logged with the episode's id.
  * ``start()`` loads the policy's tokenizer and compiles its chat template before it returns
    (:func:`~clawgym_env.proxy.turn.warm_up`): no call pays it. The HTTP parser is ``httptools`` and the
    loop ``uvloop`` when importable (``http``/``loop``: ``h11``/``asyncio`` to force the pure-Python ones).
  * ``start()`` and ``stop()`` are idempotent; a failed ``start()`` leaves no thread, socket or
    directory behind; ``stop()`` shuts down gracefully, then forcibly, and removes the socket.
"""

from __future__ import annotations

import concurrent.futures
import logging
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import uvicorn

from clawgym_env.capture.records import CallRecord
from clawgym_env.errors import ProxyError
from clawgym_env.policy.base import PolicyBackend, SamplingOverrides
from clawgym_env.proxy.app import ProxyApp
from clawgym_env.proxy.guards.bounds import Budget, ProxyLimits
from clawgym_env.proxy.guards.limits import DEFAULT_MAX_JSON_DEPTH
from clawgym_env.proxy.listeners import (
    EPISODE_STATE_KEY,
    MAX_HEAD_BYTES,
    PARSERS,
    Server,
    guarded_protocol,
    tcp_listener,
    unix_listener,
)
from clawgym_env.proxy.sessions import EpisodeSession, Limits, SessionRegistry
from clawgym_env.proxy.turn import INLINE_BODY_BYTES, warm_up
from clawgym_env.task import Task

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("clawgym.proxy")
LOOPS = ("auto", "uvloop", "asyncio")
"""event loops the proxy runs on (``auto``: ``uvloop`` when importable, as uvicorn picks it)"""


class ProxyServerOptions(TypedDict, total=False):
    """The keyword-only options of :class:`ProxyServer` (what :func:`serve_proxy` passes through)."""

    max_context_tokens: int
    default_max_tokens: int
    model_name: str | None
    workers: int
    bounds: ProxyLimits | None
    graceful_s: float
    log_level: str
    max_prompt_chars: int
    max_json_depth: int
    read_timeout_s: float
    idle_timeout_s: float
    keepalive_s: float
    drain_s: float
    http: str
    loop: str
    inline_bytes: int


class ProxyServer:
    """Runs the proxy app on TCP and a unix socket in a background thread. A context manager.

    Thread safety: ``open_episode``/``close_episode`` may be called from any thread while serving.
    """

    def __init__(self, policy: PolicyBackend, host: str = "127.0.0.1", port: int = 0,
                 uds: str | Path | None = None, *, max_context_tokens: int = 32768, default_max_tokens: int = 4096,
                 model_name: str | None = None, workers: int = 64, bounds: ProxyLimits | None = None,
                 graceful_s: float = 5.0, log_level: str = "warning", max_prompt_chars: int = 0,
                 max_json_depth: int = DEFAULT_MAX_JSON_DEPTH, read_timeout_s: float = 60.0,
                 idle_timeout_s: float = 60.0, keepalive_s: float = 5.0, drain_s: float = 10.0,
                 http: str = "auto", loop: str = "auto", inline_bytes: int = INLINE_BODY_BYTES) -> None:
        if drain_s < 0:
            raise ValueError(f"drain_s={drain_s!r} must be >= 0 (seconds close_episode waits for calls in flight)")
        self.policy = policy
        self.host = host
        self.requested_port = port
        self.requested_uds = Path(uds) if uds is not None else None
        self.limits = Limits(max_context=max_context_tokens, default_max_tokens=default_max_tokens,
                             max_prompt_chars=max_prompt_chars)
        self.max_json_depth = max_json_depth
        self.read_timeout_s = read_timeout_s  # the longest wait for the next chunk of a request body
        self.idle_timeout_s = idle_timeout_s  # a connection with no request in progress this long is closed
        self.keepalive_s = keepalive_s  # a streaming turn running this long gets keep-alives (0: never)
        self.drain_s = drain_s  # close_episode waits this long for the episode's calls in flight
        if http not in PARSERS:
            raise ValueError(f"http={http!r}: use one of {list(PARSERS)} (auto: httptools when installed, else h11)")
        if loop not in LOOPS:
            raise ValueError(f"loop={loop!r}: use one of {list(LOOPS)} (auto: uvloop when installed, else asyncio)")
        self.http, self.loop = http, loop
        self.inline_bytes = inline_bytes  # a live call with a body this small is prepared on the loop (turn.py)
        self.warmed = False  # the policy's tokenizer is loaded and its template compiled (start())
        self.model_name = model_name or policy.name
        self.workers = workers
        self.bounds = bounds if bounds is not None else ProxyLimits()  # resource bounds (proxy/bounds.py)
        self.budget = Budget(self.bounds)
        self.graceful_s = graceful_s
        self.log_level = log_level
        self.registry = SessionRegistry()
        self.created = time.time()
        self.app = ProxyApp(self).app
        self.port: int | None = None
        self.socket_path: Path | None = None
        self._tmpdir: str | None = None
        self._episode_dir: str | None = None
        self._episode_listeners: dict[str, tuple[socket.socket, Any, Path]] = {}
        self._sockets: list[socket.socket] = []
        self._uvicorn: Server | None = None
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
        """Whether the server thread is alive (started and not stopped or crashed)."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> ProxyServer:
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
        if not self.warmed:  # the first call must not pay it, and nothing may ever load it on the event loop
            try:
                log.debug("proxy warm-up (tokenizer, chat template): %.3f s", warm_up(self.policy))
                self.warmed = True
            except Exception as exc:  # noqa: BLE001 - each call reports its own failure; the server still serves
                log.warning("the policy's tokenizer could not be warmed up (%s: %s); calls will load it themselves",
                            type(exc).__name__, exc)
        tcp = tcp_listener(self.host, self.requested_port)
        self._sockets.append(tcp)
        self.port = tcp.getsockname()[1]
        self._tmpdir = tempfile.mkdtemp(prefix="clawgym-proxy-")  # 0700: host users cannot reach inside
        self._episode_dir = self._tmpdir
        path = Path(self._tmpdir) / "proxy.sock" if self.requested_uds is None else self.requested_uds
        self._sockets.append(unix_listener(path))  # 0666: host-side clients of other uids may connect
        self.socket_path = path
        self._executor = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="clawgym-proxy")
        config = uvicorn.Config(self.app, interface="asgi3", lifespan="off", log_config=None, log_level=self.log_level,
                                access_log=False, proxy_headers=False, server_header=False, loop=self.loop,
                                http=guarded_protocol(self.idle_timeout_s, self.http, self.budget),
                                h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                                timeout_keep_alive=max(1, int(min(self.idle_timeout_s, 5))),
                                timeout_graceful_shutdown=int(max(1, self.graceful_s)))
        self._uvicorn = Server(config)
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
        for sock, _, path in self._episode_listeners.values():
            sock.close()
            path.unlink(missing_ok=True)
        self._episode_listeners = {}
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._sockets, self._uvicorn, self._thread, self._executor = [], None, None, None
        self._tmpdir, self._episode_dir, self.socket_path, self.port = None, None, None, None

    def open_episode(self, episode_id: str | None = None, *, task: Task | None = None, harness: str | None = None,
                     sampling: SamplingOverrides | Mapping[str, Any] | None = None, policy_version: int | None = None,
                     calls_path: str | Path | None = None) -> EpisodeSession:
        """Register an episode; its harness uses ``session.base_url(server.url)`` on the host, or its own
        unix socket ``session.socket_path`` (created here while the server runs; give it to the sandbox).

        With ``calls_path`` each captured call is appended there as one flushed JSON line (0600) instead
        of being kept in memory; :meth:`close_episode` still returns every call.
        """
        session = self.registry.open(episode_id, task=task, harness=harness, sampling=sampling,
                                     policy_version=policy_version, calls_path=calls_path)
        with self._lock:
            server, folder = self._uvicorn, self._episode_dir
            if server is None or folder is None or not server.started:
                return session
            path = Path(folder) / f"ep-{secrets.token_hex(8)}.sock"
            try:
                sock = unix_listener(path)
                handle = server.add_listener(sock, {EPISODE_STATE_KEY: session.token})
            except BaseException:
                self.registry.close(session.token)
                path.unlink(missing_ok=True)
                raise
            self._episode_listeners[session.token] = (sock, handle, path)
        session.socket_path = path
        return session

    def close_episode(self, token: str) -> list[CallRecord]:
        """Unregister an episode, remove its socket and return its calls in order; its token is unknown
        afterwards (its ``session.failures`` stay readable). Calls still in flight get up to ``drain_s``
        to be recorded first (see the module invariants).

        Raises :class:`ProxyError` (status 404) for an unknown or already closed token.
        """
        session = self.registry.get(token)
        if session is not None and self.drain_s > 0:
            left = session.wait_idle(self.drain_s)
            if left:
                log.warning("episode %s: %d call(s) still in flight after %.1f s are not recorded",
                            session.episode_id, left, self.drain_s)
        with self._lock:
            listener = self._episode_listeners.pop(token, None)
            server = self._uvicorn
        if listener is not None:
            sock, handle, path = listener
            if server is not None:
                server.remove_listener(handle)
            sock.close()
            path.unlink(missing_ok=True)
        return self.registry.close(token)

    def get_episode(self, token: str) -> EpisodeSession | None:
        """The open episode with this bearer ``token``; ``None`` when unknown or closed."""
        return self.registry.get(token)


def serve_proxy(policy: PolicyBackend, host: str = "127.0.0.1", port: int = 8000, *,
                uds: str | Path | None = None, episode_id: str | None = None, task: Task | None = None,
                harness: str | None = None, sampling: SamplingOverrides | Mapping[str, Any] | None = None,
                calls_out: str | Path | None = None, announce: Callable[[str], Any] = print,
                stop_event: threading.Event | None = None,
                **server_options: Unpack[ProxyServerOptions]) -> list[CallRecord]:
    """Serve in the foreground with one open episode until SIGINT/SIGTERM (or ``stop_event``).

    Announces the episode's base URL; returns its calls and streams them as JSONL (0600) to ``calls_out``
    if given. ``server_options`` go to :class:`ProxyServer` (:class:`ProxyServerOptions`: ``max_context_tokens``,
    ``model_name``, ``bounds``...).
    Signal handlers are installed only when called from the main thread (and restored after).
    """
    stop = stop_event or threading.Event()
    restore: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            restore[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        with ProxyServer(policy, host, port, uds, **server_options) as server:
            session = server.open_episode(episode_id, task=task, harness=harness, sampling=sampling,
                                          calls_path=calls_out)
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
        announce(f"wrote {len(calls)} call(s) to {calls_out}")
    return calls
