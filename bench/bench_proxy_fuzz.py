"""Fuzz the serving proxy: malformed, oversized, unicode and deeply nested requests across the dialects.

The proxy runs in its own process (a real :class:`ProxyServer`, policy ``scripted:noop`` on the real
Qwen3 tokenizer, default limits: 32,768-token context, request bodies up to ``ProxyLimits.max_body_bytes``
(16 MiB, every field counted); captured calls stream to ``calls_path`` files), so its memory is measured
alone. Client threads send ``--requests`` requests, drawn at random (seeded) from these families, to the
three dialects' routes of a few open episodes:

  * broken bytes: random bytes, truncated JSON, non-UTF-8, NaN/Infinity, empty, wrong content-type;
  * wrong shapes: every top-level field and message field replaced by a value of another type;
  * unicode: lone surrogates, NUL, RTL marks, emoji, combining runs, in content, names and tools;
  * nesting: JSON 300 to 100,000 levels deep, inside metadata, tools and content;
  * oversized: prompts just over the proxy's character bound (about 0.5 MB: under the body cap);
  * valid requests (streaming and not), so that serving continues throughout.

Then ``--large`` single-message requests, one shape after another across the dialects: a body 64 KiB under
the body cap (the largest the proxy reads and parses; its prompt is then refused by the character bound),
a 50 MB body with its ``Content-Length`` (refused from its head: 413) and the same 50 MB chunked (read up to
the cap, then 413; a 50 MB request is what drove the proxy past 8 GB before prompts were bounded).

Prints the status-code histogram, the number of 500s and of transport failures (both must be 0),
the large requests' statuses, whether the proxy process is alive, and its RSS and peak RSS (VmHWM)
before and after.

    python3 bench/bench_proxy_fuzz.py --requests 10000 --threads 8 --large 6
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clawgym_env.proxy.guards.bounds import ProxyLimits  # noqa: E402 - after the path set-up
from clawgym_env.proxy.guards.limits import CHARS_PER_TOKEN_BOUND  # noqa: E402

ROUTES = ["/chat/completions", "/messages", "/responses"]
BODY_CAP = ProxyLimits().max_body_bytes  # the proxy's default body cap (16 MiB)
OVER_CAP = 50_000_000  # the large requests past the cap: 50 MB, about 3x the cap
LARGE_SHAPES = ["under the cap", "50 MB sized", "50 MB chunked"]


def _serve(conn, episodes: int) -> None:
    import tempfile

    from clawgym_env.policy import make_policy
    from clawgym_env.proxy.server import ProxyServer

    with ProxyServer(make_policy("scripted:noop")) as srv, tempfile.TemporaryDirectory() as tmp:
        sessions = [srv.open_episode(calls_path=Path(tmp) / f"calls-{i}.jsonl") for i in range(episodes)]
        conn.send((srv.url, [s.base_url(srv.url) for s in sessions]))
        conn.recv()  # wait for the stop
        counts = [len(srv.close_episode(s.token)) for s in sessions]
        conn.send(counts)


def _mem(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _deep(depth: int, leaf: object = "x") -> object:
    value = leaf
    for _ in range(depth):
        value = [value] if depth % 2 else {"k": value}
    return value


WEIRD = ["\ud800", "\udfff", "\x00", "\u202e", "🤖" * 50, "e\u0301" * 200, "\ufeff", "\U0010ffff", "'\"\\",
         "<|im_end|>", "<|im_start|>system\n", "</think>", "<tool_call>{", "\r\n\r\n"]
ODD = [None, True, -1, 0, 1e308, 2 ** 70, "", "x", [], {}, [None], {"": None}, "🤖", [[[]]]]


def _valid(route: str, rng: random.Random, text: str = "hello") -> dict:
    stream = rng.random() < 0.3
    if route == "/chat/completions":
        return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}]}
    if route == "/messages":
        return {"model": "m", "max_tokens": 16, "stream": stream, "messages": [{"role": "user", "content": text}]}
    return {"model": "m", "stream": stream, "input": [{"type": "message", "role": "user", "content": text}]}


def _mutate(body: dict, rng: random.Random) -> dict:
    body = json.loads(json.dumps(body))
    for _ in range(rng.randint(1, 3)):
        target = body
        if rng.random() < 0.5:
            for key in ("messages", "input"):
                if isinstance(body.get(key), list) and body[key] and isinstance(body[key][0], dict):
                    target = body[key][0]
        key = rng.choice(list(target) + ["tools", "tool_choice", "temperature", "stop", "thread", "system",
                                          "thinking", "reasoning", "previous_response_id", "n", "max_tokens"])
        target[key] = rng.choice(ODD + [rng.choice(WEIRD)])
    return body


def make_request(rng: random.Random, bound_chars: int) -> tuple[str, bytes, dict]:
    route = rng.choice(ROUTES)
    headers = {"content-type": "application/json"}
    kind = rng.random()
    if kind < 0.12:
        raw = rng.choice([rng.randbytes(rng.randint(0, 2000)), b"", b"{", b'{"messages": [', b"\xff\xfe{}",
                          b'{"model": NaN}', b'{"x": Infinity}', b"[]", b"null", b'"str"', b"1e999"])
        if rng.random() < 0.2:
            headers["content-type"] = rng.choice(["text/plain", "application/xml", "multipart/form-data"])
        return route, raw, headers
    if kind < 0.45:
        return route, json.dumps(_mutate(_valid(route, rng), rng)).encode(), headers
    if kind < 0.65:
        text = "".join(rng.choice(WEIRD) for _ in range(rng.randint(1, 40)))
        body = _valid(route, rng, text)
        if rng.random() < 0.5:
            body["tools"] = [{"type": "function", "name": text[:30] or "t",
                              "function": {"name": text[:30] or "t", "parameters": {"type": "object"}},
                              "input_schema": {"type": "object"}}]
        return route, json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass"), headers
    if kind < 0.85:
        body = _valid(route, rng)
        depth = rng.choice([65, 300, 1000, 5000, 100_000])
        if depth >= 1000:  # built as text: too deep for json.dumps
            return route, (b'{"model": "m", "metadata": ' + b"[" * depth + b"]" * depth + b"}"), headers
        body[rng.choice(["metadata", "tools", "stop"])] = _deep(depth)
        return route, json.dumps(body).encode(), headers
    if kind < 0.88:
        return route, json.dumps(_valid(route, rng, "w " * (bound_chars // 2 + 10))).encode(), headers
    return route, json.dumps(_valid(route, rng, f"valid {rng.random()}")).encode(), headers


def _send_large(client: httpx.Client, url: str, route: str, shape: str, seed: int, headers: dict) -> object:
    """One large single-message request of ``shape`` (see LARGE_SHAPES); its status, or the transport error."""
    empty = len(json.dumps(_valid(route, random.Random(seed), "")))
    size = BODY_CAP - (64 << 10) if shape == "under the cap" else OVER_CAP
    body = json.dumps(_valid(route, random.Random(seed), "w" * (size - empty))).encode()
    content: bytes | Iterator[bytes] = body
    if shape.endswith("chunked"):  # no Content-Length: the proxy has to count the bytes as they come
        content = (body[k:k + (1 << 20)] for k in range(0, len(body), 1 << 20))
    try:
        return client.post(url, content=content, headers=headers).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--large", type=int, default=6,
                    help="single-message requests just under the body cap, 50 MB sized and 50 MB chunked, in turn")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, args.episodes), daemon=True)
    proc.start()
    url, bases = parent.recv()
    with httpx.Client() as c:  # one valid call per episode first, so "before" includes a warm tokenizer
        for base in bases:
            c.post(base + "/chat/completions", json=_valid("/chat/completions", random.Random(0)), timeout=60)
    rss0, hwm0 = _mem(proc.pid)
    statuses: collections.Counter = collections.Counter()
    transport: collections.Counter = collections.Counter()
    lock = threading.Lock()
    per_thread = args.requests // args.threads
    bound = 32768 * CHARS_PER_TOKEN_BOUND

    def worker(k: int) -> None:
        rng = random.Random(args.seed * 1000 + k)
        with httpx.Client(timeout=120) as client:
            for _ in range(per_thread):
                route, raw, headers = make_request(rng, bound)
                try:
                    r = client.post(rng.choice(bases) + route, content=raw, headers=headers)
                    key = r.status_code
                    with lock:
                        statuses[key] += 1
                except httpx.HTTPError as exc:
                    with lock:
                        transport[type(exc).__name__] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fuzz_s = time.perf_counter() - t0
    rss1, hwm1 = _mem(proc.pid)
    large_status: dict[str, list] = {shape: [] for shape in LARGE_SHAPES}
    with httpx.Client(timeout=300) as client:
        for i in range(args.large):
            shape = LARGE_SHAPES[i % len(LARGE_SHAPES)]
            route, headers = ROUTES[i % len(ROUTES)], {"content-type": "application/json"}
            large_status[shape].append(_send_large(client, bases[0] + route, route, shape, i, headers))
    rss2, hwm2 = _mem(proc.pid)
    with httpx.Client() as c:
        alive = c.post(bases[0] + "/chat/completions", json=_valid("/chat/completions", random.Random(1)),
                       timeout=60).status_code == 200
    parent.send("stop")
    captured = parent.recv()
    proc.join(30)
    total = sum(statuses.values()) + sum(transport.values())
    print(f"requests: {total} fuzzed in {fuzz_s:.1f}s ({args.threads} threads) + {args.large} large")
    print("status codes:", dict(sorted(statuses.items())))
    print(f"HTTP 500: {statuses.get(500, 0)}; transport failures: {dict(transport) or 0}; "
          f"proxy still serving: {alive}; proxy exit code: {proc.exitcode}")
    print(f"large requests (body cap {BODY_CAP} bytes): " + "; ".join(f"{k}: {v}" for k, v in large_status.items()))
    print(f"calls captured per episode (valid requests served): {captured}")
    print(f"proxy RSS: {rss0:.0f} MB before, {rss1:.0f} MB after the fuzz, {rss2:.0f} MB after the large requests; "
          f"peak (VmHWM) {hwm0:.0f} -> {hwm1:.0f} -> {hwm2:.0f} MB")


if __name__ == "__main__":
    main()
