"""Episodes (the registry behind ``/ep/<token>/``) and the types of the dialect-neutral call pipeline
(the pipeline itself: :mod:`~clawgym_env.proxy.turn`).

Invariants:
  * A token is ``secrets.token_urlsafe(24)``; it is the only key to an episode. Once closed, a token
    is unknown forever (tokens are never reused) and its episode accepts no more records. While open
    it is a registered secret (:mod:`clawgym_env.redact`), so it never reaches a record or a log.
  * ``EpisodeSession.calls`` is append-only, in completion order, ``calls[i].call_index == i``;
    appends happen under the session's lock, so concurrent calls of one episode are safe.
  * Every non-2xx answer the proxy gives for an episode is kept, redacted, in ``session.failures``
    (a :class:`CallFailure` naming the boundary at fault); it stays readable after the close.
  * With ``calls_path`` a session appends each record as one flushed JSON line (file 0600) and keeps
    in memory only what splicing needs (output ids, response turn, generation tail), so memory does
    not grow with prompts; ``close()`` reads the records back from that file.
  * ``recorded_bytes`` counts the bytes of every record appended (the line written, or about what the
    record takes as JSON when kept in memory: :func:`record_bytes`); ``memory_bytes`` the part kept in
    memory. The app refuses calls past their bounds (:mod:`~clawgym_env.proxy.guards.bounds`).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TextIO

from clawgym_env.capture.records import CallRecord, Dialect, dump_record, read_calls
from clawgym_env.errors import ProxyError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.base import SamplingOverrides, SamplingParams
from clawgym_env.proxy.deltas import Segmentation
from clawgym_env.proxy.guards.limits import CHARS_PER_TOKEN_BOUND
from clawgym_env.proxy.incremental import PromptCache
from clawgym_env.proxy.recorded import approx_json_bytes
from clawgym_env.redact import forget_secret, redact, register_secret
from clawgym_env.task import Task

_SECRET_HEADERS = {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie", "set-cookie"}
_SECRET_WORDS = ("key", "token", "secret", "auth", "password")


def redact_headers(headers: Any) -> dict[str, str]:
    """Request headers worth keeping, with credential-like values replaced by ``"<redacted>"``."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if low in _SECRET_HEADERS or any(w in low for w in _SECRET_WORDS):
            out[low] = "<redacted>"
        elif low not in ("content-length", "connection", "host"):
            out[low] = value
    return out


Boundary = Literal["client", "policy", "proxy"]
_POLICY_CODES = {"context_length_exceeded", "prompt_too_long", "policy_error", "queue_timeout"}


@dataclasses.dataclass
class CallFailure:
    """One non-2xx answer the proxy gave for an episode.

    ``boundary``: ``"client"`` — the harness sent a bad request (the agent's side); ``"policy"`` — the
    policy/backend failed, the context overflowed or a queue timed out; ``"proxy"`` — the proxy was
    shutting down or hit an internal error. ``message`` is redacted (no secrets).
    """

    status: int
    code: str
    message: str
    boundary: Boundary
    at: float


def failure_boundary(status: int, code: str | None) -> Boundary:
    """Which side a non-2xx answer blames (see :class:`CallFailure`)."""
    if code in _POLICY_CODES or status in (502, 504):
        return "policy"
    if status >= 500:
        return "proxy"
    return "client"


@dataclasses.dataclass
class _SpliceStub:
    """What :func:`splice_prompt` reads of an earlier call, kept when records stream to disk."""

    prompt_token_ids: list[int]  # the generation-prompt opener and tail only
    output_token_ids: list[int]
    response_message: JSONObject


