"""A fake LLM judge: a real, small OpenAI-compatible chat server (starlette on uvicorn, in a thread).

Use it to test a grader that asks an LLM judge, without a model or a network: point any
OpenAI-compatible judge client (e.g. the project's ``JudgeClient``, or the ``openai`` SDK) at
``base_url``, and decide each answer in Python.

Invariants: ``handler(body) -> (status, text)`` decides each answer from the request body (it may be
replaced while the server runs); the server wraps ``text`` in a Chat Completions response, or in an
error body ``{"error": {"message": text, ...}}`` for ``status >= 400``; every request body is kept,
in order, in ``requests``; ``base_url`` ends in ``/v1``; the server listens on 127.0.0.1 only, on a
port bound before the thread starts, and stops on ``__exit__``.

Usage::

    from clawgym_env.testing import JudgeServer, replying

    with JudgeServer(replying('{"score": 1.0}')) as judge:
        client = openai.OpenAI(base_url=judge.base_url, api_key="unused")
        ...                                    # your grader calls the judge here
        assert judge.requests[0]["messages"]
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from clawgym_env.jsontypes import JSONObject

Handler = Callable[[JSONObject], "tuple[int, str]"]
"""Decides one answer: request body → (HTTP status, text)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for tests that need an unused port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replying(text: str, status: int = 200) -> Handler:
    """A handler that answers every request with ``text`` (an error body when ``status >= 400``)."""
    return lambda body: (status, text)


class JudgeServer:
    """An OpenAI-compatible ``/v1/chat/completions`` server answering with ``handler`` (see the module doc)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[JSONObject] = []
        self._lock = threading.Lock()

        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            with self._lock:
                self.requests.append(body)
            status, text = self.handler(body)
            if status >= 400:
                return JSONResponse({"error": {"message": text, "type": "test_error", "code": status}},
                                    status_code=status)
            return JSONResponse({
                "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "judge"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> JudgeServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test judge server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
