"""A policy reached over HTTP by token ids: a trainer's in-process policy for rollout workers elsewhere.

:func:`serve_policy` runs a small HTTP server in a thread around any
:class:`~clawgym_env.policy.base.PolicyBackend` (e.g. a trainer's serving copy of the model);
:class:`RemotePolicy` is the ``PolicyBackend`` a rollout worker on another node builds from the spec
``remote:http://HOST:PORT`` (registered in :data:`clawgym_env.plugins.policies`), with the server's
shared secret in the environment variable ``CLAWGYM_REMOTE_POLICY_TOKEN`` (:data:`TOKEN_ENV`)::

    server = serve_policy(policy, host=node_ip)         # server.url, server.token
    ...                                                 # on a worker, CLAWGYM_REMOTE_POLICY_TOKEN=server.token
    make_policy(f"remote:{server.url}").generate(ids, params, ctx)

Routes (JSON): ``POST /generate`` (:class:`GenerateRequest` → :class:`GenerateResponse`),
``GET /info`` (:class:`PolicyInfo`), ``GET /healthz`` (``{"status": "ok"}``, nothing else).

Invariants:

* Token for token: a remote generation returns exactly the ids, logprobs (floats written in their
  shortest exact form), finish reason, ``token_exact`` flag and ``policy_version`` the served policy
  returned; the prompt ids go to it unchanged. The context travels too (episode id, harness, the
  normalised messages and tools, and the :class:`~clawgym_env.task.Task` as JSON), so a scripted
  policy decides on the server as it would locally.
* ``policy_version`` is the server policy's at sampling time; :attr:`RemotePolicy.version` is the
  highest version seen so far (after a weight update on the server, the next call shows it).
* Only holders of the token are served: ``/generate`` and ``/info`` without ``Authorization: Bearer
  <token>`` answer 401 (compared in constant time). ``/healthz`` answers anyone and says nothing.
* Answers: a malformed request → 400 naming the fields; a :class:`~clawgym_env.errors.PolicyError` of
  the served policy → 502 with its message; anything else → 500, logged with its traceback.
* :class:`RemotePolicy` retries connection failures (refused, reset, the server restarting: 503) with
  exponential backoff; every other failure, and the last retry's, is a :class:`PolicyError` naming the
  server's URL. Its tokenizer is the real Qwen3 tokenizer, checked against the server's on construction.
  Thread safe (one ``httpx.Client``).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from typing import Any, Literal

import uvicorn
from pydantic import BaseModel, Field, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from clawgym_env.errors import PolicyError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams
from clawgym_env.policy.http_json import request_json
from clawgym_env.task import Task

log = logging.getLogger("clawgym.policy.remote")

TOKEN_ENV = "CLAWGYM_REMOTE_POLICY_TOKEN"
"""The environment variable holding the policy server's shared secret on the client side."""
TOKENIZER_PROBE = "Hello wörld 🤔 <|im_start|>user\nls -la<|im_end|>\n<think>\n</think>"
"""A text both sides encode on construction: equal ids or no service (the prompt ids would mean other text)."""
_RETRY_STATUS = (503, 504)
"""Answers retried like a refused connection (the server starting or stopping, a gateway in between)."""


# -- the wire --------------------------------------------------------------------------------------
class WireSampling(BaseModel):
    """:class:`~clawgym_env.policy.base.SamplingParams` on the wire."""

    max_tokens: int = Field(ge=0)
    temperature: float = Field(ge=0.0)
    top_p: float = Field(gt=0.0, le=1.0)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None


class WireContext(BaseModel):
    """:class:`~clawgym_env.policy.base.GenerationContext` on the wire (the task as JSON)."""

    episode_id: str = ""
    harness: str | None = None
    messages: list[JSONObject] = Field(default_factory=list)
    tools: list[JSONObject] = Field(default_factory=list)
    task: Task | None = None


class GenerateRequest(BaseModel):
    """``POST /generate``: continue ``prompt_ids`` under ``params`` (unknown fields are ignored)."""

    prompt_ids: list[int]
    params: WireSampling
    context: WireContext = Field(default_factory=WireContext)


class GenerateResponse(BaseModel):
    """What ``POST /generate`` answers: the served policy's :class:`~clawgym_env.policy.base.Generation`."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    policy_version: int
    token_exact: bool = True


class PolicyInfo(BaseModel):
    """What ``GET /info`` answers: the served policy's name and version, and its ids of :data:`TOKENIZER_PROBE`."""

    name: str
    version: int
    tokenizer_probe: list[int]


def _error(status: int, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"message": message, "status": status}}, status_code=status, headers=headers)


