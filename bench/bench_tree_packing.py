"""Tree packing vs per-call samples: tokens, forward+backward wall time and peak memory on a tiny Qwen3.

Usage: ``python bench/bench_tree_packing.py [--system-tokens 4000] [--calls 10] [--episodes 2] [--impl sdpa]``

Synthetic episodes shaped like real harness traffic, built with the real Qwen3 tokenizer and chat
template: a long system prompt (tool manual, ~``--system-tokens`` tokens) and a task, then
``--calls`` calls per episode, each extending the previous call's prompt + output by a tool result
(token-exact, as the proxy's splicing makes them). ``--episodes`` episodes of one task form a GRPO
group (one call tree sharing the system prompt and task).

Per-call training runs every call as its own causal sequence (loss on that call's output tokens);
tree training runs the packed group once (loss on every sampled token once). Both losses are the
same sum, so both runs print it. Each variant runs in a fresh subprocess so that its peak resident
memory (``getrusage`` high-water mark, minus the mark before the step) is its own.
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

WORDS = ("file read write path list search grep patch diff test build run shell command output error line "
         "token model agent tool result workspace directory config json yaml python node package install "
         "version schema field value return status exit code timeout retry cache memory limit sandbox user "
         "system prompt context call request response stream parse format encode decode check verify").split()


def _text(rng: random.Random, tok, n_tokens: int, prefix: str = "") -> str:
    """Pseudo-documentation of about ``n_tokens`` tokens (sentence token counts summed)."""
    parts, count = [prefix], len(tok.encode(prefix, add_special_tokens=False)) if prefix else 0
    while count < n_tokens:
        sent = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16)))
        line = f"- {sent.capitalize()} (see `{rng.choice(WORDS)}_{rng.randint(0, 999)}`).\n"
        parts.append(line)
        count += len(tok.encode(line, add_special_tokens=False))
    return "".join(parts)


def build_group(tok, system_tokens: int, calls: int, episodes: int, tool_tokens: int, output_tokens: int,
                seed: int = 0):
    """(group CallTree, per-call (ids, n_prompt) samples)."""
    from clawgym_env.capture.records import CallRecord, EpisodeRecord
    from clawgym_env.capture.tree import CallTree
    from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids

    rng = random.Random(seed)
    system = _text(rng, tok, system_tokens, "You are a coding agent. Tool manual follows.\n")
    base = render_prompt_ids(tok, [{"role": "system", "content": system},
                                   {"role": "user", "content": "Fix the failing test in the workspace."}])
    tail_open = tok.encode("\n<|im_start|>user\n<tool_response>\n", add_special_tokens=False)
    tail_close = tok.encode("\n</tool_response><|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    group = []
    for e in range(episodes):
        prompt, recs = list(base), []
        for c in range(calls):
            thought = _text(rng, tok, output_tokens - 30)
            out = tok.encode(assistant_text("", reasoning=thought,
                                            tool_calls=[("read_file", {"path": f"src/m{e}_{c}.py"})]),
                             add_special_tokens=False)
            recs.append(CallRecord(episode_id=f"e{e}", call_index=c, dialect="openai_chat", path="/v1/chat/completions",
                                   stream=False, request={}, prompt_token_ids=list(prompt), output_token_ids=out,
                                   output_logprobs=[-rng.uniform(0.0, 4.0) for _ in out], finish_reason="stop"))
            result = tok.encode(_text(rng, tok, tool_tokens), add_special_tokens=False)
            prompt = prompt + out + tail_open + result + tail_close
        group.append((EpisodeRecord(episode_id=f"e{e}", task_id="fix", suite="bench", harness="synthetic",
                                    policy="tiny", status="ok", reward=float(e % 2)), recs))
    tree = CallTree.from_episodes(group)
    samples = [(r.prompt_token_ids + r.output_token_ids, len(r.prompt_token_ids)) for _, rs in group for r in rs]
    return tree, samples


def load_group(episodes_dir: str):
    """(group CallTree, per-call samples) from captured episodes (``*/calls.jsonl`` + ``episode.json``)."""
    from clawgym_env.capture.records import EpisodeRecord, read_calls
    from clawgym_env.capture.tree import CallTree

    group = []
    for ep in sorted(Path(episodes_dir).glob("*/episode.json")):
        rec = EpisodeRecord.model_validate_json(ep.read_text())
        group.append((rec, read_calls(ep.parent / "calls.jsonl")))
    if not group:
        raise SystemExit(f"no captured episodes under {episodes_dir}; run bench/capture_long_episodes.py first")
    tree = CallTree.from_episodes(group)
    samples = [(r.prompt_token_ids + r.output_token_ids, len(r.prompt_token_ids)) for _, rs in group for r in rs]
    return tree, samples


def _group(tok, args):
    if args.episodes_dir:
        return load_group(args.episodes_dir)
    return build_group(tok, args.system_tokens, args.calls, args.episodes, args.tool_tokens, args.output_tokens)


def _step(mode: str, args) -> dict:
    import torch

    from clawgym_env.policy.tiny import build_tiny_qwen3
    from clawgym_env.policy.tokenizer import load_tokenizer
    from trainers.batch.logprobs import chunked_logprobs, token_logprobs
    from trainers.batch.packing import pack_trees

    torch.manual_seed(0)
    tok = load_tokenizer()
    tree, samples = _group(tok, args)
    model = build_tiny_qwen3(tok, hidden_size=args.hidden, num_layers=args.layers)
    model.set_attn_implementation(args.impl)
    head, vl = model.get_output_embeddings(), len(tok)
    pack = pack_trees(tree) if mode == "packed" else None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "packed":
        lp = token_logprobs(model, pack, args.chunk, mask=pack.target_mask, vocab_limit=vl)
        loss = (lp * pack.path_counts * pack.target_mask).sum()  # shared sampled tokens once per episode
        loss.backward()
        total = float(loss.detach())
    else:
        total = 0.0
        for ids, n_prompt in samples:
            x = torch.tensor([ids])
            h = model.model(input_ids=x, use_cache=False).last_hidden_state[0, n_prompt - 1:-1]
            loss = chunked_logprobs(h, head, x[0, n_prompt:], args.chunk, vocab_limit=vl).sum()
            loss.backward()
            total += float(loss.detach())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": mode, "wall_s": wall, "cpu_s": cpu, "peak_rss_mib": (peak - before) / 1024.0, "loss": total,
            "mask": ("none (chain: causal)" if pack.is_chain else f"tree mask, {args.impl}") if pack else "causal"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system-tokens", type=int, default=4000)
    ap.add_argument("--calls", type=int, default=10, help="calls per episode")
    ap.add_argument("--episodes", type=int, default=2, help="episodes in the group (one tree)")
    ap.add_argument("--tool-tokens", type=int, default=150)
    ap.add_argument("--output-tokens", type=int, default=50)
    ap.add_argument("--impl", default="sdpa", choices=["sdpa", "eager", "flex_attention"],
                    help="attention implementation (flex_attention has no backward on CPU in torch 2.13)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=128, help="LM-head chunk (rows) in both variants")
    ap.add_argument("--episodes-dir", help="use captured episodes (bench/capture_long_episodes.py) instead of "
                                           "synthetic ones")
    ap.add_argument("--mode", choices=["packed", "per-call"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(_step(args.mode, args)))
        return

    from clawgym_env.policy.tokenizer import load_tokenizer

    tok = load_tokenizer()
    tree, samples = _group(tok, args)
    st = tree.stats()
    per_call = sum(len(ids) for ids, _ in samples)
    source = args.episodes_dir or f"synthetic, system prompt ~{args.system_tokens} tokens"
    print(f"group: {len(tree.meta.episodes) or args.episodes} episodes, {len(samples)} calls ({source}), "
          f"longest call {max(len(i) for i, _ in samples)} tokens, sampled tokens {st.sampled_tokens}")
    print(f"tokens: per-call samples {per_call}, tree {st.tree_tokens}  -> ratio {per_call / st.tree_tokens:.2f}x")
    res = {}
    here = Path(__file__).resolve()
    passthrough = [a for a in sys.argv[1:]]
    for mode in ("per-call", "packed"):
        proc = subprocess.run([sys.executable, str(here), *passthrough, "--mode", mode], capture_output=True,
                              text=True, cwd=str(here.parent.parent))
        if proc.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
        res[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = res[mode]
        print(f"{mode:8s} forward+backward ({args.impl}, hidden {args.hidden}, {args.layers} layers, "
              f"chunk {args.chunk}): "
              f"{r['wall_s']:7.2f} s wall, {r['cpu_s']:7.2f} s CPU   peak RSS +{r['peak_rss_mib']:8.1f} MiB   "
              f"loss {r['loss']:.4f}   [{r['mask']}]")
    a, b = res["per-call"], res["packed"]
    print(f"ratios (per-call / packed): wall time {a['wall_s'] / b['wall_s']:.2f}x "
          f"(CPU time {a['cpu_s'] / b['cpu_s']:.2f}x), "
          f"peak memory {a['peak_rss_mib'] / max(b['peak_rss_mib'], 1e-9):.2f}x; "
          f"loss rel. diff {abs(a['loss'] - b['loss']) / abs(a['loss']):.1e}")


if __name__ == "__main__":
    main()
