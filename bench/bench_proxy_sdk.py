"""Sessions × calls through the official SDKs: captured == served, no duplicates, added latency.

The proxy runs in its own process (a real :class:`ProxyServer`, policy ``scripted:noop`` on the real
Qwen3 tokenizer). The client process drives it with the official async SDKs — ``openai`` Chat
Completions, ``anthropic`` Messages and ``openai`` Responses, one dialect per session in turn, half
of the sessions streaming — each call carrying a unique nonce in its user message.

Phase 1: one client, ``--single`` sequential non-streaming chat calls (the per-call floor).
Phase 2: ``--sessions`` concurrent sessions × ``--calls`` sequential calls each.

Checks (printed): every call the SDKs got an answer for was captured exactly once in its own
session (by nonce), nothing else was captured, nothing twice. Added latency per call is the
client's wall time minus the policy's own ``generate_s`` recorded for that call (so it is what the
proxy, HTTP and the SDK add), as p50/p99.

    python3 bench/bench_proxy_sdk.py --sessions 64 --calls 100
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _serve(conn, sessions: int) -> None:
    from clawgym_env.policy import make_policy
    from clawgym_env.proxy.server import ProxyServer

    policy = make_policy("scripted:noop")
    policy.tokenizer  # noqa: B018 - load the tokenizer before anything is timed
    with ProxyServer(policy, workers=64) as srv:
        opened = [srv.open_episode() for _ in range(sessions + 1)]  # the last one takes the warm-up calls
        conn.send([s.base_url(srv.url) for s in opened])
        conn.recv()
        out = []
        for s in opened[:-1]:
            calls = srv.close_episode(s.token)
            out.append([(_nonce(c.request), c.timings.get("generate_s", 0.0)) for c in calls])
        conn.send(out)


def _nonce(body: dict) -> str:
    text = str(body.get("messages") or body.get("input"))
    at = text.find("nonce-")
    return text[at:at + 6 + 32] if at >= 0 else "?"


async def _call(kind: int, client, nonce: str, stream: bool) -> None:
    text = f"say hi {nonce}"
    if kind == 0:
        if stream:
            async for _ in await client.chat.completions.create(model="m", stream=True,
                                                                messages=[{"role": "user", "content": text}]):
                pass
        else:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    elif kind == 1:
        if stream:
            async with client.messages.stream(model="m", max_tokens=64,
                                              messages=[{"role": "user", "content": text}]) as s:
                await s.get_final_message()
        else:
            await client.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": text}])
    else:
        if stream:
            async for _ in await client.responses.create(model="m", input=text, stream=True):
                pass
        else:
            await client.responses.create(model="m", input=text)


def _client(kind: int, base: str):
    import anthropic
    import openai

    if kind == 1:
        return anthropic.AsyncAnthropic(base_url=base.removesuffix("/v1"), api_key="x", max_retries=0, timeout=600)
    return openai.AsyncOpenAI(base_url=base, api_key="x", max_retries=0, timeout=600)


async def _session(k: int, base: str, calls: int, served: dict, times: dict, errors: list,
                   kind: int | None = None, stream: bool | None = None) -> None:
    kind = k % 3 if kind is None else kind
    stream = (k // 3) % 2 == 1 if stream is None else stream
    client = _client(kind, base)
    for _ in range(calls):
        nonce = "nonce-" + uuid.uuid4().hex
        t0 = time.perf_counter()
        try:
            await _call(kind, client, nonce, stream)
        except Exception as exc:  # noqa: BLE001 - counted and printed
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            continue
        times[nonce] = time.perf_counter() - t0
        served.setdefault(k, []).append(nonce)
    await client.close()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def _check(name: str, served: dict, captured: list, times: dict, errors: list, wall: float) -> None:
    gen = {n: g for per in captured for n, g in per}
    dup = sum(len(per) - len({n for n, _ in per}) for per in captured)
    wrong = sum(1 for k, per in enumerate(captured) if {n for n, _ in per} != set(served.get(k, [])))
    n_served = sum(len(v) for v in served.values())
    n_captured = sum(len(per) for per in captured)
    added = [times[n] - gen.get(n, 0.0) for n in times]
    policy = [gen[n] for n in times if n in gen]
    print(f"{name}: served {n_served}, captured {n_captured}, duplicated {dup}, sessions whose capture != served "
          f"{wrong}, client errors {len(errors)}{' e.g. ' + errors[0] if errors else ''}")
    print(f"{name}: {n_served / wall:.0f} calls/s; client latency p50 {_pct(list(times.values()), .5):.2f} ms "
          f"p99 {_pct(list(times.values()), .99):.2f} ms; policy generate p50 {_pct(policy, .5):.2f} ms; "
          f"added latency p50 {_pct(added, .5):.2f} ms p99 {_pct(added, .99):.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--single", type=int, default=200, help="phase 1: sequential calls from one client")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    for name, sessions, calls in (("1 client", 1, args.single), (f"{args.sessions} sessions", args.sessions,
                                                                   args.calls)):
        if sessions == 0 or calls == 0:
            continue
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, sessions), daemon=True)
        proc.start()
        bases = parent.recv()
        warm = bases.pop()
        served: dict = {}
        times: dict = {}
        errors: list = []

        async def run(warm: str, bases: list, calls: int, sessions: int,
                      served: dict, times: dict, errors: list) -> float:
            for kind in range(3):  # first calls (SDK imports, first connections) are not timed
                for stream in (False, True):
                    await _session(0, warm, 2, {}, {}, [], kind=kind, stream=stream)
            t0 = time.perf_counter()
            await asyncio.gather(*[_session(k, b, calls, served, times, errors,
                                            kind=0 if sessions == 1 else None, stream=False if sessions == 1 else None)
                                   for k, b in enumerate(bases)])
            return time.perf_counter() - t0

        wall = asyncio.run(run(warm, bases, calls, sessions, served, times, errors))
        parent.send("stop")
        captured = parent.recv()
        proc.join(30)
        _check(name, served, captured, times, errors, wall)
        print(f"{name}: median policy share {statistics.median([g for per in captured for _, g in per]) * 1000:.2f} ms"
              if captured and captured[0] else "")


if __name__ == "__main__":
    main()
