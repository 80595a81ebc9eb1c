"""Benchmark one GRPO training step: packed call tree vs per-call samples (the flat way).

Data: a group of ``--group`` synthetic episodes shaped like captured ``mini`` episodes — the real
mini system prompt and tool schemas rendered by the Qwen3 chat template, then ``--calls`` turns,
each call's prompt = the previous prompt + its output + a tool result (token-exact chains), so
consecutive calls share everything but their tail; the episodes share the system prompt and task.

* **packed**: the group is one call tree → one packed sequence with a tree attention mask → one
  forward/backward (:mod:`trainers.tree_batch`, :func:`trainers.grpo.grpo_loss`).
* **flat**: every call is its own causal sequence (prompt + output), forward/backward one after the
  other with gradients accumulated — what a trainer without trees does, the memory-friendly way.

Both use the same model, the same chunked LM head and the same loss weights (each episode's token
mean, then the mean over episodes), so the loss values agree and the difference is the tokens
processed. Each mode runs in a fresh subprocess; peak memory is that process's peak RSS above its
RSS before the step (CPU) or ``torch.cuda.max_memory_allocated`` (CUDA). Prints one JSON line per
mode and the ratios. Example: ``python bench/bench_train_step.py --calls 12 --group 4``.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def synthetic_group(tok, group: int, calls: int, seed: int = 0):
    from clawgym_env.capture.records import CallRecord, EpisodeRecord
    from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids
    from harness_adapters.mini import agent

    rng = random.Random(seed)
    base = render_prompt_ids(tok, [{"role": "system", "content": agent.SYSTEM_PROMPT},
                                   {"role": "user", "content": "Find the failing test in the repo and fix it."}],
                             agent.TOOLS)
    episodes = []
    for e in range(group):
        prompt, recs = list(base), []
        for c in range(calls):
            if c < calls - 1:
                cmd = f"grep -rn 'def test_{rng.randint(0, 999)}' tests/ | head -{rng.randint(5, 40)}"
                text = assistant_text("", tool_calls=[("bash", {"command": cmd})])
            else:
                text = assistant_text(f"Fixed: the off-by-one in parse_{rng.randint(0, 99)}.")
            out = list(tok.encode(text, add_special_tokens=False))
            recs.append(CallRecord(episode_id=f"e{e}", call_index=c, dialect="openai_chat", path="/v1/chat/completions",
                                   stream=False, request={}, prompt_token_ids=list(prompt), output_token_ids=out,
                                   output_logprobs=[-rng.uniform(0.05, 2.0) for _ in out], finish_reason="stop"))
            result = " ".join(f"tests/test_{rng.randint(0, 99)}.py:{rng.randint(1, 400)}" for _ in range(12))
            tail = list(tok.encode(f"\n<|im_start|>user\n<tool_response>\nexit code: 0\n{result}\n</tool_response>"
                                   "<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False))
            prompt = prompt + out + tail
        rec = EpisodeRecord(episode_id=f"e{e}", task_id="bench", suite="bench", harness="mini", policy="tiny",
                            status="ok", reward=float(e % 2), num_calls=calls)
        episodes.append((rec, recs))
    return episodes


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_mode(args) -> dict:
    import torch

    from clawgym_env.capture.tree import CallTree
    from clawgym_env.policy.tokenizer import load_tokenizer
    from trainers.grpo import grpo_loss
    from trainers.logprobs import token_logprobs
    from trainers.policy import PolicyConfig, TrainablePolicy
    from trainers.tree_batch import build_pack, make_groups, pack_groups

    torch.set_num_threads(args.threads)
    tok = load_tokenizer()
    policy = TrainablePolicy(PolicyConfig(model="tiny", tiny_hidden_size=args.hidden, tiny_layers=args.layers,
                                          tiny_intermediate=2 * args.hidden, device=args.device), tokenizer=tok)
    model, dev = policy.causal_lm, policy.device
    episodes = synthetic_group(tok, args.group, args.calls)
    groups = make_groups(episodes)
    if args.mode == "packed":
        packs = pack_groups(groups, device=dev)
    else:  # one pack per call, each a plain causal sequence; weights as in the tree: 1 / (G * N_e) per token
        g = groups[0]
        packs = []
        for (rec, calls), adv in zip(g.episodes, g.advantages):
            n_e = sum(len(c.output_token_ids) for c in calls)
            for c in calls:
                tree = CallTree.from_calls([c])
                p = build_pack([(tree, [adv], {"group": 0})], device=dev)
                p.pair_weight.fill_(1.0 / (len(g.episodes) * n_e))
                p.token_weight[p.trainable] = 1.0 / (len(g.episodes) * n_e)
                packs.append(p)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base_rss = rss_mb()
    times = []
    for rep in range(args.repeats + 1):  # the first repetition warms up
        t0 = time.perf_counter()
        total = 0.0
        policy.module.zero_grad(set_to_none=True)
        for p in packs:
            with torch.no_grad():
                old = token_logprobs(model, p.packed, mask=p.trainable, vocab_limit=policy.vocab_limit)
            w = torch.where(p.trainable, torch.exp(old - p.packed.rollout_logprobs).clamp(max=2.0), torch.zeros_like(old))
            cur = token_logprobs(model, p.packed, mask=p.trainable, vocab_limit=policy.vocab_limit)
            loss, _ = grpo_loss(cur, old, w, p, clip_low=0.2, clip_high=0.2)
            loss.backward()
            total += float(loss.detach())
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if rep:
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base_rss)
    tokens = sum(p.num_tokens for p in packs)
    return {"mode": args.mode, "sequences": len(packs), "tokens_processed": tokens,
            "sampled_tokens": sum(p.num_trainable for p in packs), "loss": total,
            "step_s": sorted(times)[len(times) // 2], "peak_mem_mb": peak, "device": str(dev),
            "calls_per_episode": args.calls, "group": args.group, "hidden": args.hidden, "layers": args.layers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", choices=["packed", "flat"], help="internal: run one mode in this process")
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args)))
        return
    results = {}
    for mode in ("packed", "flat"):
        cmd = [sys.executable, __file__, "--mode", mode] + [f"--{k}={v}" for k, v in vars(args).items()
                                                            if k != "mode" and v is not None]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        results[mode] = json.loads(out)
        print(out)
    p, f = results["packed"], results["flat"]
    print(json.dumps({"flat_over_packed": {
        "tokens_processed": round(f["tokens_processed"] / p["tokens_processed"], 2),
        "step_s": round(f["step_s"] / p["step_s"], 2),
        "peak_mem_mb": round(f["peak_mem_mb"] / p["peak_mem_mb"], 2) if p["peak_mem_mb"] > 0 else None,
        "loss_abs_diff": abs(f["loss"] - p["loss"])}}))


if __name__ == "__main__":
    main()
