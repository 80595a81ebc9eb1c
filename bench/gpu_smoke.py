"""The prepared GPU check: one GRPO update of a random-init Qwen3-1.7B and a small Qwen3-MoE over a >= 32K-token tree.

Usage: ``python bench/gpu_smoke.py [--out bench/results]`` on one 80 GB GPU (torch, transformers and peft installed;
the project's own pure-Python dependencies carried as wheels, ``scripts/gpu_wheels.sh``), or ``python
bench/gpu_smoke.py --tiny --out DIR`` on a CPU (tiny shapes, short packs: what ``tests/test_gpu_smoke.py`` runs).

For each model shape (``--models``) it runs the project's own code paths, nothing reimplemented:

1. **meta init**: :func:`trainers.policy.load_causal_lm` ``(meta=True)`` from a ``config.json`` of the shape, the
   :class:`~trainers.policy.TrainablePolicy` built around the skeleton (bf16, gradient checkpointing), then
   ``to_empty`` on the device and transformers' own random init (every parameter is NaN-poisoned first and checked
   after, so a parameter the init skipped is an error, not garbage);
2. **rollouts**: a synthetic GRPO group (episodes sharing a system prompt, pairs sharing their first call, then
   diverging: token-exact chains) through :func:`trainers.api.make_groups` and :func:`trainers.api.pack_groups`;
3. **flex vs dense** on a smaller pack: :func:`trainers.api.token_logprobs` and the gradient of
   :func:`trainers.grpo.update.grpo_loss` under ``flex_attention`` (block mask) against ``sdpa`` with the dense
   additive tree mask, on the same weights: logprobs and gradients must agree within the dtype's tolerances. Where
   flex_attention has no backward (CPU), the logprobs are still compared and the gradients compared ``eager`` vs
   ``sdpa`` (both dense), and the report says so (``flex_backward: false`` with the reason);
4. **the update**: :func:`trainers.grpo.update.grpo_update` over the big pack (flex_attention where its backward
   runs), ``--updates`` times; the first includes kernel compilation, the phases of the last are reported
   (trunk forward/backward split by hooks on the trunk and the optimiser, synchronised).

Prints ONE JSON object (:class:`SmokeReport`) and writes it under ``--out`` (``gpu_smoke_<device>.json``); exits 1
when a check failed (a comparison out of tolerance, a non-finite loss, no weight change) or a shape's run raised
(``failures``, its traceback on stderr; the next shape still runs). Peak memory is
``torch.cuda.max_memory_allocated`` per model on a GPU, the process's peak RSS on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import platform
import random
import re
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_smoke_report import (  # noqa: E402 - after the path insert
    BUDGET_S,
    SHAPES,
    SIZES,
    TOLERANCES,
    Comparison,
    DeviceInfo,
    ModelReport,
    Phases,
    Shape,
    SmokeReport,
    UpdateReport,
)

QWEN3_TOKENIZER_IDS = 151669  # len() of Qwen3's tokenizer: the ids a Qwen3 policy scores (its vocab_limit)


class SyntheticVocab:
    """The policy's tokenizer here: the token ids are synthetic and no text is encoded, so only ``len()`` (the
    policy's ``vocab_limit``) is read; no tokenizer file is needed on the GPU machine (it has no network)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


