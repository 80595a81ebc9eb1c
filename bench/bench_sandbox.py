"""Sandbox latency: median time of create+exec(true)+close, and of one exec(true), with and without the relay.

Usage: ``python bench/bench_sandbox.py [-n 20] [--backend bwrap]``

The relay case binds a listening unix socket as the proxy (nothing is sent through it: this
measures start-up cost only). Besides wall-clock medians it prints the CPU time (this process and
its children) per create+exec(true)+close, which a loaded machine disturbs much less than wall time.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import tempfile
import time
from pathlib import Path

from clawgym_env.sandbox import SandboxSpec, get_backend


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def bench(backend: str, n: int, proxy: Path | None) -> tuple[float, float, float]:
    cls = get_backend(backend)
    with tempfile.TemporaryDirectory(prefix="cg-bench-") as ws:
        spec = SandboxSpec(workspace_host=Path(ws), proxy_socket=proxy)
        cold, warm = [], []
        with cls(spec) as sb:  # first start also pays for the one-off availability probe
            sb.exec(["true"])
        cpu0 = _cpu_s()
        for _ in range(n):
            t0 = time.perf_counter()
            with cls(spec) as sb:
                res = sb.exec(["true"])
            cold.append(time.perf_counter() - t0)
            assert res.ok, res
        cpu = (_cpu_s() - cpu0) / n
        with cls(spec) as sb:
            for _ in range(n):
                t0 = time.perf_counter()
                res = sb.exec(["true"])
                warm.append(time.perf_counter() - t0)
                assert res.ok, res
    return statistics.median(cold), statistics.median(warm), cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20, help="repetitions (median reported)")
    ap.add_argument("--backend", default="bwrap")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cg-px-") as d:
        sock_path = Path(d) / "proxy.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(sock_path))
        sock_path.chmod(0o666)  # as the proxy does: sandboxes run as other uids
        listener.listen(16)
        try:
            for label, proxy in (("without relay", None), ("with relay", sock_path)):
                cold, warm, cpu = bench(args.backend, args.n, proxy)
                print(f"{args.backend} {label:14s} create+exec(true)+close: {cold * 1e3:7.1f} ms   "
                      f"exec(true): {warm * 1e3:7.1f} ms   (median of {args.n});   "
                      f"CPU per create+exec+close: {cpu * 1e3:5.1f} ms")
        finally:
            listener.close()


if __name__ == "__main__":
    main()
