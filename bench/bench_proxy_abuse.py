"""The proxy under one abusive agent: the attack shapes of issue 23, with the proxy's memory measured.

The proxy runs in its own process (a real :class:`ProxyServer` with its default limits, policy
``scripted:noop`` on the real Qwen3 tokenizer, calls streamed to ``calls_path`` files; for the passthrough
attack a :class:`PassthroughPolicy` pointed at a hostile upstream in this process), so its RSS is measured
alone: before each attack, its peak during it (VmHWM, reset before each attack) and after. The attacks:

  * ``uploads``: ``--uploads`` connections of one episode each declaring ``--upload-mb`` MB and sending
    all but the last byte, then holding (the issue: 96 x 60 MB, RSS 0.4 -> 6.15 GB);
  * ``unknown``: ``--unknown-calls`` calls carrying one unknown field of ``--unknown-mb`` MB (the issue: 10 x
    60 MB, 630 MB recorded), and as many of 15 MB (under the body cap); the calls files' growth is printed;
  * ``padding``: a body ``{"pad": [{},{},...]}`` of ``--pad-mb`` MB (the issue: 60 MB, 3.4 GB), then one of
    15 MB and one of 262,000 values (0.75 MB, just under the default bound: parsed), while another episode
    makes 1-token calls (their slowest latency is printed; the issue: 17.5 s);
  * ``passthrough``: a streamed upstream answer of ``--answer-mb`` MB (the issue: 60 MB, 5.75 GB).

It runs against whatever ``clawgym_env`` is importable (a checkout before the bounds gives the "before"
figures). Prints one line per attack: the answers' status histogram, RSS before / peak / after (MB).

    python3 bench/bench_proxy_abuse.py                       # the issue's shapes (uploads of 15 MB)
    python3 bench/bench_proxy_abuse.py --upload-mb 60 --only uploads
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import socket
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MB = 1 << 20


def _serve(conn: Any, upstream: str | None, folder: str) -> None:
    from clawgym_env.policy import make_policy
    from clawgym_env.proxy.server import ProxyServer

    if upstream is None:
        policy = make_policy("scripted:noop")
    else:
        from clawgym_env.policy.passthrough.policy import PassthroughPolicy

        policy = PassthroughPolicy("openai", "up", base_url=upstream, api_key="k", max_retries=0, timeout=120)
    with ProxyServer(policy, read_timeout_s=120) as srv:
        sessions = [srv.open_episode(calls_path=Path(folder) / f"calls-{i}.jsonl") for i in range(3)]
        conn.send((srv.url, srv.port, [s.token for s in sessions]))
        conn.recv()  # the stop
        for s in sessions:
            srv.close_episode(s.token)
    conn.send("stopped")


class Proxy:
    """The proxy in a child process; ``mem()``: (RSS, peak RSS) in MB; ``reset_peak()`` before an attack."""

    def __init__(self, upstream: str | None = None) -> None:
        self.folder = tempfile.mkdtemp(prefix="bench-abuse-")
        self.conn, child = mp.Pipe()
        self.proc = mp.get_context("spawn").Process(target=_serve, args=(child, upstream, self.folder), daemon=True)
        self.proc.start()
        self.url, self.port, self.tokens = self.conn.recv()

    def base(self, i: int) -> str:
        return f"{self.url}/ep/{self.tokens[i]}/v1"

    def mem(self) -> tuple[float, float]:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
                      if ":" in line)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def reset_peak(self) -> None:
        try:
            Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        except OSError:
            pass  # the peak then covers the run so far

    def recorded(self) -> int:
        return sum(p.stat().st_size for p in Path(self.folder).glob("calls-*.jsonl"))

    def close(self) -> None:
        if self.proc.is_alive():
            self.conn.send("stop")
            self.conn.recv()
        self.proc.join(30)


def _report(name: str, proxy: Proxy, before: tuple[float, float], statuses: collections.Counter, extra: str) -> None:
    time.sleep(0.5)
    after = proxy.mem()
    alive = "alive" if proxy.proc.is_alive() else "DEAD"
    print(f"{name:12s} statuses {dict(sorted(statuses.items(), key=str))}  RSS before {before[0]:7.0f} MB  peak "
          f"{after[1]:7.0f} MB  after {after[0]:7.0f} MB  proxy {alive}  {extra}", flush=True)


def _status(sock: socket.socket, wait: float) -> int | str:
    sock.settimeout(wait)
    try:
        head = sock.recv(64)
    except (TimeoutError, OSError):
        return "held"
    return int(head.split()[1]) if head.startswith(b"HTTP/1.1") else "closed"


def uploads(proxy: Proxy, n: int, size: int) -> None:
    """``n`` uploads of ``size`` bytes on one episode, each held before its last byte."""
    head = (f"POST /ep/{proxy.tokens[0]}/v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Type: application/json"
            f"\r\nContent-Length: {size}\r\n\r\n").encode()
    body = memoryview(b" " * (size - 1))
    socks: list[socket.socket] = []
    statuses: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def one() -> None:
        sock = socket.create_connection(("127.0.0.1", proxy.port))
        with lock:
            socks.append(sock)
        sock.settimeout(60)
        try:
            sock.sendall(head)
            for i in range(0, len(body), MB):
                sock.sendall(body[i:i + MB])
        except OSError:
            pass  # the proxy answered and closed
        status = _status(sock, 3.0)
        with lock:
            statuses[status] += 1
    proxy.reset_peak()
    before = proxy.mem()
    threads = [threading.Thread(target=one) for _ in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    _report("uploads", proxy, before, statuses, f"{n} x {size / MB:.0f} MB held, {took:.1f} s")
    for sock in socks:
        sock.close()


def unknown(proxy: Proxy, calls: int, size: int) -> None:
    for mb in (size, 15 * MB):
        proxy.reset_peak()
        before, recorded = proxy.mem(), proxy.recorded()
        statuses: collections.Counter = collections.Counter()
        pad = "x" * mb
        with httpx.Client(timeout=300) as c:
            for _ in range(calls):
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "pad": pad}
                statuses[c.post(proxy.base(0) + "/chat/completions", json=body).status_code] += 1
        grown = (proxy.recorded() - recorded) / MB
        _report("unknown", proxy, before, statuses, f"{calls} x {mb / MB:.0f} MB field, {grown:.2f} MB recorded")


def _victim(proxy: Proxy, stop: threading.Event, slowest: list[float]) -> None:
    """Another episode's 1-token calls until ``stop``; the slowest one's seconds in ``slowest[0]``."""
    with httpx.Client(timeout=300) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            c.post(proxy.base(1) + "/chat/completions", json={
                "model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "one token"}]})
            slowest[0] = max(slowest[0], time.perf_counter() - t0)
            time.sleep(0.02)


def padding(proxy: Proxy, size: int) -> None:
    for mb in (size, 15 * MB, 3 * 262_000):  # the last: just under the default max_json_values, parsed
        pad = b"{}," * (mb // 3 - 1) + b"{}"
        raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "pad": [' + pad + b"]}"
        proxy.reset_peak()
        before = proxy.mem()
        statuses: collections.Counter = collections.Counter()
        stop, slowest = threading.Event(), [0.0]
        thread = threading.Thread(target=_victim, args=(proxy, stop, slowest))
        thread.start()
        time.sleep(0.3)
        with httpx.Client(timeout=300) as c:
            statuses[c.post(proxy.base(0) + "/chat/completions", content=raw,
                            headers={"content-type": "application/json"}).status_code] += 1
        time.sleep(0.3)
        stop.set()
        thread.join()
        _report("padding", proxy, before, statuses,
                f"{mb / MB:.2f} MB of {{}}, other episode's slowest 1-token call {slowest[0] * 1000:.0f} ms")


class _Endless(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    limit = 60 * MB
    sent = 0

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        i = 0
        try:
            while type(self).sent < self.limit:
                chunk = {"id": "c", "object": "chat.completion.chunk", "model": "up",
                         "choices": [{"index": 0, "delta": {"content": f"word{i} " * 8}, "finish_reason": None}]}
                data = ("data: " + json.dumps(chunk) + "\n\n").encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                type(self).sent += len(data)
                i += 1
            stop = {"id": "c", "object": "chat.completion.chunk", "model": "up",
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            for data in (("data: " + json.dumps(stop) + "\n\n").encode(), b"data: [DONE]\n\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass  # the reader stopped: what a bounded reader does


def passthrough(size: int) -> None:
    _Endless.limit = size
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    proxy = Proxy(upstream=f"http://127.0.0.1:{upstream.server_address[1]}/v1")
    try:
        proxy.reset_peak()
        before = proxy.mem()
        statuses: collections.Counter = collections.Counter()
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        received = 0
        with httpx.stream("POST", proxy.base(0) + "/chat/completions", json=body, timeout=600) as r:
            statuses[r.status_code] += 1
            for chunk in r.iter_bytes():
                received += len(chunk)
        _report("passthrough", proxy, before, statuses,
                f"upstream offered {size / MB:.0f} MB, sent {_Endless.sent / MB:.1f} MB before the proxy stopped "
                f"reading; the client got {received / MB:.2f} MB")
    finally:
        proxy.close()
        upstream.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uploads", type=int, default=96)
    ap.add_argument("--upload-mb", type=int, default=15)
    ap.add_argument("--unknown-calls", type=int, default=10)
    ap.add_argument("--unknown-mb", type=int, default=60)
    ap.add_argument("--pad-mb", type=int, default=60)
    ap.add_argument("--answer-mb", type=int, default=60)
    ap.add_argument("--only", choices=["uploads", "unknown", "padding", "passthrough"], action="append")
    args = ap.parse_args()
    only = set(args.only or ["uploads", "unknown", "padding", "passthrough"])
    proxy = Proxy()
    try:
        rss, _ = proxy.mem()
        print(f"proxy idle: RSS {rss:.0f} MB", flush=True)
        if "uploads" in only:
            uploads(proxy, args.uploads, args.upload_mb * MB)
        if "unknown" in only:
            unknown(proxy, args.unknown_calls, args.unknown_mb * MB)
        if "padding" in only:
            padding(proxy, args.pad_mb * MB)
    finally:
        proxy.close()
    if "passthrough" in only:
        passthrough(args.answer_mb * MB)


if __name__ == "__main__":
    main()
