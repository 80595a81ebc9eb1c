"""What a thread hop costs against what a short call's bookkeeping costs: the figures behind ``inline_bytes``.

    python3 bench/bench_proxy_inline.py [--repeats 15]

A live-streamed call (``clawgym_env.proxy.stream.live``) prepares its prompt and records its answer on the event loop
when both are short, and in worker threads otherwise. This prints, on the real Qwen3 tokenizer and the echo
policy:
  * the CPU time of ``prepare_turn`` from scratch (no cached prefix: the worst case) against the request body's
    size and shape (long messages, many tiny messages, tool calls, a tool list);
  * the CPU time of ``finish_turn`` (cut, parse, record) against the answer's length;
  * the wall time of one hop to a worker thread and back (``run_in_executor`` of a no-op), idle and with busy
    Python threads competing for the GIL (what worker threads rendering other calls do).
Median and max over ``--repeats``; not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clawgym_env.policy.base import Generation  # noqa: E402
from clawgym_env.policy.tokenizer import load_tokenizer  # noqa: E402
from clawgym_env.proxy.dialects.openai_chat import dialect as openai_chat
from clawgym_env.proxy.sessions import Limits, SessionRegistry, TurnMeta  # noqa: E402
from clawgym_env.proxy.turn import finish_turn, prepare_turn  # noqa: E402
from clawgym_env.testing import EchoScriptPolicy  # noqa: E402

LIMITS = Limits(max_context=1 << 20, default_max_tokens=4096, max_prompt_chars=0)


def _cpu_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    xs = []
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        xs.append(time.thread_time() - t)
    return statistics.median(xs) * 1e3, max(xs) * 1e3


def _bodies() -> dict[str, dict[str, Any]]:
    def chat(n: int, chars: int) -> list[dict[str, Any]]:
        return ([{"role": "system", "content": "You are a helpful assistant."}]
                + [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * (chars // 5)} for i in range(n)]
                + [{"role": "user", "content": "hi"}])
    tools = [{"type": "function", "function": {"name": f"t{i}", "description": "d" * 50, "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}} for i in range(30)]
    call = {"name": "t", "arguments": '{"a": 1}'}
    calls = sum(([{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function",
                                                                        "function": call}]},
                  {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"}] for i in range(60)), [])
    return {"system + user": {"messages": chat(0, 0)}, "2 turns of 500 B": {"messages": chat(2, 500)},
            "4 turns of 2 KB": {"messages": chat(4, 2000)}, "8 turns of 4 KB": {"messages": chat(8, 4000)},
            "400 tiny turns": {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": "hey"}
                                            for i in range(401)]},
            "60 tool calls": {"messages": [{"role": "user", "content": "hi"}] + calls},
            "a 30-tool list": {"messages": chat(0, 0), "tools": tools}}


async def _hops(busy: int, n: int = 300) -> tuple[float, float]:
    loop, ex, stop = asyncio.get_running_loop(), cf.ThreadPoolExecutor(64), threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))
    threads = [threading.Thread(target=spin) for _ in range(busy)]
    for t in threads:
        t.start()
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        await loop.run_in_executor(ex, int)
        xs.append(time.perf_counter() - t0)
    stop.set()
    for t in threads:
        t.join()
    ex.shutdown()
    xs.sort()
    return xs[n // 2] * 1e3, xs[int(n * 0.99)] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    tok = load_tokenizer()
    policy, registry = EchoScriptPolicy(tok), SessionRegistry()
    print("| request | body bytes | prepare_turn from scratch, CPU ms (median / max) |\n|---|---|---|")
    for name, extra in _bodies().items():
        body = {"model": "m", "stream": True, **extra}
        treq = openai_chat.parse_request(body)

        def fresh(treq: Any = treq) -> None:
            session = registry.open(None)
            prepare_turn(session, policy, treq, LIMITS)
            registry.close(session.token)
        fresh()
        med, top = _cpu_ms(fresh, args.repeats)
        print(f"| {name} | {len(json.dumps(body))} | {med:.2f} / {top:.2f} |")
    print("\n| answer tokens | finish_turn CPU ms (median / max) |\n|---|---|")
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    treq = openai_chat.parse_request(body)
    for n in (20, 200, 1000, 4000):
        session = registry.open(None)
        prep = prepare_turn(session, policy, treq, LIMITS)
        ids = tok.encode("hello world " * n, add_special_tokens=False)[:n] + [tok.convert_tokens_to_ids("<|im_end|>")]
        gen = Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")
        meta = TurnMeta(dialect="openai_chat", path="/v1/chat/completions", body=body, headers={},
                        started_at=time.time())
        med, top = _cpu_ms(lambda s=session, m=meta, p=prep, g=gen: finish_turn(s, policy, treq, m, p, g),
                           args.repeats)
        print(f"| {len(ids)} | {med:.2f} / {top:.2f} |")
    print("\n| busy Python threads | hop to a worker and back, wall ms (p50 / p99) |\n|---|---|")
    for busy in (0, 1, 4):
        p50, p99 = asyncio.run(_hops(busy))
        print(f"| {busy} | {p50:.3f} / {p99:.3f} |")


if __name__ == "__main__":
    main()
