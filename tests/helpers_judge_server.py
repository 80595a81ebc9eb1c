"""A real, small OpenAI-compatible chat server for judge tests (starlette on uvicorn, in a thread).

``handler(body) -> (status, text)`` decides each answer from the request body; the server wraps
``text`` in a Chat Completions response (or an error body for status >= 400) and keeps every
request body in ``requests``. Used as a context manager; ``base_url`` ends in ``/v1``.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

Handler = Callable[[dict], "tuple[int, str]"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JudgeServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[dict[str, Any]] = []
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
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> "JudgeServer":
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