# -- the server ------------------------------------------------------------------------------------
class PolicyServer:
    """``policy`` served over HTTP in a daemon thread (see the module doc). A context manager."""

    def __init__(self, policy: PolicyBackend, host: str = "127.0.0.1", port: int = 0, *,
                 token: str | None = None, graceful_s: float = 5.0) -> None:
        self.policy = policy
        self.host = host
        self.token = token or secrets.token_urlsafe(32)
        """The shared secret a client must send (``Authorization: Bearer <token>``)."""
        self.graceful_s = graceful_s
        self.port: int | None = None
        self._requested_port = port
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.app = Starlette(routes=[Route("/generate", self._generate, methods=["POST"]),
                                     Route("/info", self._info, methods=["GET"]),
                                     Route("/healthz", self._healthz, methods=["GET"])])

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the server (loopback when bound to all interfaces)."""
        if self.port is None:
            raise PolicyError("the policy server is not running; call start() first")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    # -- routes -----------------------------------------------------------------------------------
    def _authorised(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return secrets.compare_digest(given.encode(), f"Bearer {self.token}".encode())

    async def _healthz(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def _info(self, request: Request) -> Response:
        if not self._authorised(request):
            return _error(401, "missing or wrong policy server token")
        probe = await run_in_threadpool(lambda: list(self.policy.tokenizer.encode(TOKENIZER_PROBE,
                                                                                   add_special_tokens=False)))
        info = PolicyInfo(name=str(self.policy.name), version=int(self.policy.version), tokenizer_probe=probe)
        return Response(info.model_dump_json(), media_type="application/json")

    async def _generate(self, request: Request) -> Response:
        if not self._authorised(request):
            return _error(401, "missing or wrong policy server token")
        try:
            req = GenerateRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            fields = ", ".join(sorted({".".join(str(p) for p in e["loc"]) or "(body)" for e in exc.errors()}))
            return _error(400, f"invalid /generate request: bad field(s) {fields}: {exc.errors()[0]['msg']}")
        params = SamplingParams(**req.params.model_dump())
        ctx = GenerationContext(episode_id=req.context.episode_id, messages=req.context.messages,
                                tools=req.context.tools, task=req.context.task, harness=req.context.harness)
        try:
            gen = await run_in_threadpool(self.policy.generate, req.prompt_ids, params, ctx)
        except PolicyError as exc:
            return _error(502, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a bug in the served policy: logged, answered, not fatal
            log.error("the served policy raised", exc_info=exc)
            return _error(500, f"the served policy raised {type(exc).__name__}: {exc}")
        out = GenerateResponse(token_ids=list(gen.token_ids), logprobs=list(gen.logprobs),
                               finish_reason=gen.finish_reason,  # type: ignore[arg-type]
                               policy_version=int(gen.policy_version), token_exact=bool(gen.token_exact))
        return Response(out.model_dump_json(), media_type="application/json")

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> PolicyServer:
        """Bind, serve in a daemon thread and return once connections are accepted (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return self
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self.host, self._requested_port))
            except OSError as exc:
                sock.close()
                raise PolicyError(f"the policy server cannot listen on {self.host}:{self._requested_port}: "
                                  f"{exc}") from exc
            config = uvicorn.Config(self.app, lifespan="off", log_config=None, log_level="warning",
                                    timeout_graceful_shutdown=int(self.graceful_s) or None)
            server = uvicorn.Server(config)
            thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                                      name="clawgym-policy-server")
            thread.start()
            deadline = time.monotonic() + timeout
            while not server.started:
                if not thread.is_alive() or time.monotonic() > deadline:
                    server.should_exit = True
                    sock.close()
                    raise PolicyError("the policy server did not start (see the log)")
                time.sleep(0.01)
            self._sock, self._server, self._thread = sock, server, thread
            self.port = int(sock.getsockname()[1])
        return self

    def stop(self) -> None:
        """Stop serving (in-flight generations get ``graceful_s`` to finish); idempotent."""
        with self._lock:
            server, thread, sock = self._server, self._thread, self._sock
            if server is not None and thread is not None:
                server.should_exit = True
                thread.join(self.graceful_s + 2)
                if thread.is_alive():
                    server.force_exit = True
                    thread.join(2)
            if sock is not None:
                sock.close()
            self._server, self._thread, self._sock, self.port = None, None, None, None

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_policy(policy: PolicyBackend, host: str = "127.0.0.1", port: int = 0, *,
                 token: str | None = None) -> PolicyServer:
    """Serve ``policy`` on ``host:port`` (0: a free port) with ``token`` (default: a fresh random one);
    returns the started :class:`PolicyServer` (``url``, ``token``; ``stop()`` when done)."""
    return PolicyServer(policy, host, port, token=token).start()


