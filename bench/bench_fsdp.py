"""Benchmark one GRPO update: one process vs 2 FSDP2 ranks (gloo on CPU, nccl on CUDA), same batch.

The batch: ``--groups`` synthetic GRPO groups (``--group-size`` episodes of ``--calls`` token-exact calls
each, sharing their task prefix; real Qwen3 tokenizer and chat template), packed one group per pack. The
model: a random Qwen3 of ``--hidden``/``--layers`` (its 151k-row embedding, tied to the LM head, is most of
a small model's parameters). Each setting runs in fresh processes (``python bench/bench_fsdp.py --worker``
directly, then under ``python -m torch.distributed.run --standalone --nproc-per-node 2``): one warm-up
update, then ``--steps`` timed updates of :func:`trainers.grpo.update.grpo_update` (AdamW).

Per rank it reports: the mean update time; the peak RSS of the process (``resource.getrusage``; on CUDA
``torch.cuda.max_memory_allocated``) and its growth over the RSS before the model was built; the bytes of
the rank's model state (its parameter shards, gradients and AdamW moments); the packed tokens the rank
trained on. Prints one JSON line per rank and a side-by-side table. On a CPU, two ranks share the machine's
cores (each rank runs with ``OMP_NUM_THREADS=1`` under the launcher), so the time column measures the
communication and padding overhead rather than a speed-up; the memory columns show the sharding.
Example: ``python bench/bench_fsdp.py --hidden 256 --layers 4 --groups 4``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    """Peak resident set size of this process so far, MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Current resident set size, MB."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def episodes(tok, groups: int, group_size: int, calls: int):
    """Synthetic GRPO rollouts: ``groups`` tasks × ``group_size`` episodes of ``calls`` chained calls."""
    from clawgym_env.capture.records import CallRecord, EpisodeRecord
    from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids

    out = []
    for g in range(groups):
        base = render_prompt_ids(tok, [{"role": "system", "content": "You are a careful agent. Use the tools."},
                                       {"role": "user", "content": f"Task {g}: count the lines of file_{g}.txt"}])
        for e in range(group_size):
            prompt, recs = list(base), []
            for c in range(calls):
                text = assistant_text(f"Step {c} of attempt {e}: reading file_{g}_{c}.txt and checking it." * 2)
                ids = list(tok.encode(text, add_special_tokens=False))
                recs.append(CallRecord(episode_id=f"{g}-{e}", call_index=c, dialect="openai_chat",
                                       path="/v1/chat/completions", stream=False, request={},
                                       prompt_token_ids=list(prompt), output_token_ids=ids,
                                       output_logprobs=[-11.5 - 0.01 * ((j * 7 + e) % 13) for j in range(len(ids))],
                                       finish_reason="stop"))
                prompt += ids + list(tok.encode(f"<|im_start|>user\nresult {c}: {g * 31 + e} lines<|im_end|>\n"
                                                "<|im_start|>assistant\n", add_special_tokens=False))
            out.append((EpisodeRecord(episode_id=f"{g}-{e}", task_id=f"t{g}", suite="bench", harness="mini",
                                      policy="tiny", status="ok", reward=float(e % 2), num_calls=calls), recs))
    return out


def worker(opts: argparse.Namespace, out: Path) -> None:
    """One setting on this rank: build, shard, warm up, time ``opts.steps`` updates, write this rank's row."""
    import torch

    from trainers.batch.tree_batch import make_groups, pack_groups
    from trainers.grpo.train import Args
    from trainers.grpo.update import grpo_update
    from trainers.policy import PolicyConfig, TrainablePolicy
    from trainers.scale.fsdp import DistConfig, destroy_distributed, init_distributed, shard_policy

    torch.manual_seed(0)
    info = init_distributed()
    base_rss = current_rss_mb()
    cfg = PolicyConfig(model="tiny", seed=0, tiny_hidden_size=opts.hidden, tiny_layers=opts.layers,
                       tiny_heads=opts.heads, tiny_kv_heads=max(1, opts.heads // 2),
                       tiny_intermediate=opts.hidden * 2, device=str(info.device))
    policy = TrainablePolicy(cfg)
    shard_policy(policy, DistConfig())
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-5)
    packs = pack_groups(make_groups(episodes(policy.tokenizer, opts.groups, opts.group_size, opts.calls)),
                        device=policy.device)
    args = Args(chunk_size=opts.chunk_size, max_grad_norm=1.0)
    cuda = info.device.type == "cuda"
    times, trained = [], 0
    for step in range(opts.steps + 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        stats = grpo_update(policy, optimizer, packs, args)
        if cuda:
            torch.cuda.synchronize()
        if step:  # the first update warms up (allocations, optimiser state)
            times.append(time.perf_counter() - t0)
            trained = int(stats["train_tokens"] or 0)
    local = [p.to_local() if hasattr(p, "to_local") else p for p in policy.trainable_parameters()]
    state_mb = sum(t.numel() * t.element_size() for t in local) * 4 / 2**20  # weights + grads + 2 AdamW moments
    row = {"setting": f"{info.world_size} rank(s)", "rank": info.rank, "step_s": sum(times) / len(times),
           "peak_rss_mb": rss_mb(), "rss_growth_mb": rss_mb() - base_rss, "model_state_mb": state_mb,
           "cuda_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
           "packs": len(packs), "packed_tokens": sum(p.num_tokens for p in packs), "all_ranks_tokens": trained,
           "loss": stats["loss"]}
    (out / f"{info.world_size}_{info.rank}.json").write_text(json.dumps(row))
    destroy_distributed()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--chunk-size", type=int, default=128, help="LM-head rows per chunk (its logits: rows x 151k)")
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.worker:
        worker(opts, Path(opts.worker))
        return
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(opts).items() if k != "worker"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        me = str(Path(__file__).resolve())
        subprocess.run([sys.executable, me, *flags, "--worker", tmp], check=True, env=env)
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", me,
                        *flags, "--worker", tmp], check=True, env=env)
        rows = [json.loads(f.read_text()) for f in sorted(Path(tmp).glob("*.json"))]
    for r in rows:
        print(json.dumps(r))
    cols = ("step_s", "peak_rss_mb", "rss_growth_mb", "model_state_mb", "cuda_peak_mb", "all_ranks_tokens", "loss")
    print(f"\n{'setting':<12} {'rank':>4} " + " ".join(f"{c:>16}" for c in cols))
    for r in rows:
        cells = [f"{r[c]:>16.4g}" if isinstance(r[c], (int, float)) else f"{'-':>16}" for c in cols]
        print(f"{r['setting']:<12} {r['rank']:>4} " + " ".join(cells))


if __name__ == "__main__":
    main()
