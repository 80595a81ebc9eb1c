"""ClawGym's proxy against its peers, side by side: added latency per call and requests/s.

    python3 bench/bench_proxy_peers.py [--repeats 3] [--clients 1,32,64] [--peers litellm,agentlightning]

One tiny mock OpenAI upstream (raw asyncio HTTP/1.1 in its own process, a canned five-word reply, JSON or
streamed as chunked SSE) sits behind every target, each started as a subprocess pointed at it:
  * ``direct``          the upstream itself (the baseline);
  * ``clawgym``         ClawGym's proxy with a ``passthrough:openai`` policy (one episode per client: every
                        call is parsed, rendered, tokenised, forwarded, re-encoded and captured);
  * ``litellm``         LiteLLM's proxy (``litellm --config``, one worker, a master key: it refuses to start
                        without one), from its own venv;
  * ``agentlightning``  Agent Lightning's ``LLMProxy`` (LiteLLM's proxy plus its rollout/attempt middleware
                        and tracing callbacks; one rollout per client), from its own venv.
The peers live in ``${CLAWGYM_PEER_VENVS:-~/.cache/clawgym/peer-venvs}``; a peer that is not installed is
skipped with the command that installs it (``scripts/peer_venvs.sh``). Clients are the official async
``openai`` SDK, one ``AsyncOpenAI`` per simulated client, each making sequential calls; cases alternate
targets, each case is run ``--repeats`` times. Per case: p50/p99 of the per-call latency (streaming: to
the end of the stream) minus the direct upstream's p50/p99 in the same repeat, requests/s, and the CPU
time the target's process spent per call (the upstream's for ``direct``; it varies less than wall time on
a shared machine); the table shows min / median over the repeats. Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("CLAWGYM_CACHE") or Path.home() / ".cache" / "clawgym")
PEER_VENVS = Path(os.environ.get("CLAWGYM_PEER_VENVS") or CACHE / "peer-venvs")
MODEL = "m"
KEY = "sk-bench-3f9c2a7d41b86e05c9d7a13f2b6e48d0"  # the peers' master key (LiteLLM refuses to start without one)
WORDS = ["Hello", "!", " How", " can", " I help?"]
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Say hello in five words."}]

# ----------------------------------------------------------------------------- the mock upstream


def _sse(delta: dict, finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    data = b"data: " + json.dumps(body).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _http(ctype: bytes, body: bytes, chunked: bool = False, status: bytes = b"200 OK") -> bytes:
    length = b"transfer-encoding: chunked" if chunked else b"content-length: %d" % len(body)
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\n%s\r\n\r\n%s" % (status, ctype, length, body)


_REPLY = _http(b"application/json", json.dumps({
    "id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(WORDS)}, "logprobs": None,
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}).encode())
_STREAM = _http(b"text/event-stream", b"".join(
    [_sse({"role": "assistant", "content": ""})] + [_sse({"content": w}) for w in WORDS] + [_sse({}, "stop")]
    + [b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"]), chunked=True)
_MODELS = _http(b"application/json", b'{"object": "list", "data": [{"id": "m", "object": "model", "created": 0, '
                                     b'"owned_by": "bench"}]}')
_MISSING = _http(b"application/json", b'{"error": {"message": "not found"}}', status=b"404 Not Found")


class _Upstream(asyncio.Protocol):
    """One keep-alive connection: requests with content-length bodies, each answered at once, in one write."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].decode("latin-1").split("\r\n")
            length = next((int(v) for k, _, v in (h.partition(":") for h in head[1:])
                           if k.strip().lower() == "content-length"), 0)
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
            method, path = (head[0].split(" ") + ["", ""])[:2]
            if method == "POST" and path.endswith("/chat/completions"):
                self.transport.write(_STREAM if json.loads(body or b"{}").get("stream") else _REPLY)
            else:
                self.transport.write(_MODELS if path.rstrip("/").endswith("/models") else _MISSING)


