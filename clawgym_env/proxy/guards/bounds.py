"""The proxy's resource bounds: what one episode, and all of them together, may hold of the proxy.

:class:`ProxyLimits` states the bounds (``ProxyServer(limits=...)``); :class:`Budget` keeps the count
against them while the server runs, and each request holds a :class:`Ticket` on it until its answer
has been sent.

Invariants (with the default limits in brackets):
  * **Connections.** At most ``max_connections`` (1024) connections are served at once over every
    listener, at most ``max_episode_connections`` (32) per episode: the connections open on its own unix
    socket plus its requests in progress on the shared listeners. A request on a connection past a bound
    is answered from its head alone — 429 (``episode_connection_limit``) or 503
    (``proxy_connection_limit``) in its dialect's error shape, then the connection is closed — and costs
    no body memory (the server reads no more than one 64 KiB buffer of a body nobody reads). Connections
    past an episode's bound do not count toward the proxy's (one episode cannot fill it), and a connection
    past twice a bound is closed at once, unanswered: an episode holds at most twice its bound of
    connections open, the proxy twice its own.
  * **Bytes in flight.** A request is charged for its body bytes as they arrive, plus
    :data:`VALUE_BYTES` per JSON value once the body is complete (an upper bound on what parsing it
    costs: a Python object per value); the charge is released once its answer has been sent (streamed
    answers included). At most ``max_inflight_bytes`` (256 MiB) are charged overall and at most
    ``max_episode_inflight_bytes`` (32 MiB) per episode; a request whose charge would pass a bound is
    refused at once: 429 (``episode_inflight_limit``) or 503 (``proxy_inflight_limit``). So the request
    bodies the proxy holds, raw or parsed, are bounded by these numbers, whatever the clients send.
  * **One body.** At most ``max_body_bytes`` (16 MiB, every field counted) and ``max_json_values``
    (262,144, counted before parsing) per request: 413 (``request_too_large``). The defaults let one
    request of the largest size always fit its episode's share
    (``max_body_bytes + VALUE_BYTES * max_json_values <= max_episode_inflight_bytes``).
  * **Records.** Fields a dialect does not read are recorded up to ``max_unknown_bytes`` (64 KiB) per
    request; the rest are left out, and one marker field says how many
    (:mod:`~clawgym_env.proxy.recorded`). An episode records at
    most ``max_episode_recorded_bytes`` (512 MiB) of calls: past it a call is refused before it runs
    with 413 (``episode_record_limit``); the records open episodes keep in memory (those without a
    calls file) total at most ``max_recorded_bytes`` (2 GiB): past it, a call of such an episode is
    refused with 503 (``proxy_record_limit``), while episodes with a calls file are still served.
    Each bound may be passed by the one call that crossed it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from typing import Literal, TypedDict

from clawgym_env.errors import ProxyError

VALUE_BYTES = 64
"""Bytes charged per JSON value of a body: about what a parsed value costs (an empty dict is 64 bytes, a
list slot 8 more; a string's text is already charged as body bytes)."""

Verdict = Literal["proxy", "episode", "drop"] | None
"""Which connection bound a connection is past: ``"proxy"`` (overall), ``"episode"``, ``"drop"`` (past twice a
bound: closed at once, unanswered) or None (within both)."""


@dataclasses.dataclass(frozen=True)
class Admission:
    """A connection's verdict and what it was counted in (``overall``, its ``episode``)."""

    verdict: Verdict
    overall: bool
    episode: bool


@dataclasses.dataclass(frozen=True)
class ProxyLimits:
    """The proxy's resource bounds (see the module invariants for what each one refuses, and how).

    The defaults suit real harness prompts at a 64K context (a few hundred KB with their tool schemas,
    a few thousand JSON values) with a wide margin; raise them together with the context.
    """

    max_body_bytes: int = 16 << 20
    """the largest request body, in bytes, every field counted (413 past it)"""
    max_json_values: int = 1 << 18
    """the most JSON values one body may hold (counted from its bytes before parsing; 413 past it)"""
    max_unknown_bytes: int = 64 << 10
    """bytes of fields the dialect does not read recorded per request; the rest become a marker"""
    max_connections: int = 1024
    """connections served at once over every listener"""
    max_episode_connections: int = 32
    """connections on an episode's own socket plus its requests in progress on the shared listeners"""
    max_inflight_bytes: int = 256 << 20
    """bytes charged to the requests in flight overall (body bytes + VALUE_BYTES per JSON value)"""
    max_episode_inflight_bytes: int = 32 << 20
    """bytes charged to one episode's requests in flight"""
    max_recorded_bytes: int = 2 << 30
    """bytes of call records kept in memory by the open episodes (episodes with a calls file keep none)"""
    max_episode_recorded_bytes: int = 512 << 20
    """bytes of call records one episode may write (to memory or to its calls file)"""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ProxyLimits.{f.name}={value!r} must be a positive integer")
        pairs = [("max_episode_connections", "max_connections"),
                 ("max_episode_inflight_bytes", "max_inflight_bytes"),
                 ("max_body_bytes", "max_episode_inflight_bytes")]
        for small, large in pairs:
            if getattr(self, small) > getattr(self, large):
                raise ValueError(f"ProxyLimits.{small}={getattr(self, small)} is above {large}="
                                 f"{getattr(self, large)}; raise {large} too")
        largest = self.max_body_bytes + VALUE_BYTES * self.max_json_values
        if largest > self.max_episode_inflight_bytes:
            raise ValueError(f"ProxyLimits: one request of the largest size is charged up to {largest} bytes "
                             f"(max_body_bytes + {VALUE_BYTES} * max_json_values), above "
                             f"max_episode_inflight_bytes={self.max_episode_inflight_bytes}; raise "
                             "max_episode_inflight_bytes (and max_inflight_bytes) or lower the others")

    @classmethod
    def field_names(cls) -> list[str]:
        """The names of the limits, in order (what ``clawgym serve-proxy --limit NAME=VALUE`` accepts)."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_pairs(cls, pairs: list[str]) -> ProxyLimits:
        """The defaults with ``NAME=VALUE`` pairs applied (VALUE an integer, ``_`` allowed: ``16_777_216``);
        a ValueError naming the known names or the bad value otherwise."""
        values: dict[str, int] = {}
        for pair in pairs:
            name, sep, value = pair.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in cls.field_names():
                raise ValueError(f"{pair!r}: use NAME=VALUE with NAME one of {', '.join(cls.field_names())}")
            try:
                values[name] = int(value.strip())
            except ValueError:
                raise ValueError(f"{pair!r}: the value must be an integer (bytes or a count)") from None
        return cls(**values)


class BudgetUsage(TypedDict):
    """A snapshot of a :class:`Budget` (:meth:`Budget.usage`); per-episode counts by episode token."""

    connections: int
    inflight_bytes: int
    episode_inflight: dict[str, int]
    episode_connections: dict[str, int]
    peak_connections: int
    peak_inflight_bytes: int


class Budget:
    """The running count against a :class:`ProxyLimits` (thread safe; see the module invariants)."""

    def __init__(self, limits: ProxyLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._connections = 0
        self._episode_connections: Counter[str] = Counter()
        self._inflight = 0
        self._episode_inflight: Counter[str] = Counter()
        self._peak_inflight = 0
        self._peak_connections = 0

    def connect(self, token: str | None) -> Admission:
        """Count a new connection (``token``: the episode of the socket it came in on, if any) as the module
        invariants say; pair with :meth:`disconnect` (given the admission) unless it is to be dropped."""
        limits = self.limits
        with self._lock:
            if token is not None and self._episode_connections[token] >= limits.max_episode_connections:
                if self._episode_connections[token] >= 2 * limits.max_episode_connections:
                    return Admission("drop", False, False)
                self._episode_connections[token] += 1  # answered and closed: not one of the proxy's
                return Admission("episode", False, True)
            if self._connections >= limits.max_connections:
                if self._connections >= 2 * limits.max_connections:
                    return Admission("drop", False, False)
                verdict: Verdict = "proxy"
            else:
                verdict = None
            self._connections += 1
            self._peak_connections = max(self._peak_connections, self._connections)
            if token is not None:
                self._episode_connections[token] += 1
            return Admission(verdict, True, token is not None)

    def disconnect(self, token: str | None, admission: Admission) -> None:
        """Forget a connection counted by :meth:`connect`."""
        with self._lock:
            if admission.overall:
                self._connections -= 1
            if admission.episode and token is not None:
                self._drop(self._episode_connections, token, 1)

    def ticket(self) -> Ticket:
        """A new request's share of the budget (released by :meth:`Ticket.close`)."""
        return Ticket(self)

    def usage(self) -> BudgetUsage:
        """Current and peak counts: ``connections``, ``inflight_bytes``, per-episode ``episode_inflight``
        (token → bytes) and the peaks since start."""
        with self._lock:
            return {"connections": self._connections, "inflight_bytes": self._inflight,
                    "episode_inflight": dict(self._episode_inflight),
                    "episode_connections": dict(self._episode_connections),
                    "peak_connections": self._peak_connections, "peak_inflight_bytes": self._peak_inflight}

    @staticmethod
    def _drop(counter: Counter[str], token: str, n: int) -> None:
        left = counter[token] - n
        if left > 0:
            counter[token] = left
        else:
            counter.pop(token, None)


class Ticket:
    """One request's share: the episode it counts against and the bytes it is charged (see :class:`Budget`)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.token: str | None = None
        self.counted = False  # a request on a shared listener: one of its episode's connections
        self.charged = 0
        self._closed = False

    def enter(self, token: str, *, shared: bool, verdict: Verdict) -> None:
        """Bind the request to its episode; raise the connection refusal its connection (``verdict``) or, on a
        shared listener (``shared``), its episode's requests in progress call for."""
        b, limits = self.budget, self.budget.limits
        if verdict == "proxy":
            raise _refused("proxy_connection_limit", f"the proxy is serving {limits.max_connections} connections, "
                           "its limit (max_connections); retry later")
        with b._lock:
            self.token = token
            if shared:
                self.counted = True
                b._episode_connections[token] += 1
                over = b._episode_connections[token] > limits.max_episode_connections
            else:
                over = verdict == "episode"
        if over:
            raise _refused("episode_connection_limit", f"this episode has more than {limits.max_episode_connections} "
                           "connections or requests in progress (max_episode_connections); use fewer at once")

    def charge(self, n: int, what: str = "request bodies") -> None:
        """Charge ``n`` more bytes; raise 429/503 (nothing charged) when a bound would be passed."""
        b, limits, token = self.budget, self.budget.limits, self.token
        with b._lock:
            episode = b._episode_inflight[token] if token is not None else 0
            if token is not None and episode + n > limits.max_episode_inflight_bytes:
                raise ProxyError(f"this episode's {what} in flight would take {episode + n} bytes, over its limit of "
                                 f"{limits.max_episode_inflight_bytes} bytes (max_episode_inflight_bytes; each JSON "
                                 f"value counts {VALUE_BYTES} bytes); send fewer or smaller requests at once",
                                 status=429, field="body", code="episode_inflight_limit")
            if b._inflight + n > limits.max_inflight_bytes:
                raise ProxyError(f"the proxy holds {b._inflight} bytes of requests in flight; {n} more would pass "
                                 f"its limit of {limits.max_inflight_bytes} bytes (max_inflight_bytes); retry later",
                                 status=503, code="proxy_inflight_limit")
            b._inflight += n
            b._peak_inflight = max(b._peak_inflight, b._inflight)
            if token is not None:
                b._episode_inflight[token] += n
            self.charged += n

    def close(self) -> None:
        """Release the charge and the connection count (idempotent)."""
        if self._closed:
            return
        self._closed = True
        b = self.budget
        with b._lock:
            b._inflight -= self.charged
            if self.token is not None:
                if self.charged:
                    Budget._drop(b._episode_inflight, self.token, self.charged)
                if self.counted:
                    Budget._drop(b._episode_connections, self.token, 1)
        self.charged = 0


def _refused(code: str, message: str) -> ProxyError:
    status = 503 if code.startswith("proxy_") else 429
    return ProxyError(message, status=status, code=code)
