"""Weight sync into a running vLLM engine without a restart, vs model size (random Qwen3 shapes, CPU, fp32).

Usage: ``python bench/bench_weight_sync.py [--sizes tiny 100m 0.6b] [--pushes 3]``

For each size a random Qwen3 (untied embeddings: vLLM 0.32 cannot reload tied ones in place) is served
by one vLLM engine started with the worker extension, and the trainer side pushes new weights
``--pushes`` times with each method of :class:`trainers.scale.weight_sync.VLLMSync`:

* ``inplace``: write ``model.safetensors`` + config + tokenizer, then the engine re-reads the folder;
* ``collective``: broadcast every tensor over a gloo group into the engine's worker (no files).

Printed per size and method: the median push time and its parts (gather = merged state dict, write =
the folder, apply = pause + reload + resume, with no rollout in flight). After the last push of each
method one greedy call is checked against transformers under the pushed weights. Sizes that cannot be
built or served here (memory) are reported as skipped, with the reason. Needs the venv from
``scripts/vllm_env.sh``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from clawgym_env.policy.base import GenerationContext, SamplingParams
from clawgym_env.policy.replicas import ReplicaPolicy
from clawgym_env.policy.tiny import tiny_qwen3_config
from clawgym_env.policy.tokenizer import load_tokenizer
from clawgym_env.policy.vllm.server import VLLMServer
from trainers.scale.weight_sync import VLLMSync, write_model_dir

SIZES = {  # hidden, layers, heads, kv heads, intermediate
    "tiny": (64, 2, 2, 1, 128),
    "100m": (320, 8, 5, 1, 960),
    "0.6b": (1024, 28, 8, 4, 3072),  # Qwen3-0.6B's hidden/layers/MLP; untied output embedding
}


class Trainee:
    """The trainer side as VLLMSync sees it: merged weights of a causal LM."""

    def __init__(self, model) -> None:
        self.causal_lm = model

    def serving_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.causal_lm.state_dict().items()}


def build(size: str, tokenizer):
    from transformers import Qwen3ForCausalLM

    hidden, layers, heads, kv, inter = SIZES[size]
    config = tiny_qwen3_config(tokenizer, hidden, layers, heads, kv, inter)
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).float().eval()


def check(serving: ReplicaPolicy, model, tokenizer) -> bool:
    """One greedy call equals transformers' argmax under the pushed weights."""
    prompt = tokenizer.encode("Hello there, agent", add_special_tokens=False)
    gen = serving.generate(prompt, SamplingParams(max_tokens=8, temperature=0), GenerationContext())
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1:-1]
    return bool(logits[:, :len(tokenizer)].argmax(-1).tolist() == gen.token_ids)


def bench_size(size: str, pushes: int, tokenizer, tmp: Path) -> list[tuple]:
    model = build(size, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    trainee = Trainee(model)
    first = write_model_dir(trainee.serving_state_dict(), model, tokenizer, tmp / size / "v0")
    rows = []
    with VLLMServer(first, max_model_len=1024, enforce_eager=True, kv_cache_gib=1, worker_extension=True,
                    log_path=tmp / f"{size}.log") as server:
        print(f"[{size}] {params / 1e6:.0f}M parameters; engine started in {server.start_seconds:.0f} s", flush=True)
        serving = ReplicaPolicy([server.policy()])
        version = 0
        for method in ("inplace", "collective"):
            broadcaster = None
            if method == "collective":
                from clawgym_env.policy.vllm.collective import WeightBroadcaster

                broadcaster = WeightBroadcaster([server.url], timeout_s=600)
            sync = VLLMSync(serving, [server], method=method, root=tmp / size, model=model, tokenizer=tokenizer,
                            broadcaster=broadcaster)
            timings = []
            for _ in range(pushes):
                with torch.no_grad():
                    model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
                version += 1
                sync.push(trainee, version)
                timings.append(sync.last)
            ok = check(serving, model, tokenizer)
            sync.close()
            med = {k: statistics.median(t[k] for t in timings) for k in timings[0]}
            rows.append((size, params, method, med, ok))
            verdict = "ok" if ok else "FAILED"
            print(f"[{size}] {method}: {med['weight_sync_s']:.2f} s per push; greedy check {verdict}", flush=True)
        serving.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--pushes", type=int, default=3)
    args = ap.parse_args()
    tokenizer = load_tokenizer()
    rows, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="cg-bench-sync-") as tmp:
        for size in args.sizes:
            try:
                rows += bench_size(size, args.pushes, tokenizer, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - a size that does not fit here is reported, not fatal
                skipped.append((size, f"{type(exc).__name__}: {str(exc)[:200]}"))
                print(f"[{size}] skipped: {skipped[-1][1]}", flush=True)
    heads = " ".join(f"{h:>8s}" for h in ("push s", "gather", "write", "apply"))
    print(f"\n{'size':6s} {'params':>8s} {'method':11s} {heads}  check")
    for size, params, method, med, ok in rows:
        parts = " ".join(f"{med[k]:8.2f}" for k in ("weight_sync_s", "weight_sync_gather_s", "weight_sync_write_s",
                                                    "weight_sync_apply_s"))
        print(f"{size:6s} {params / 1e6:7.0f}M {method:11s} {parts}  {'ok' if ok else 'FAILED'}")
    for size, why in skipped:
        print(f"{size:6s} skipped: {why}")


if __name__ == "__main__":
    main()