async def _serve_upstream(out: Path) -> None:
    server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", 0, backlog=1024)
    out.write_text(json.dumps([f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"]))
    await server.serve_forever()


# ----------------------------------------------------------------------------- the targets


def _serve_clawgym(out: Path, upstream: str, n: int, variant: str = "auto/auto") -> None:
    """ClawGym's proxy, a passthrough to ``upstream``, ``n`` episodes; serves until SIGTERM.
    ``variant``: ``HTTP-PARSER/LOOP[/INLINE-BYTES]`` (``ProxyServer``'s ``http``, ``loop``, ``inline_bytes``)."""
    sys.path.insert(0, str(ROOT))
    from clawgym_env.policy.passthrough.policy import PassthroughPolicy
    from clawgym_env.proxy.server import ProxyServer

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    policy = PassthroughPolicy("openai", MODEL, base_url=upstream + "/v1", api_key="x", max_retries=0)
    policy.tokenizer  # noqa: B018 - loaded before anything is timed
    http, loop, *inline = variant.split("/")
    extra = {"inline_bytes": int(inline[0])} if inline else {}
    with ProxyServer(policy, http=http, loop=loop, **extra) as srv:
        out.write_text(json.dumps([srv.open_episode().base_url(srv.url) for _ in range(n)]))
        stop.wait()
    policy.close()


_AGL = r"""
import asyncio, json, signal, sys
import agentlightning as agl
from agentlightning.utils.server_launcher import PythonServerLauncherArgs

async def main(out, port, upstream, n, key):
    store = agl.InMemoryLightningStore(thread_safe=True)
    # its default readiness probe (/health) calls the model without a key and fails once a master key is set
    launch = PythonServerLauncherArgs(port=port, host="127.0.0.1", launch_mode="thread",
                                      healthcheck_url="/health/liveliness", startup_timeout=120.0)
    proxy = agl.LLMProxy(store=store, launcher_args=launch, litellm_config={
        "general_settings": {"master_key": key}}, model_list=[{"model_name": "m", "litellm_params": {
        "model": "openai/m", "api_base": upstream + "/v1", "api_key": "x"}}])
    await proxy.start()
    urls = []
    for _ in range(n):
        r = await store.start_rollout(input={})
        urls.append(f"http://127.0.0.1:{port}/rollout/{r.rollout_id}/attempt/{r.attempt.attempt_id}/v1")
    with open(out, "w") as fh:
        json.dump(urls, fh)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await proxy.stop()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Target:
    """A running target: the base URL of each client slot, its process, its log."""

    name: str
    urls: list[str]
    key: str = "x"
    proc: subprocess.Popen | None = None
    log: Path | None = None

    def cpu_s(self) -> float:
        """CPU seconds its process has used so far (user + system; 0 without a process)."""
        if self.proc is None:
            return 0.0
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _launch(name: str, cmd: list[str], tmp: Path, *, env: dict[str, str] | None = None, health: str | None = None,
            timeout: float = 180.0) -> Target:
    """Start ``cmd`` (it writes its URLs as JSON to ``<tmp>/<name>.json``, or answers ``health``) and wait."""
    stem = "".join(c if c.isalnum() else "_" for c in name)
    out, log = tmp / f"{stem}.json", tmp / f"{stem}.log"
    out.unlink(missing_ok=True)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, cwd=tmp)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: ...{log.read_text(errors='replace')[-1500:]}")
        if health is not None:
            try:
                with urllib.request.urlopen(health, timeout=2) as resp:
                    if resp.status == 200:
                        return Target(name, [health.rsplit("/health", 1)[0] + "/v1"], KEY, proc, log)
            except OSError:
                pass
        elif out.exists() and out.stat().st_size:
            try:
                return Target(name, json.loads(out.read_text()), KEY, proc, log)
            except ValueError:
                pass  # written but not yet flushed
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"{name} did not come up within {timeout:.0f} s: ...{log.read_text(errors='replace')[-1500:]}")


def start_targets(upstream: str, n: int, peers: list[str], tmp: Path,
                  variants: tuple[str, ...] = ("auto/auto",)) -> tuple[list[Target], list[str]]:
    """Every target that starts (``direct`` first) and a note for each one skipped; one ClawGym target per
    ``HTTP-PARSER/LOOP`` variant (named ``clawgym`` for ``auto/auto``, else ``clawgym[VARIANT]``)."""
    me = [sys.executable, str(Path(__file__).resolve())]
    targets = [Target("direct", [upstream + "/v1"])]
    for variant in variants:
        name = "clawgym" if variant == "auto/auto" else f"clawgym[{variant}]"
        out = str(tmp / ("".join(c if c.isalnum() else "_" for c in name) + ".json"))
        targets.append(_launch(name, me + ["--serve-clawgym", out, upstream, str(n), variant], tmp))
    notes = []
    for peer in peers:
        venv = PEER_VENVS / peer
        if not (venv / "bin" / "python").exists():
            notes.append(f"{peer}: skipped, not installed (install: scripts/peer_venvs.sh {peer})")
            continue
        try:
            if peer == "litellm":
                port = _free_port()
                config = {"model_list": [{"model_name": MODEL, "litellm_params": {
                    "model": f"openai/{MODEL}", "api_base": upstream + "/v1", "api_key": "x"}}],
                    "general_settings": {"master_key": KEY}}
                (tmp / "litellm.yaml").write_text(json.dumps(config))  # JSON is YAML
                targets.append(_launch("litellm", [str(venv / "bin" / "litellm"), "--config", str(tmp / "litellm.yaml"),
                                                   "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                                       tmp, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
                                       health=f"http://127.0.0.1:{port}/health/liveliness"))
            else:
                targets.append(_launch(peer, [str(venv / "bin" / "python"), "-c", _AGL, str(tmp / f"{peer}.json"),
                                              str(_free_port()), upstream, str(n), KEY],
                                       tmp, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"}))
        except RuntimeError as exc:
            notes.append(f"{peer}: skipped, it did not start: {exc}")
    return targets, notes


# ----------------------------------------------------------------------------- measuring


@dataclass
class Case:
    """The figures of one target at one concurrency and mode, per repeat."""

    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def run_case(target: Target, server: Target, clients: int, stream: bool, calls: int, case: Case) -> None:
    """``clients`` concurrent SDK clients × ``calls`` sequential calls each (after one untimed call each);
    ``server``: the process whose CPU time per call is counted (the upstream's for ``direct``)."""
    import openai

    sdk = [openai.AsyncOpenAI(base_url=target.urls[i % len(target.urls)], api_key=target.key, max_retries=0,
                              timeout=120) for i in range(clients)]
    times: list[float] = []

    async def one(client: openai.AsyncOpenAI, timed: bool) -> None:
        t0 = time.perf_counter()
        try:
            resp = await client.chat.completions.create(model=MODEL, messages=MESSAGES,  # type: ignore[arg-type]
                                                        max_tokens=32, stream=stream)
            if stream:
                async for _ in resp:  # type: ignore[union-attr]
                    pass
        except Exception as exc:  # noqa: BLE001 - counted, the first one shown
            case.errors += 1
            case.first_error = case.first_error or f"{type(exc).__name__}: {exc}"[:300]
            return
        if timed:
            times.append(time.perf_counter() - t0)

    async def worker(client: openai.AsyncOpenAI) -> None:
        for _ in range(calls):
            await one(client, True)

    await asyncio.gather(*(one(c, False) for c in sdk))
    cpu0, t0 = server.cpu_s(), time.perf_counter()
    await asyncio.gather(*(worker(c) for c in sdk))
    wall, cpu = time.perf_counter() - t0, server.cpu_s() - cpu0
    for c in sdk:
        await c.close()
    case.p50.append(_pct(times, 0.5) * 1e3)
    case.p99.append(_pct(times, 0.99) * 1e3)
    case.rps.append(len(times) / wall)
    case.cpu_ms.append(cpu / max(1, len(times)) * 1e3)


def _mm(xs: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(min(xs))} / {fmt.format(statistics.median(xs))}" if xs else "-"


def report(results: dict[tuple[str, int, bool], Case], names: list[str], levels: list[int]) -> None:
    """The side-by-side table: added p50/p99 over direct (same repeat), requests/s; min / median over repeats."""
    print("\n| target | clients | mode | p50 added ms | p99 added ms | p50 ms | requests/s | server CPU ms/call "
          "| errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    for clients in levels:
        for stream in (False, True):
            base = results[("direct", clients, stream)]
            for name in names:
                case = results[(name, clients, stream)]
                added50 = [a - b for a, b in zip(case.p50, base.p50, strict=False)]
                added99 = [a - b for a, b in zip(case.p99, base.p99, strict=False)]
                added = "-" if name == "direct" else None
                print(f"| {name} | {clients} | {'stream' if stream else 'json'} | {added or _mm(added50, '{:.2f}')} | "
                      f"{added or _mm(added99, '{:.2f}')} | {_mm(case.p50, '{:.2f}')} | {_mm(case.rps, '{:.0f}')} | "
                      f"{_mm(case.cpu_ms, '{:.2f}')} | "
                      f"{case.errors}{' (' + case.first_error + ')' if case.errors else ''} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", default="1,32,64", help="concurrency levels, comma separated")
    ap.add_argument("--calls-single", type=int, default=200, help="sequential calls of the one client")
    ap.add_argument("--calls", type=int, default=16, help="sequential calls of each client at concurrency > 1")
    ap.add_argument("--peers", default="litellm,agentlightning", help="comma separated; '' for none")
    ap.add_argument("--clawgym", default="auto/auto",
                    help="ClawGym variants to compare, comma separated HTTP-PARSER/LOOP[/INLINE-BYTES] (auto|httptools|"
                         "h11 / auto|uvloop|asyncio / a live call's largest body prepared on the loop, 0: never), "
                         "e.g. auto/auto,h11/asyncio/0 (the proxy before these options)")
    ap.add_argument("--serve-upstream", metavar="OUT", help=argparse.SUPPRESS)
    ap.add_argument("--serve-clawgym", nargs=4, metavar=("OUT", "UPSTREAM", "N", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        asyncio.run(_serve_upstream(Path(args.serve_upstream)))
        return
    if args.serve_clawgym:
        _serve_clawgym(Path(args.serve_clawgym[0]), args.serve_clawgym[1], int(args.serve_clawgym[2]),
                       args.serve_clawgym[3])
        return
    levels = [int(x) for x in args.clients.split(",")]
    peers = [p for p in args.peers.split(",") if p]
    targets: list[Target] = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmpdir:
        tmp = Path(tmpdir)
        try:
            up = _launch("upstream", [sys.executable, str(Path(__file__).resolve()), "--serve-upstream",
                                      str(tmp / "upstream.json")], tmp)
            targets.append(up)
            variants = tuple(v.strip() for v in args.clawgym.split(",") if v.strip())
            started, notes = start_targets(up.urls[0], max(levels), peers, tmp, variants)
            targets += started[1:]
            names = [t.name for t in started]
            for note in notes:
                print(note)
            results = {(t.name, c, s): Case() for t in started for c in levels for s in (False, True)}
            for r in range(args.repeats):
                for clients in levels:
                    for stream in (False, True):
                        for t in started:
                            calls = args.calls_single if clients == 1 else args.calls
                            server = up if t.name == "direct" else t
                            asyncio.run(run_case(t, server, clients, stream, calls,
                                                 results[(t.name, clients, stream)]))
                print(f"repeat {r + 1}/{args.repeats} done", flush=True)
        finally:
            for t in targets:
                t.stop()
    print(f"\n{args.repeats} repeats, cases alternating targets; 1 client: {args.calls_single} calls, "
          f"N clients: {args.calls} calls each; min / median over repeats; added = target minus direct, same repeat")
    report(results, names, levels)


if __name__ == "__main__":
    main()