# -- the client ------------------------------------------------------------------------------------
class RemotePolicy(PolicyBackend):
    """The policy served by a :class:`PolicyServer` at ``url`` (see the module invariants).

    ``token``: the server's secret (default: ``$CLAWGYM_REMOTE_POLICY_TOKEN``). ``check``: ask
    ``/info`` now (name, version, tokenizer agreement), so a wrong URL or token fails at construction.
    """

    def __init__(self, url: str, token: str | None = None, *, tokenizer: Any = None, timeout_s: float = 600.0,
                 retries: int = 3, backoff_s: float = 0.5, check: bool = True) -> None:
        import httpx

        url = url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise PolicyError(f"not an http(s) URL: {url!r}; use remote:http://HOST:PORT")
        token = token or os.environ.get(TOKEN_ENV)
        if not token:
            raise PolicyError(f"the remote policy at {url} needs the server's token: set {TOKEN_ENV}")
        self.url = url
        self.retries = max(0, int(retries))
        self.backoff_s = float(backoff_s)
        self.name = "remote"
        self.version = 0
        self._version_lock = threading.Lock()
        self._client = httpx.Client(base_url=url, timeout=httpx.Timeout(timeout_s, connect=10.0),
                                    headers={"Authorization": f"Bearer {token}"})
        if tokenizer is None:
            from clawgym_env.policy.tokenizer import load_tokenizer

            tokenizer = load_tokenizer()
        self._tokenizer = tokenizer
        if check:
            info = PolicyInfo.model_validate(self._request("GET", "/info"))
            ours = list(tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False))
            if info.tokenizer_probe != ours:
                raise PolicyError(f"the policy served at {url} uses another tokenizer (probe ids "
                                  f"{info.tokenizer_probe[:8]}... vs ours {ours[:8]}...); serve a policy with "
                                  "the Qwen3 tokenizer")
            self.name, self.version = info.name, info.version

    @property
    def tokenizer(self) -> Any:
        """The real Qwen3 tokenizer (checked against the server's when ``check`` was on)."""
        return self._tokenizer

    def _request(self, method: str, path: str, body: bytes | None = None) -> Any:
        """One request with retries on connection failures; any failure → :class:`PolicyError` naming the URL."""
        return request_json(
            self._client, method, path, service="the policy server", url=self.url, retries=self.retries,
            backoff_s=self.backoff_s, retry_status=_RETRY_STATUS, content=body,
            headers={"Content-Type": "application/json"} if body is not None else None,
            status_hints={401: f"the policy server at {self.url} refused our token (HTTP 401); set {TOKEN_ENV} "
                               "to the token the server was started with"},
            unreachable_hint="is the trainer that serves it still running?")

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """Sample on the server (see the module invariants)."""
        task = ctx.task if isinstance(ctx.task, Task) else None
        req = GenerateRequest(prompt_ids=[int(t) for t in prompt_ids],
                              params=WireSampling(max_tokens=int(params.max_tokens),
                                                  temperature=float(params.temperature), top_p=float(params.top_p),
                                                  stop=list(params.stop), seed=params.seed),
                              context=WireContext(episode_id=ctx.episode_id, harness=ctx.harness,
                                                  messages=ctx.messages, tools=ctx.tools, task=task))
        data = self._request("POST", "/generate", req.model_dump_json().encode())
        try:
            out = GenerateResponse.model_validate(data)
        except ValidationError as exc:
            raise PolicyError(f"the policy server at {self.url} answered /generate with an invalid body: "
                              f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from exc
        if len(out.logprobs) != len(out.token_ids):
            raise PolicyError(f"the policy server at {self.url} returned {len(out.token_ids)} tokens but "
                              f"{len(out.logprobs)} logprobs")
        with self._version_lock:
            self.version = max(self.version, out.policy_version)
        return Generation(token_ids=out.token_ids, logprobs=out.logprobs, finish_reason=out.finish_reason,
                          policy_version=out.policy_version, token_exact=out.token_exact)

    def close(self) -> None:
        """Close the HTTP client (the server is its owner's); idempotent."""
        self._client.close()


def from_spec(rest: str, *, token: str | None = None, tokenizer: object = None, timeout_s: float = 600.0,
              retries: int = 3, backoff_s: float = 0.5, check: bool = True) -> PolicyBackend:
    """``remote:http://HOST:PORT``: a :class:`RemotePolicy` (``token``, else ``$CLAWGYM_REMOTE_POLICY_TOKEN``;
    the other keywords are the constructor's)."""
    if not rest:
        raise PolicyError("policy 'remote' needs the server's URL: remote:http://HOST:PORT")
    return RemotePolicy(rest, token, tokenizer=tokenizer, timeout_s=timeout_s, retries=retries,
                        backoff_s=backoff_s, check=check)