class EpisodeSession:
    """One episode's view of the proxy: its token, its overrides and its recorded calls."""

    def __init__(self, episode_id: str, *, task: Task | None = None, harness: str | None = None,
                 sampling: SamplingOverrides | Mapping[str, Any] | None = None, policy_version: int | None = None,
                 calls_path: str | Path | None = None) -> None:
        overrides = SamplingOverrides.of(sampling)  # ProxyError naming the field when invalid
        self.episode_id = episode_id
        self.token = secrets.token_urlsafe(24)
        self.task = task
        self.harness = harness
        self.sampling_overrides = overrides
        self.policy_version = policy_version
        self.calls: list[CallRecord] = []  # stays empty with calls_path (records are on disk)
        self.failures: list[CallFailure] = []
        self.prompts = PromptCache()
        """The last few prompts built for this episode, so a call renders only what it appended."""
        self.closed = False
        self.created_at = time.time()
        self.socket_path: Path | None = None  # this episode's own unix socket (set by the server)
        self.calls_path = Path(calls_path) if calls_path is not None else None
        self._count = 0
        self._stubs: list[_SpliceStub] = []
        self._fh: TextIO | None = None
        self._lock = threading.Lock()
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)
        self.recorded_bytes = 0
        """bytes of the records appended so far (see the module invariants)"""
        self.memory_bytes = 0
        """the part of ``recorded_bytes`` kept in memory (0 with ``calls_path``)"""

    def call_started(self) -> None:
        """Note a call that has begun (rendering or generating); pair with :meth:`call_ended`."""
        with self._lock:
            self._in_flight += 1

    def call_ended(self) -> None:
        """Note that a call begun with :meth:`call_started` is recorded or failed."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            if not self._in_flight:
                self._idle.notify_all()

    @property
    def in_flight(self) -> int:
        """Calls begun and neither recorded nor failed yet (e.g. a slow answer whose client gave up)."""
        with self._lock:
            return self._in_flight

    def wait_idle(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for the calls in flight to end; how many are still in flight."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._idle:
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._idle.wait(left)
            return self._in_flight

    def start_capture(self) -> None:
        """Create (truncate) ``calls_path``, mode 0600, for the records to stream to (no-op without it)."""
        if self.calls_path is None:
            return
        try:
            self.calls_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.calls_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ProxyError(f"cannot write the calls file {self.calls_path}: {exc.strerror}; pass a writable "
                             "calls_path", status=503, field="calls_path") from exc
        os.fchmod(fd, 0o600)  # also when the file existed with wider modes
        self._fh = os.fdopen(fd, "w", encoding="utf-8")

    def base_url(self, host_url: str) -> str:
        """The OpenAI-style base URL a harness should use, e.g. ``http://127.0.0.1:PORT/ep/<tok>/v1``."""
        return f"{host_url.rstrip('/')}/ep/{self.token}/v1"

    def append(self, record: CallRecord) -> bool:
        """Record a call (its ``call_index`` is set here). False if the episode is already closed."""
        size = record_bytes(record) if self.calls_path is None else 0  # counted outside the lock
        with self._lock:
            if self.closed:
                return False
            record.call_index = self._count
            if self._fh is None:
                self.calls.append(record)
                self.memory_bytes += size
            else:
                line = dump_record(record) + "\n"  # redacted; never raises on odd values
                self._fh.write(line)
                self._fh.flush()
                self._stubs.append(_stub(record))
                size = len(line)
            self.recorded_bytes += size
            self._count += 1
            return True

    def fail(self, status: int, code: str | None, message: str) -> CallFailure:
        """Keep a non-2xx answer (redacted) in ``failures``; allowed after the close too."""
        failure = CallFailure(status=status, code=code or "error", message=redact(message),
                              boundary=failure_boundary(status, code), at=time.time())
        with self._lock:
            self.failures.append(failure)
        return failure

    @property
    def num_calls(self) -> int:
        """How many calls this episode has recorded so far."""
        with self._lock:
            return self._count

    def snapshot(self) -> list[Any]:
        """The calls recorded so far as splicing needs them (a copy, safe while others append):
        the records themselves, or light stubs when the records stream to ``calls_path``."""
        with self._lock:
            return list(self.calls) if self._fh is None else list(self._stubs)

    def close(self) -> list[CallRecord]:
        """Close (idempotent) and return every recorded call in order."""
        with self._lock:
            self.closed = True
            self.prompts.clear()
            path = self.calls_path
            if path is None:  # records kept in memory (the calls file is only ever opened at a path)
                return list(self.calls)
            if self._fh is None:
                return read_calls(path)
            self._fh.close()
            self._fh = None
            self._stubs = []
        return read_calls(path)


def record_bytes(record: CallRecord) -> int:
    """About the bytes ``record`` takes as JSON: its request, response and tokens (ids and logprobs at their
    longest), plus 1 KiB for the rest."""
    tokens = len(record.prompt_token_ids) + len(record.output_token_ids)
    return (approx_json_bytes(record.request) + approx_json_bytes(record.response_message) + 8 * tokens
            + 24 * len(record.output_logprobs) + 1024)


_STUB_PROMPT_TAIL = 256  # the generation prompt's opener and tail are a handful of ids at the very end


def _stub(record: CallRecord) -> _SpliceStub:
    prompt = record.prompt_token_ids
    return _SpliceStub(prompt_token_ids=list(prompt[-_STUB_PROMPT_TAIL:]),
                       output_token_ids=list(record.output_token_ids), response_message=record.response_message)


