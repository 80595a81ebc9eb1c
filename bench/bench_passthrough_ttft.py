"""Time to first token through the streaming passthrough vs the upstream's own, side by side.

Usage: ``python bench/bench_passthrough_ttft.py [-n 10] [--chunks 10] [--gap-ms 30] [--provider openai]``

A local upstream (a real HTTP server, chunked SSE) streams a reply of ``--chunks`` text pieces,
``--gap-ms`` apart, in the OpenAI chat or Anthropic Messages format. The official SDK asks it
streaming, (1) directly, (2) through a ClawGym proxy whose policy is a passthrough to it, served
live (the default), and (3) through the same proxy with live streaming turned off (the whole upstream
reply first, as before). Cases alternate, ``-n`` runs each; min/median of the time to the first text
delta and to the end of the stream.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from clawgym_env.policy.passthrough.policy import PassthroughPolicy
from clawgym_env.policy.tokenizer import load_tokenizer
from clawgym_env.proxy.server import ProxyServer


def _upstream(chunks: int, gap_s: float) -> ThreadingHTTPServer:
    def sse(data: dict[str, Any], event: str | None = None) -> bytes:
        return ((f"event: {event}\n" if event else "") + "data: " + json.dumps(data) + "\n\n").encode()

    def chat_events() -> list[bytes]:
        head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up"}
        out = [sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
        out += [sse({**head, "choices": [{"index": 0, "delta": {"content": f" word{i}"}}]}) for i in range(chunks)]
        out.append(sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        return out + [b"data: [DONE]\n\n"]

    def messages() -> list[bytes]:
        msg: dict[str, Any] = {"id": "m", "type": "message", "role": "assistant", "model": "up", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}
        out = [sse({"type": "message_start", "message": msg}, "message_start"),
               sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                   "content_block_start")]
        out += [sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f" word{i}"}},
                    "content_block_delta") for i in range(chunks)]
        out += [sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
                sse({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                     "usage": {"output_tokens": chunks}}, "message_delta"),
                sse({"type": "message_stop"}, "message_stop")]
        return out

    def reply(chat: bool) -> dict[str, Any]:
        text = "".join(f" word{i}" for i in range(chunks))
        if chat:
            return {"id": "c", "object": "chat.completion", "created": 1, "model": "up",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "stop"}]}
        return {"id": "m", "type": "message", "role": "assistant", "model": "up",
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": chunks}}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            chat = self.path.endswith("/chat/completions")
            if not body.get("stream"):  # the whole reply at once, as late as the streamed one ends
                time.sleep(gap_s * chunks)
                data = json.dumps(reply(chat)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            events = chat_events() if chat else messages()
            for i, data in enumerate(events):
                if i >= 2:
                    time.sleep(gap_s)  # the model "thinking" between its pieces
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _client(provider: str, base_url: str) -> Callable[[], tuple[float, float]]:
    """One streamed call: (seconds to the first text delta, seconds to the end)."""
    messages = [{"role": "user", "content": "hi"}]
    if provider == "openai":
        import openai

        oc: Any = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)

        def call() -> tuple[float, float]:
            t0 = time.perf_counter()
            first = None
            for chunk in oc.chat.completions.create(model="m", messages=messages, stream=True):
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - t0
            return first or float("nan"), time.perf_counter() - t0
        return call
    import anthropic

    ac: Any = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="x", max_retries=0)

    def acall() -> tuple[float, float]:
        t0 = time.perf_counter()
        first = None
        with ac.messages.stream(model="m", max_tokens=256, messages=messages) as events:
            for event in events:
                if first is None and event.type == "text" and event.text:
                    first = time.perf_counter() - t0
        return first or float("nan"), time.perf_counter() - t0
    return acall


class _Buffered(PassthroughPolicy):
    """The same passthrough with live streaming off: the proxy waits for the whole upstream reply."""

    @property
    def streams_text(self) -> bool:  # type: ignore[override]
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10, help="runs per case (cases alternate)")
    ap.add_argument("--chunks", type=int, default=10)
    ap.add_argument("--gap-ms", type=float, default=30.0)
    ap.add_argument("--provider", choices=["openai", "anthropic"], default="openai")
    args = ap.parse_args()
    tok = load_tokenizer()
    upstream = _upstream(args.chunks, args.gap_ms / 1e3)
    up_url = f"http://127.0.0.1:{upstream.server_address[1]}"
    policy_url = up_url + ("/v1" if args.provider == "openai" else "")
    live = PassthroughPolicy(args.provider, "up", base_url=policy_url, api_key="k", tokenizer=tok, max_retries=0)
    buffered = _Buffered(args.provider, "up", base_url=policy_url, api_key="k", tokenizer=tok, max_retries=0)
    results: dict[str, list[tuple[float, float]]] = {}
    with ProxyServer(live) as p_live, ProxyServer(buffered) as p_buf:
        s_live, s_buf = p_live.open_episode("ttft-live"), p_buf.open_episode("ttft-buffered")
        cases = {"upstream directly": _client(args.provider, up_url + "/v1"),
                 "through the proxy, streamed passthrough": _client(args.provider, s_live.base_url(p_live.url)),
                 "through the proxy, buffered (before)": _client(args.provider, s_buf.base_url(p_buf.url))}
        for call in cases.values():
            call()  # warm: connections, tokenizer, SDK imports
        for _ in range(args.n):
            for label, call in cases.items():
                results.setdefault(label, []).append(call())
    upstream.shutdown()
    print(f"{args.provider} upstream: {args.chunks} text chunks {args.gap_ms:.0f} ms apart; {args.n} runs each, "
          "cases alternating")
    print(f"{'case':42s} {'TTFT min':>9s} {'TTFT med':>9s} {'total min':>10s} {'total med':>10s}  (ms)")
    for label, xs in results.items():
        firsts, totals = [x[0] * 1e3 for x in xs], [x[1] * 1e3 for x in xs]
        print(f"{label:42s} {min(firsts):9.1f} {statistics.median(firsts):9.1f} {min(totals):10.1f} "
              f"{statistics.median(totals):10.1f}")


if __name__ == "__main__":
    main()
