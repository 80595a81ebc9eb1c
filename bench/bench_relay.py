"""What the in-sandbox proxy relay costs a bwrap exec, and where that time goes.

Usage: ``python bench/bench_relay.py [-n 15] [--rounds 3]``

Side by side in one run, rounds alternating, min/median of every exec of each case:
  * ``exec(true)`` without a proxy socket (no relay at all);
  * ``exec(true)`` with the relay held once per sandbox (as root: every exec is spawned inside the
    holder's network namespace; see ``clawgym_env/sandbox/bwrap/relay.py``);
  * ``exec(true)`` with a relay started by every exec (the non-root path, and how it was before);
  * the parts: ``exec(python -I -S -c pass)`` without a relay (the interpreter start the per-exec relay
    pays), and on the host ``true`` vs ``nsenter --net=/proc/self/ns/net true`` (joining a namespace by
    a process of its own, which the held relay avoids: the spawning thread joins it instead);
  * one HTTP round trip through the relay to a unix-socket server, per connection (the relay's own
    forwarding cost, without the exec: a client inside that makes 20 connections in one exec).
Sandbox creation (and the holder's one-off start) is outside the timed region.
"""

from __future__ import annotations

import argparse
import http.server
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

from clawgym_env.sandbox import SandboxSpec
from clawgym_env.sandbox.bwrap.sandbox import BwrapSandbox

CLIENT = """
import socket, time
n, best = 20, []
for _ in range(n):
    t = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", {port}))
    s.sendall(b"GET /x HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n")
    while s.recv(65536):
        pass
    s.close()
    best.append(time.perf_counter() - t)
best.sort()
print(best[0] * 1e3, best[len(best) // 2] * 1e3)
"""


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def address_string(self) -> str:
        return "unix"

    def log_message(self, *args: object) -> None:
        pass


class _UnixHTTP(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextmanager
def _proxy_socket():
    with tempfile.TemporaryDirectory(prefix="cg-px-") as d:
        path = Path(d) / "proxy.sock"
        server = _UnixHTTP(str(path), _Hello)
        path.chmod(0o666)  # as the proxy does: sandboxes run as other uids
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield path
        finally:
            server.shutdown()
            server.server_close()


def _times(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


@contextmanager
def _sandbox(ws: str, proxy: Path | None, per_exec: bool):
    spec = SandboxSpec(workspace_host=Path(ws), proxy_socket=proxy)
    if per_exec:
        holder = mock.patch("clawgym_env.sandbox.bwrap.sandbox.holder_possible", return_value=False)
        with holder, BwrapSandbox(spec) as sb:
            yield sb
    else:
        with BwrapSandbox(spec) as sb:
            yield sb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=15, help="execs per case per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (cases alternate within each)")
    args = ap.parse_args()
    times: dict[str, list[float]] = {}
    hops: dict[str, list[tuple[float, float]]] = {}
    py = [sys.executable, "-I", "-S", "-c", "pass"]
    with _proxy_socket() as proxy, tempfile.TemporaryDirectory(prefix="cg-bench-") as ws:
        cases = [("exec(true), no relay", None, False, ["true"]),
                 ("exec(true), relay held per sandbox", proxy, False, ["true"]),
                 ("exec(true), relay started per exec", proxy, True, ["true"]),
                 ("exec(python -I -S pass), no relay", None, False, py)]
        for _ in range(args.rounds):
            for label, sock, per_exec, argv in cases:
                with _sandbox(ws, sock, per_exec) as sb:
                    def run(sb: BwrapSandbox = sb, argv: list[str] = argv) -> object:
                        return sb.exec(argv)

                    run()  # warm
                    times.setdefault(label, []).extend(_times(run, args.n))
                    if sock is not None:
                        res = sb.exec([sys.executable, "-c", CLIENT.format(port=sb.spec.proxy_port)])
                        lo, mid = (float(x) for x in res.stdout.split())
                        hops.setdefault(label, []).append((lo, mid))
            host = [("host: true", ["true"]), ("host: nsenter --net=/proc/self/ns/net true",
                                               ["nsenter", "--net=/proc/self/ns/net", "true"])]
            for label, argv in host:
                def host_run(argv: list[str] = argv) -> object:
                    return subprocess.run(argv, check=False)

                times.setdefault(label, []).extend(_times(host_run, args.n))
    print(f"{'case':48s} {'min ms':>8s} {'median ms':>10s}   ({args.rounds} rounds x {args.n})")
    for label, xs in times.items():
        print(f"{label:48s} {min(xs) * 1e3:8.2f} {statistics.median(xs) * 1e3:10.2f}")
    print("one HTTP/1.0 request through the relay, per connection, from inside (min / median of 20, best round):")
    for label, pairs in hops.items():
        print(f"  {label:46s} {min(p[0] for p in pairs):8.2f} {min(p[1] for p in pairs):10.2f}")


if __name__ == "__main__":
    main()