class Clock:
    """Device-synchronised timestamps; :meth:`hooked` marks trunk forwards and optimiser steps."""

    def __init__(self, device) -> None:
        self.device = device
        self.events: list[tuple[str, float]] = []

    def now(self) -> float:
        """Seconds, after the device's queued work is done."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def mark(self, name: str) -> None:
        """Record event ``name`` now."""
        self.events.append((name, self.now()))

    @contextlib.contextmanager
    def hooked(self, trunk, optimizer):
        """Mark ``trunk_start``/``trunk_end`` around every trunk forward and ``step_start``/``step_end`` around
        every optimiser step inside the block."""
        handles = [trunk.register_forward_pre_hook(lambda *_: self.mark("trunk_start")),
                   trunk.register_forward_hook(lambda *_: self.mark("trunk_end")),
                   optimizer.register_step_pre_hook(lambda *_: self.mark("step_start")),
                   optimizer.register_step_post_hook(lambda *_: self.mark("step_end"))]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def update_phases(events: list[tuple[str, float]]) -> tuple[float, float, float, float, float]:
    """(scoring, train trunk forward, train head + loss + backward, optimiser step, whole update) from the events of
    one :func:`grpo_update` with one minibatch and one epoch: the training forward is the last trunk forward before
    the one optimiser step; everything before it is scoring (one trunk forward, or one per tree segment where the
    no-grad scoring reuses prefix caches)."""
    names = [n for n, _ in events]
    tail = ["trunk_start", "trunk_end", "step_start", "step_end", "end"]
    if len(names) < 6 or names[0] != "start" or names[-5:] != tail or names.count("step_start") != 1:
        raise RuntimeError(f"unexpected update events {names}: expected start, trunk forwards, one optimiser step, end")
    t = [s for _, s in events]
    return t[-5] - t[0], t[-4] - t[-5], t[-3] - t[-4], t[-2] - t[-3], t[-1] - t[0]


def synthetic_results(seed: int, *, vocab: int, min_tokens: int, system: int, episodes: int, output: int, tool: int):
    """A GRPO group of ``episodes`` (record, calls) pairs of one task whose tree holds >= ``min_tokens`` tokens:
    a shared system prompt, episode pairs sharing their first call, every call extending the previous one
    token-exactly; rewards alternate 1, 0 so every episode has an advantage. Rollout logprobs are near a uniform
    policy's, ``-log(vocab)``, as a random-init model's are."""
    from clawgym_env.capture.records import CallRecord, EpisodeRecord

    rng = random.Random(seed)
    per_call = output + tool
    calls = max(2, math.ceil((min_tokens - system) / (episodes * per_call)) + 1)
    prompt0 = [rng.randrange(vocab) for _ in range(system)]
    uniform = -math.log(vocab)
    results = []
    for e in range(episodes):
        pair_rng = random.Random(seed * 1000 + e // 2)  # the pair's shared first call
        prompt, recs = list(prompt0), []
        for c in range(calls):
            src = pair_rng if c == 0 else rng
            out = [src.randrange(vocab) for _ in range(output)]
            recs.append(CallRecord(episode_id=f"e{e}", call_index=c, dialect="openai_chat",
                                   path="/v1/chat/completions", stream=False, request={}, prompt_token_ids=prompt,
                                   output_token_ids=out, finish_reason="stop",
                                   output_logprobs=[uniform + src.uniform(-0.05, 0.05) for _ in out]))
            prompt = prompt + out + [src.randrange(vocab) for _ in range(tool)]
        results.append((EpisodeRecord(episode_id=f"e{e}", task_id="smoke", suite="gpu-smoke", harness="synthetic",
                                      policy="random-init", status="ok", reward=float(e % 2)), recs))
    return results, calls


def build_pack(mode: str, target: int, vocab: int, device, seed: int):
    """(TrainPack, calls per episode, seconds building the group, seconds packing it) of one synthetic group of
    >= ``target`` tokens, on ``device``."""
    from trainers.api import make_groups, pack_groups

    z = SIZES[mode]
    t0 = time.perf_counter()
    results, calls = synthetic_results(seed, vocab=vocab, min_tokens=target, system=min(z.system_tokens, target // 4),
                                       episodes=z.episodes, output=z.output_tokens, tool=z.tool_tokens)
    groups = make_groups(results)
    t1 = time.perf_counter()
    packs = pack_groups(groups, device=device)
    if len(packs) != 1 or packs[0].num_tokens < target:
        raise RuntimeError(f"expected one pack of >= {target} tokens, got {[p.num_tokens for p in packs]}")
    return packs[0], calls, t1 - t0, time.perf_counter() - t1


def materialize(policy, device, seed: int) -> None:
    """Storage on ``device`` for the meta skeleton, transformers' random init under ``seed``, the rotary tables
    rebuilt; every parameter is NaN-poisoned first, so one the init skipped is an error."""
    import torch

    lm = policy.causal_lm
    policy.module.to_empty(device=device)
    with torch.no_grad():
        for p in policy.module.parameters():
            p.fill_(float("nan"))
            if hasattr(p, "_is_hf_initialized"):  # transformers skips what it marked as initialised
                del p._is_hf_initialized
    for module in lm.modules():
        module._is_hf_initialized = False
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        lm.init_weights()
    rotary = lm.model.rotary_emb
    with torch.device(device):
        lm.model.rotary_emb = type(rotary)(config=lm.config)
    bad = [n for n, p in policy.module.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise RuntimeError(f"random init left {len(bad)} parameters unset (NaN), e.g. {bad[:3]}")


def _grads(params) -> list:
    import torch

    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]


def compare(policy, pack, args, *, reference: tuple[str, str] = ("sdpa", "additive")) -> Comparison:
    """flex_attention (block mask) vs ``reference`` (implementation, mask form) on ``pack``: logprobs of its
    trainable tokens, and the gradient of a GRPO loss (ratio 1, the pack's advantages) w.r.t. every trainable
    parameter. The policy's attention implementation is restored afterwards."""
    import torch

    from trainers.api import token_logprobs
    from trainers.grpo.update import grpo_loss

    model, params = policy.causal_lm, policy.trainable_parameters()
    restore = model.config._attn_implementation
    m = pack.trainable
    tol_lp, tol_rel, min_cos = TOLERANCES["float32" if params[0].dtype == torch.float32 else "bfloat16"]

    def run(impl: str, form: str, backward: bool):
        model.set_attn_implementation(impl)
        policy.module.zero_grad(set_to_none=True)
        with contextlib.nullcontext() if backward else torch.no_grad():
            logp = token_logprobs(model, pack.packed, args.chunk_size, mask=m, temperature=args.temperature,
                                  vocab_limit=policy.vocab_limit, mask_form=form)
            if backward:
                loss, _ = grpo_loss(logp, logp.detach(), torch.ones_like(logp), pack, clip_low=args.clip_eps,
                                    clip_high=args.clip_eps_high or args.clip_eps)
                loss.backward()
        return logp.detach().float(), _grads(params) if backward else None

    try:
        ref_lp, ref_g = run(*reference, True)
        note = None
        try:
            flex_lp, flex_g = run("flex_attention", "block", True)
            grad_candidate = "flex_attention (block mask)"
        except NotImplementedError as exc:  # flex_attention has no backward on this device
            note = f"{pack.packed.input_ids.device.type}, torch {torch.__version__}: {exc}"
            flex_lp, _ = run("flex_attention", "block", False)
            _, flex_g = run("eager", "additive", True)
            grad_candidate = "eager (dense additive tree mask)"
    finally:
        model.set_attn_implementation(restore)
        policy.module.zero_grad(set_to_none=True)
    diff = (flex_lp - ref_lp)[m].abs()
    dot = n_ref = n_cand = n_diff = 0.0
    for a, b in zip(flex_g, ref_g):
        a, b = a.double(), b.double()
        dot += float((a * b).sum())
        n_ref += float((b * b).sum())
        n_cand += float((a * a).sum())
        n_diff += float(((a - b) ** 2).sum())
    rel = math.sqrt(n_diff / n_ref) if n_ref > 0 else math.inf
    cos = dot / math.sqrt(n_ref * n_cand) if n_ref > 0 and n_cand > 0 else 0.0
    lp_max, lp_mean = float(diff.max()), float(diff.mean())
    ok = lp_max <= tol_lp and rel <= tol_rel and cos >= min_cos and n_ref > 0
    return Comparison(tokens=pack.num_tokens, trainable_tokens=int(m.sum()), candidate="flex_attention (block mask)",
                      reference=f"{reference[0]} (dense {reference[1]} tree mask)", logprob_max_abs_diff=lp_max,
                      logprob_mean_abs_diff=lp_mean, flex_backward=note is None, flex_backward_note=note,
                      grad_candidate=grad_candidate, grad_rel_err=rel, grad_cosine=cos, tol_logprob_abs=tol_lp,
                      tol_grad_rel_err=tol_rel, min_grad_cosine=min_cos, ok=ok)


def peak_gib(device) -> float:
    """Peak memory so far: allocated on the GPU since the last reset, else the process's peak RSS."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def skeleton_policy(shape: Shape, *, device, dtype: str, workdir: Path):
    """The :class:`~trainers.policy.TrainablePolicy` of ``shape`` around its meta skeleton (``config.json`` written
    under ``workdir``; sdpa, gradient checkpointing): nothing allocated yet (:func:`materialize` does)."""
    from trainers.api import PolicyConfig, TrainablePolicy
    from trainers.policy import is_meta, load_causal_lm

    folder = workdir / shape.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shape.config_json(), indent=1))
    cfg = PolicyConfig(model=str(folder), dtype=dtype, device=str(device), attn_implementation="sdpa",
                       gradient_checkpointing=True, seed=0)
    tok = SyntheticVocab(min(QWEN3_TOKENIZER_IDS, shape.vocab))
    policy = TrainablePolicy(cfg, tokenizer=tok, model=load_causal_lm(cfg, tok, meta=True))
    if not is_meta(policy.module):
        raise RuntimeError("the skeleton is not on the meta device")
    return policy


def grpo_args():
    """GRPO's own defaults (:class:`trainers.grpo.train.Args`) for one update: one epoch, one minibatch, no KL."""
    import dataclasses

    from trainers.grpo.train import Args

    return dataclasses.replace(Args(), update_epochs=1, minibatches=1, kl_coef=0.0)


def run_model(mode: str, shape: Shape, *, device, dtype: str, updates: int, workdir: Path) -> ModelReport:
    """Steps 1-4 of the module docstring for one shape."""
    import torch

    from trainers.batch.logprobs import forward_form
    from trainers.grpo.update import grpo_update

    clock = Clock(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = clock.now()
    policy = skeleton_policy(shape, device=device, dtype=dtype, workdir=workdir)
    t1 = clock.now()
    materialize(policy, device, seed=0)
    t2 = clock.now()
    target, compare_target = SIZES[mode].pack_tokens, SIZES[mode].compare_tokens
    pack, calls, groups_s, pack_s = build_pack(mode, target, policy.vocab_limit, device, seed=1)
    small = build_pack(mode, compare_target, policy.vocab_limit, device, seed=2)[0]
    t3 = clock.now()
    pack.packed.block_mask()
    t4 = clock.now()
    args = grpo_args()
    comparison = compare(policy, small, args)
    t5 = clock.now()
    impl = "flex_attention" if comparison.flex_backward else "sdpa"
    policy.causal_lm.set_attn_implementation(impl)
    with torch.enable_grad():
        form = forward_form(policy.causal_lm, pack.packed)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    probe = next(p for n, p in policy.module.named_parameters() if "layers.0.self_attn.q_proj" in n)
    before = probe.detach().clone()
    first_s, row, split = 0.0, {}, (0.0, 0.0, 0.0, 0.0, 0.0)
    for k in range(updates):
        clock.events = []
        with clock.hooked(policy.causal_lm.model, optimizer):
            clock.mark("start")
            row = grpo_update(policy, optimizer, [pack], args)
            clock.mark("end")
        split = update_phases(clock.events)
        first_s = split[4] if k == 0 else first_s
    changed = not torch.equal(before, probe.detach())
    loss, grad_norm = float(row["loss"] or 0.0), float(row["grad_norm"] or 0.0)
    update = UpdateReport(attn_implementation=impl, mask_form=form, packed_tokens=pack.num_tokens,
                          trainable_tokens=int(pack.trainable.sum()), pairs=int(pack.pair_weight.numel()),
                          episodes=len(pack.episodes), calls=calls * len(pack.episodes), updates=updates, loss=loss,
                          grad_norm=grad_norm, weights_changed=changed,
                          tokens_per_s=pack.num_tokens / max(split[1] + split[2], 1e-9),
                          update_tokens_per_s=float(row["train_tokens_per_s"] or 0.0))
    phases = Phases(meta_init_s=t1 - t0, materialize_s=t2 - t1, build_groups_s=groups_s, pack_s=pack_s,
                    block_mask_s=t4 - t3, compare_s=t5 - t4, first_update_s=first_s, score_forward_s=split[0],
                    train_forward_s=split[1], train_backward_s=split[2], optimizer_step_s=split[3], update_s=split[4])
    ok = (comparison.ok and math.isfinite(loss) and math.isfinite(grad_norm) and grad_norm > 0 and changed
          and update.packed_tokens >= target)
    report = ModelReport(shape=shape, architecture=type(policy.causal_lm).__name__,
                         parameters=sum(p.numel() for p in policy.module.parameters()), init="meta", phases=phases,
                         flex_vs_dense=comparison, update=update, peak_memory_gib=peak_gib(device), ok=ok)
    del policy, optimizer, pack, small
    free_device(device)
    return report


def free_device(device) -> None:
    """Drop collected tensors and hand cached GPU memory back (between shapes)."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def device_info(device) -> DeviceInfo:
    """The device and the library versions."""
    import torch
    import transformers

    try:
        import peft

        peft_version: str | None = peft.__version__
    except ImportError:
        peft_version = None
    name, mem = platform.processor() or platform.machine(), None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, mem = props.name, props.total_memory / 2**30
    return DeviceInfo(type=device.type, name=name, memory_gib=mem, torch=torch.__version__,
                      transformers=transformers.__version__, peft=peft_version, python=platform.python_version())


def main(argv: list[str] | None = None) -> int:
    """Run the smoke, print and write its report; 0 when every check holds."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and short packs (a CPU check of this script)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder the JSON report is written to")
    ap.add_argument("--models", default="dense,moe", help="comma-separated: dense (Qwen3-1.7B), moe (small Qwen3-MoE)")
    ap.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:1, ...")
    ap.add_argument("--dtype", help="parameter dtype (default: bfloat16, float32 with --tiny)")
    ap.add_argument("--updates", type=int, default=2, help="GRPO updates per model (the first compiles kernels)")
    a = ap.parse_args(argv)

    from trainers.policy import resolve_device

    mode = "tiny" if a.tiny else "full"
    names = [n.strip() for n in a.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SHAPES[mode]))
    if unknown or not names or a.updates < 1:
        ap.error(f"--models takes {sorted(SHAPES[mode])} (got {unknown or names}); --updates must be >= 1")
    device = resolve_device(a.device)
    dtype = a.dtype or ("float32" if a.tiny else "bfloat16")
    start = time.perf_counter()
    models: list[ModelReport] = []
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        for n in names:
            shape = SHAPES[mode][n]
            try:
                models.append(run_model(mode, shape, device=device, dtype=dtype, updates=a.updates,
                                        workdir=Path(tmp)))
            except Exception as exc:  # noqa: BLE001 - reported (traceback on stderr); the next shape still runs
                traceback.print_exc()
                failures[shape.name] = f"{type(exc).__name__}: {exc}"[:2000]
                free_device(device)
    wall = time.perf_counter() - start
    info = device_info(device)
    report = SmokeReport(mode=mode, sizes=SIZES[mode], device=info, dtype=dtype, gradient_checkpointing=True,
                         peak_memory_kind="cuda max_memory_allocated per model" if device.type == "cuda"
                         else "process peak RSS (cumulative)", models=models, failures=failures, wall_s=wall,
                         budget_s=BUDGET_S[mode], within_budget=wall <= BUDGET_S[mode],
                         ok=not failures and all(m.ok for m in models))
    text = report.model_dump_json()
    print(text)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", info.name.lower()).strip("-") or device.type
    (out / f"gpu_smoke_{'tiny_' if a.tiny else ''}{slug}.json").write_text(report.model_dump_json(indent=1) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