class SessionRegistry:
    """Thread-safe map token → open :class:`EpisodeSession`."""

    def __init__(self) -> None:
        self._by_token: dict[str, EpisodeSession] = {}
        self._lock = threading.Lock()

    def open(self, episode_id: str | None = None, *, task: Task | None = None, harness: str | None = None,
             sampling: SamplingOverrides | Mapping[str, Any] | None = None, policy_version: int | None = None,
             calls_path: str | Path | None = None) -> EpisodeSession:
        """Register a new session (the keywords are :class:`EpisodeSession`'s; no id: a fresh one)."""
        session = EpisodeSession(episode_id or "ep-" + uuid.uuid4().hex[:12], task=task, harness=harness,
                                 sampling=sampling, policy_version=policy_version, calls_path=calls_path)
        with self._lock:
            if any(s.episode_id == session.episode_id for s in self._by_token.values()):
                raise ProxyError(f"episode {session.episode_id!r} is already open; close it first or pick "
                                 "another id", field="episode_id", code="duplicate_episode")
            self._by_token[session.token] = session
        try:
            session.start_capture()  # only now: a duplicate id must not truncate a live episode's file
        except BaseException:
            with self._lock:
                self._by_token.pop(session.token, None)
            raise
        register_secret(session.token)  # a bearer token: redacted from records, logs and error bodies
        return session

    def get(self, token: str) -> EpisodeSession | None:
        """The open session with this bearer ``token``; ``None`` when unknown or closed."""
        with self._lock:
            return self._by_token.get(token)

    def close(self, token: str) -> list[CallRecord]:
        """Close the session of ``token`` and return its calls; the token is then forgotten (404 for
        ever after, no longer redacted as a secret)."""
        with self._lock:
            session = self._by_token.pop(token, None)
        if session is None:
            raise ProxyError("unknown or already closed episode token", status=404, code="episode_not_found")
        forget_secret(token)  # unknown forever now, and the registry of secrets stays small
        return session.close()

    def memory_bytes(self) -> int:
        """Bytes of records the open episodes keep in memory (:attr:`EpisodeSession.memory_bytes`)."""
        with self._lock:
            sessions = list(self._by_token.values())
        return sum(s.memory_bytes for s in sessions)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_token)


@dataclasses.dataclass
class TurnRequest:
    """A chat request reduced to what the pipeline needs (OpenAI-chat message shape)."""

    messages: list[JSONObject]
    tools: list[JSONObject]  # offered to the template (already empty for tool_choice "none")
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = dataclasses.field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    want_logprobs: bool = False
    model: str | None = None
    enable_thinking: bool | None = None
    tool_id_prefix: str = "call_"  # tool-call ids are this prefix + 24 hex digits (Anthropic: "toolu_")
    source: Any = dataclasses.field(default=None, repr=False, compare=False)
    """the request model the dialect validated (its record keeps the body along it: proxy/recorded.py)"""


@dataclasses.dataclass
class TurnMeta:
    """Where the request came from (goes into the record verbatim)."""

    dialect: Dialect
    path: str
    body: JSONObject
    headers: dict[str, str]
    started_at: float


@dataclasses.dataclass
class TurnResult:
    """One served turn, dialect-neutral: the record plus what a dialect needs to render or stream it."""

    request: TurnRequest
    record: CallRecord
    pieces: list[str]  # one text piece per recorded output token
    seg: Segmentation
    message: JSONObject  # the assistant message, OpenAI chat shape (tool-call ids included)
    finish_reason: str  # "stop" | "length" | "tool_calls"
    logprobs: list[float]
    token_bytes: list[bytes] | None = None  # per output token, only when the request asked for logprobs
    stop_sequence: str | None = None  # the stop string that cut the output, if one did

    @property
    def prompt_tokens(self) -> int:
        """Prompt length in tokens (the usage a dialect reports)."""
        return len(self.record.prompt_token_ids)

    @property
    def completion_tokens(self) -> int:
        """Output length in tokens, as recorded (the usage a dialect reports)."""
        return len(self.record.output_token_ids)


@dataclasses.dataclass
class Limits:
    """The proxy's per-call size limits: the context in tokens, the default output budget, and the
    prompt size in characters checked before tokenising (0: a bound derived from ``max_context``)."""

    max_context: int = 32768
    default_max_tokens: int = 4096
    max_prompt_chars: int = 0  # 0: CHARS_PER_TOKEN_BOUND characters per token of max_context

    def __post_init__(self) -> None:
        if self.max_prompt_chars <= 0:
            self.max_prompt_chars = self.max_context * CHARS_PER_TOKEN_BOUND


def resolve_sampling(req: TurnRequest, overrides: SamplingOverrides, prompt_len: int,
                     limits: Limits) -> SamplingParams:
    """Request values, replaced by the episode's overrides; max_tokens also capped by the context."""
    max_tokens = req.max_tokens or limits.default_max_tokens
    if overrides.max_tokens is not None:
        max_tokens = min(max_tokens, overrides.max_tokens)
    max_tokens = max(1, min(max_tokens, limits.max_context - prompt_len))

    def pick(key: str, requested: Any, default: Any) -> Any:
        override = getattr(overrides, key)
        if override is not None:
            return override
        return default if requested is None else requested

    stop = pick("stop", req.stop or None, [])
    return SamplingParams(max_tokens=max_tokens, temperature=float(pick("temperature", req.temperature, 1.0)),
                          top_p=float(pick("top_p", req.top_p, 1.0)),
                          stop=[stop] if isinstance(stop, str) else list(stop), seed=pick("seed", req.seed, None))
