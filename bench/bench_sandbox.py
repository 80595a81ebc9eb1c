"""Sandbox start-up: create / exec(true) / close, bwrap vs Docker, cold vs pooled, side by side in one run.

Usage: ``python bench/bench_sandbox.py [-n 5] [--backends bwrap,docker] [--pool 2]``

Every case runs ``n`` times (min and median printed, in ms):
  * ``create``: ``__enter__`` (what an episode waits for before its harness can start);
  * ``exec(true)``: the first command in the fresh sandbox;
  * ``close``: ``close()`` (container removed, workspace copied back);
  * ``total``: the three together; ``CPU``: CPU time of this process and its children per total.
Cases: bwrap without and with the proxy relay, Docker with the relay cold, and Docker with the relay
from a :class:`~clawgym_env.sandbox.docker.pool.DockerPool` (``--pool`` warm containers; the bench
waits until one is warm before each start, so ``create`` is the hand-out; the container itself is
still created, in the pool's threads: a pool moves that cost off the episode's path, it does not
remove it). The relay cases bind a listening unix socket as the proxy (nothing is sent through it).
A case whose backend cannot run here is printed as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox import Sandbox, SandboxSpec, get_backend


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure(make: Callable[[], Sandbox], n: int, before: Callable[[], None] = lambda: None) -> dict[str, list[float]]:
    """``n`` rounds of create, exec(true), close (after ``before()``, not timed); seconds per phase."""
    out: dict[str, list[float]] = {"create": [], "exec(true)": [], "close": [], "total": [], "CPU": []}
    for _ in range(n):
        before()
        cpu0, t0 = _cpu_s(), time.perf_counter()
        sb = make()
        entered = sb.__enter__()
        t1 = time.perf_counter()
        res = entered.exec(["true"])
        t2 = time.perf_counter()
        sb.close()
        t3 = time.perf_counter()
        assert res.ok, res
        for key, value in (("create", t1 - t0), ("exec(true)", t2 - t1), ("close", t3 - t2), ("total", t3 - t0),
                           ("CPU", _cpu_s() - cpu0)):
            out[key].append(value)
    return out


def _maker(cls: type[Sandbox], spec: SandboxSpec) -> Callable[[], Sandbox]:
    return lambda: cls(spec)


def cases(backends: list[str], pool_size: int, ws: Path, sock: Path, n: int):
    """(label, result or the reason it was skipped) for every case."""
    plain, relayed = SandboxSpec(workspace_host=ws), SandboxSpec(workspace_host=ws, proxy_socket=sock)
    for backend in backends:
        specs = [("without relay", plain), ("with relay", relayed)] if backend == "bwrap" else [("with relay", relayed)]
        for label, spec in specs:
            try:
                cls = get_backend(backend)
                with cls(spec) as sb:  # warm-up: the one-off availability probe, the image, imports
                    sb.exec(["true"])
                yield f"{backend} {label}, cold", measure(_maker(cls, spec), n)
            except SandboxError as exc:
                yield f"{backend} {label}, cold", f"skipped: {str(exc)[:100]}"
        if backend == "docker" and pool_size:
            from clawgym_env.sandbox.docker.pool import DockerPool

            try:
                with DockerPool(pool_size) as pool:
                    pool.prewarm(relayed)

                    def warm(pool=pool) -> None:
                        deadline = time.monotonic() + 120
                        while pool.warm_count(relayed) < 1 and time.monotonic() < deadline:
                            time.sleep(0.01)

                    pooled = get_backend(pool.name)
                    yield (f"docker with relay, pooled ({pool_size} warm)",
                           measure(_maker(pooled, relayed), n, warm))
            except SandboxError as exc:
                yield f"docker with relay, pooled ({pool_size} warm)", f"skipped: {str(exc)[:100]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="repetitions per case (min and median reported; at least 3)")
    ap.add_argument("--backends", default="bwrap,docker")
    ap.add_argument("--pool", type=int, default=2, help="warm containers of the Docker pool case (0: no such case)")
    args = ap.parse_args()
    n = max(3, args.n)
    cols = ["create", "exec(true)", "close", "total", "CPU"]
    print(f"{'case':36s}" + "".join(f"{c + ' min/med':>22s}" for c in cols) + "   (ms)")
    with tempfile.TemporaryDirectory(prefix="cg-px-") as d, tempfile.TemporaryDirectory(prefix="cg-bench-") as ws:
        sock_path = Path(d) / "proxy.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(sock_path))
        sock_path.chmod(0o666)  # as the proxy does: sandboxes run as other uids
        Path(d).chmod(0o711)
        listener.listen(16)
        try:
            for label, result in cases(args.backends.split(","), args.pool, Path(ws), sock_path, n):
                if isinstance(result, str):
                    print(f"{label:36s}  {result}")
                    continue
                row = "".join(f"{min(result[c]) * 1e3:>12.1f} /{statistics.median(result[c]) * 1e3:>8.1f}"
                              for c in cols)
                print(f"{label:36s}{row}", flush=True)
        finally:
            listener.close()
    print(f"({n} rounds per case)")


if __name__ == "__main__":
    main()
