"""Decode throughput of the tiny Qwen3: vLLM (a real server from its venv) vs TransformersPolicy, on CPU.

Usage: ``python bench/bench_vllm.py [--tokens 256] [--requests 8] [--concurrency 1 8] [--compile]``

Both backends serve the same weights (tiny random Qwen3, head_dim 32, float32) and sample the same
kind of request: a short chat prompt, ``max_tokens`` new tokens at temperature 1 (the random model
never says ``<|im_end|>``, so every request decodes the full length). Reported: generated tokens per
second over ``--requests`` requests, sent ``c`` at a time from threads (vLLM batches concurrent
requests; TransformersPolicy serialises them). Also printed: the server's start time. Needs the venv
built by ``scripts/vllm_env.sh``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import tempfile
import time
from pathlib import Path

from clawgym_env.policy.base import GenerationContext, SamplingParams
from clawgym_env.policy.chat_format import render_prompt_ids
from clawgym_env.policy.tiny import build_tiny_qwen3
from clawgym_env.policy.tokenizer import load_tokenizer
from clawgym_env.policy.transformers_backend import TransformersPolicy
from clawgym_env.policy.vllm.server import VLLMServer

CTX = GenerationContext()


def throughput(policy, prompt: list[int], tokens: int, requests: int, concurrency: int) -> float:
    """Generated tokens per second for ``requests`` requests, ``concurrency`` in flight at once."""
    policy.generate(prompt, SamplingParams(max_tokens=4, seed=0), CTX)  # warm up
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=concurrency) as pool:
        futs = [pool.submit(policy.generate, prompt, SamplingParams(max_tokens=tokens, seed=i + 1), CTX)
                for i in range(requests)]
        total = sum(len(f.result().token_ids) for f in futs)
    return total / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256, help="new tokens per request")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--compile", action="store_true", help="let vLLM compile the model (slower start)")
    args = ap.parse_args()
    tokenizer = load_tokenizer()
    prompt = render_prompt_ids(tokenizer, [{"role": "user", "content": "Summarise the files in notes/."}])
    with tempfile.TemporaryDirectory(prefix="cg-bench-vllm-") as tmp:
        model_dir = Path(tmp) / "tiny"
        build_tiny_qwen3(tokenizer, heads=2, kv_heads=1, seed=0, save_dir=model_dir)
        local = TransformersPolicy.from_pretrained(model_dir, device="cpu")
        rows = [("transformers", c, throughput(local, prompt, args.tokens, args.requests, c))
                for c in args.concurrency]
        with VLLMServer(model_dir, max_model_len=2048, enforce_eager=not args.compile,
                        log_path=Path(tmp) / "server.log") as server:
            print(f"vLLM server started in {server.start_seconds:.1f} s "
                  f"({'compiled' if args.compile else 'eager'})")
            remote = server.policy()
            rows += [("vllm", c, throughput(remote, prompt, args.tokens, args.requests, c))
                     for c in args.concurrency]
            remote.close()
    print(f"{'backend':14s} {'concurrency':>11s} {'tokens/s':>10s}   "
          f"({args.requests} requests x {args.tokens} tokens)")
    for name, c, tps in rows:
        print(f"{name:14s} {c:11d} {tps:10.1f}")


if __name__ == "__main__":
    main()
