"""Rollout throughput: vLLM engine(s) vs the in-process transformers backend, same tiny Qwen3, on CPU.

Usage: ``python bench/bench_rollout_engines.py [--concurrency 1 4 16] [--episodes 16] [--turns 3]
[--tokens 32] [--replicas 1]``

An episode here is what a harness's model calls look like, without the harness: ``--turns`` calls whose
prompts grow (a long system prompt, then each turn appends the sampled answer and a tool result), all
with the episode's id, so a vLLM engine can reuse the episode's prefix. ``--episodes`` episodes run,
``c`` at a time on threads, for each ``c`` in ``--concurrency``. The vLLM side is what
``trainers.rollouts.generation.open_generation`` builds for a trainer (``ReplicaPolicy`` over ``--replicas``
engines, episode-sticky); the transformers side is ``TransformersPolicy`` (batch 1 behind a lock, a
full prefill per call). Printed side by side: episodes/min, generated tokens/s, and for vLLM the
prefix-cache hit rate (prompt tokens found cached / looked up, from the engines' metrics). The random
model never says ``<|im_end|>``, so every call decodes ``--tokens`` tokens. Needs the venv from
``scripts/vllm_env.sh``.
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
from trainers.rollouts.generation import GenerationConfig, open_generation

SYSTEM = "You are a coding agent working in a sandbox. Use the tools to inspect and change files. " * 12


class Trainee:
    """What open_generation needs of a trainer's policy."""

    def __init__(self, model, tokenizer) -> None:
        self.causal_lm, self.tokenizer = model, tokenizer

    def serving_state_dict(self):
        return self.causal_lm.state_dict()


def episode(policy, tokenizer, name: str, turns: int, tokens: int) -> int:
    """One multi-turn episode; returns the tokens generated."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Task {name}: fix the tests."}]
    total = 0
    for turn in range(turns):
        ids = render_prompt_ids(tokenizer, messages)
        gen = policy.generate(ids, SamplingParams(max_tokens=tokens, seed=turn),
                              GenerationContext(episode_id=name))
        total += len(gen.token_ids)
        messages += [{"role": "assistant", "content": tokenizer.decode(gen.token_ids)},
                     {"role": "user", "content": f"Tool result {turn}: 3 files changed, 1 test failing."}]
    return total


def run(policy, tokenizer, concurrency: int, episodes: int, turns: int, tokens: int) -> tuple[float, float]:
    """(episodes per minute, generated tokens per second)."""
    episode(policy, tokenizer, "warmup", 1, 4)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=concurrency) as pool:
        futs = [pool.submit(episode, policy, tokenizer, f"c{concurrency}-e{i}", turns, tokens) for i in range(episodes)]
        generated = sum(f.result() for f in futs)
    wall = time.perf_counter() - t0
    return episodes / wall * 60.0, generated / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--replicas", type=int, default=1)
    args = ap.parse_args()
    tokenizer = load_tokenizer()
    model = build_tiny_qwen3(tokenizer, heads=2, kv_heads=1, seed=0)  # head_dim 32: vLLM's CPU attention has it
    rows: list[tuple[str, int, float, float, float | None]] = []
    local = TransformersPolicy(model, tokenizer)
    for c in args.concurrency:
        epm, tps = run(local, tokenizer, c, args.episodes, args.turns, args.tokens)
        rows.append(("transformers", c, epm, tps, None))
        print(f"transformers c={c}: {epm:.1f} episodes/min", flush=True)
    cfg = GenerationConfig(backend="vllm", replicas=args.replicas, dtype="float32", enforce_eager=True,
                           kv_cache_gib=1, sync="restart")
    with tempfile.TemporaryDirectory(prefix="cg-bench-engines-") as tmp, \
            open_generation(cfg, Trainee(model, tokenizer), Path(tmp), max_context_tokens=4096) as sync:
        serving = sync.serving
        for c in args.concurrency:
            sync.step_metrics()
            epm, tps = run(serving, tokenizer, c, args.episodes, args.turns, args.tokens)
            rate = sync.step_metrics().get("prefix_cache_hit_rate")
            rows.append((f"vllm x{args.replicas}", c, epm, tps, rate))
            print(f"vllm c={c}: {epm:.1f} episodes/min", flush=True)
    print(f"\n{args.episodes} episodes x {args.turns} calls x {args.tokens} tokens, tiny Qwen3 (fp32, CPU)")
    print(f"{'engine':14s} {'concurrent':>10s} {'episodes/min':>13s} {'tokens/s':>9s} {'prefix hit':>10s}")
    for name, c, epm, tps, rate in rows:
        hit = f"{rate:10.2f}" if rate is not None else f"{'-':>10s}"
        print(f"{name:14s} {c:10d} {epm:13.1f} {tps:9.1f} {hit}")


if __name__ == "__main__":
    main()
