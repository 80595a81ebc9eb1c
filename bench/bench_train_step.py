"""Benchmark one GRPO training step: packed call tree vs per-call samples (the flat way).

Data, one of:

* ``--episodes-dir DIR``: captured episodes in the layout ``bench/capture_long_episodes.py`` writes (one
  folder per episode with ``calls.jsonl`` + ``episode.json``, read with the project's readers); the
  first ``--group`` of them (sorted by folder name) form the group. They must share one (task, harness)
  — one GRPO group. The scripted policy does not solve the task, so every captured reward is 0 and a
  constant-reward group would not be trained: the bench REPLACES the rewards by 1, 0, 1, 0, ... (it
  says so in its output) so that advantages are non-zero.
  A realistic group: episodes of one task sampled from one policy share the harness's system prompt,
  the task and then diverge. The scripted expert is deterministic, so ``--episodes 4`` with one
  ``--steps`` gives four token-identical episodes (one chain: nothing to branch). Capturing one episode
  each with ``--steps 10``, ``11``, ``12`` and ``13`` into one folder gives 11-14 calls per episode that
  share the ~20k-token Claude Code prompt and ten turns, then branch (the tree then has 4 leaves and
  3 branch points): a group whose rollouts agree for most of the episode, as a low-entropy policy's do.
  Rollouts that diverge from the first sampled token would share less than that (only the prompt).
* otherwise a group of ``--group`` synthetic episodes shaped like captured ``mini`` episodes — the real
  mini system prompt and tool schemas rendered by the Qwen3 chat template, then ``--calls`` turns,
  each call's prompt = the previous prompt + its output + a tool result (token-exact chains), so
  consecutive calls share everything but their tail; the episodes share the system prompt and task.

Modes (``--modes``, default all three):

* **packed_dense**: the group is one call tree → one packed sequence → ONE forward/backward with a
  dense [T, T] tree attention mask (``mask_form="additive"``; :mod:`trainers.batch.tree_batch`,
  :func:`trainers.grpo.train.grpo_loss`).
* **packed_prefix**: the same pack through the prefix-KV-reuse forward (``mask_form="prefix_cache"``,
  what ``auto`` picks for a branched pack under sdpa/eager): one forward per tree segment with its
  ancestors' keys/values as a cache, no T x T mask (:func:`trainers.batch.logprobs.prefix_cache_hidden_states`).
* **flat**: every call is its own causal sequence (prompt + output), forward/backward one after the
  other with gradients accumulated — what a trainer without trees does, the memory-friendly way.

All use the same model, the same chunked LM head and the same loss weights (each episode's token
mean, then the mean over episodes), so the loss values agree and the difference is the tokens
processed. Each mode runs in a fresh subprocess; peak memory is that process's peak RSS above its
RSS before the step (CPU) or ``torch.cuda.max_memory_allocated`` (CUDA). Prints one JSON line per
mode and the ratios flat / mode. Examples: ``python bench/bench_train_step.py --calls 12 --group 4``;
``python bench/bench_train_step.py --episodes-dir runs/long-cc-group --group 4``.

Reading the numbers: a packed step processes ``tokens_processed`` fewer tokens through the layers,
but the LM head runs on the sampled tokens in every mode (the same count, minus prefixes several
episodes sampled identically), so the wall-time gain grows with the model's layer cost relative to its
151k-row head. With ``sdpa`` and a dense tree mask, attention over one packed sequence of T tokens
holds T x T mask entries and scores (on CPU that made the packed step heavier than the flat one, and
for the synthetic 12-call group slower too); the prefix-cache forward holds only each segment's
queries x [ancestors + own] keys.
``attn_implementation="flex_attention"`` (a block-sparse mask, GPU) avoids the T x T tensors too.
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


def captured_group(episodes_dir: str, group: int):
    """The first ``group`` captured episodes under ``episodes_dir``, rewards replaced by 1, 0, 1, 0, ..."""
    from clawgym_env.capture.records import EpisodeRecord, read_calls

    found = sorted(Path(episodes_dir).glob("*/episode.json"))
    if len(found) < group:
        raise SystemExit(f"{episodes_dir} holds {len(found)} captured episodes, --group needs {group}; "
                         "run bench/capture_long_episodes.py first")
    episodes = []
    for i, ep in enumerate(found[:group]):
        rec = EpisodeRecord.model_validate_json(ep.read_text())
        episodes.append((rec.model_copy(update={"reward": float(1 - i % 2)}), read_calls(ep.parent / "calls.jsonl")))
    if len({(r.task_id, r.harness) for r, _ in episodes}) != 1:
        raise SystemExit("the captured episodes are not one group (several tasks or harnesses)")
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
    from trainers.batch.logprobs import token_logprobs
    from trainers.batch.tree_batch import PackItem, build_pack, make_groups, pack_groups
    from trainers.grpo.train import grpo_loss
    from trainers.policy import PolicyConfig, TrainablePolicy

    torch.set_num_threads(args.threads)
    tok = load_tokenizer()
    policy = TrainablePolicy(PolicyConfig(model="tiny", tiny_hidden_size=args.hidden, tiny_layers=args.layers,
                                          tiny_intermediate=2 * args.hidden, device=args.device), tokenizer=tok)
    model, dev = policy.causal_lm, policy.device
    if args.episodes_dir:
        episodes = captured_group(args.episodes_dir, args.group)
    else:
        episodes = synthetic_group(tok, args.group, args.calls)
    groups = make_groups(episodes)
    if not groups or groups[0].skipped is not None:
        raise SystemExit(f"the group is not trainable: {groups[0].skipped if groups else 'no group'}")
    form = {"packed_dense": "additive", "packed_prefix": "prefix_cache"}.get(args.mode, "auto")
    if args.mode != "flat":
        packs = pack_groups(groups, device=dev)
    else:  # one pack per call, each a plain causal sequence; weights as in the tree: 1 / (G * N_e) per token
        g = groups[0]
        packs = []
        for (_rec, calls), adv in zip(g.episodes, g.advantages):
            n_e = sum(len(c.output_token_ids) for c in calls)
            for c in calls:
                tree = CallTree.from_calls([c])
                p = build_pack([PackItem(tree, [adv])], device=dev)
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
                old = token_logprobs(model, p.packed, args.chunk, mask=p.trainable, vocab_limit=policy.vocab_limit,
                                     mask_form=form)
            w = torch.where(p.trainable, torch.exp(old - p.packed.rollout_logprobs).clamp(max=2.0),
                            torch.zeros_like(old))
            cur = token_logprobs(model, p.packed, args.chunk, mask=p.trainable, vocab_limit=policy.vocab_limit,
                                 mask_form=form)
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
    calls = [len(c) for _, c in episodes]
    extra = {"data": "synthetic"}
    if args.episodes_dir:
        extra = {"data": args.episodes_dir, "rewards": [r.reward for r, _ in episodes],
                 "rewards_note": "captured rewards replaced by alternating 1/0"}
    return {"mode": args.mode, "sequences": len(packs), "tokens_processed": tokens,
            "tree_nodes": sum(p.packed.num_nodes for p in packs) if args.mode != "flat" else None,
            "sampled_tokens": sum(p.num_trainable for p in packs), "loss": total,
            "step_s": sorted(times)[len(times) // 2], "peak_mem_mb": peak, "device": str(dev),
            "calls_per_episode": calls, "group": args.group, "hidden": args.hidden, "layers": args.layers, **extra}


MODES = ("packed_dense", "packed_prefix", "flat")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes-dir", help="captured episodes (calls.jsonl + episode.json per folder) instead of "
                                           "synthetic ones")
    ap.add_argument("--calls", type=int, default=12, help="synthetic data: calls per episode")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=1024, help="LM-head rows scored at once (trainers' chunk_size)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--mode", choices=MODES, help="internal: run one mode in this process")
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args)))
        return
    results = {}
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; use {MODES}")
        cmd = [sys.executable, __file__, "--mode", mode] + [f"--{k.replace('_', '-')}={v}"
                                                            for k, v in vars(args).items()
                                                            if k not in ("mode", "modes") and v is not None]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:  # e.g. the dense T x T mask running out of memory
            tail = (proc.stderr.strip().splitlines() or [""])[-1]
            print(json.dumps({"mode": mode, "error": f"exit {proc.returncode}: {tail[-300:]}"}))
            continue
        out = proc.stdout.strip().splitlines()[-1]
        results[mode] = json.loads(out)
        print(out)
    f = results.get("flat")
    if f is None:
        return
    for mode, r in results.items():
        if mode == "flat":
            continue
        print(json.dumps({f"flat_over_{mode}": {
            "tokens_processed": round(f["tokens_processed"] / r["tokens_processed"], 2),
            "step_s": round(f["step_s"] / r["step_s"], 2),
            "peak_mem_mb": round(f["peak_mem_mb"] / r["peak_mem_mb"], 2) if r["peak_mem_mb"] > 0 else None,
            "loss_abs_diff": abs(f["loss"] - r["loss"])}}))


if __name__ == "__main__":
    main()
