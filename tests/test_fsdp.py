"""FSDP2 data parallelism (:mod:`trainers.scale.fsdp`) on 2 gloo processes against one process, same batch.

One launch (``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_fsdp.py OUT``) runs
every case on 2 ranks; rank 0 writes each case's statistics and full tensors (gradients and parameter deltas
after the update, gathered from the shards). Each test recomputes its case here, in one process without a
process group, and compares within 1e-5 (fp32, a tiny random Qwen3 on the real tokenizer, SGD). The cases
cover GRPO (full fine-tuning with a KL reference and 2 minibatches, LoRA with gradient checkpointing, 3 packs
over 2 ranks, a step of 1 pack so one rank has none), PPO (a separate critic, a shared-trunk one, and a LoRA critic:
the policy's own base in one process, a sharded frozen copy on the ranks) and SFT.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from clawgym_env.capture.records import CallRecord, EpisodeRecord  # noqa: E402
from clawgym_env.capture.tree import CallTree  # noqa: E402
from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids  # noqa: E402
from trainers.policy import PolicyConfig, TrainablePolicy  # noqa: E402
from trainers.scale.fsdp import (  # noqa: E402
    DistConfig,
    balance,
    destroy_distributed,
    dist_info,
    full_tensor,
    init_distributed,
    shard_model,
    shard_policy,
    slots,
)

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-5


# ---- synthetic episodes (token-exact multi-call chains sharing their task prefix) ----------------------------
def fake_logprob(seq: list[int]) -> float:
    """A rollout logprob near a tiny random model's (~ -12), a function of the prefix only."""
    h = int(hashlib.sha1(str(seq).encode()).hexdigest()[:8], 16)
    return -11.4 - (h % 1000) / 1000.0


def episode(tok, eid: str, task: str, outputs: list[str], reward: float, harness: str = "mini"):
    prompt = render_prompt_ids(tok, [{"role": "system", "content": "You are a careful agent."},
                                     {"role": "user", "content": task}])
    calls = []
    for i, text in enumerate(outputs):
        out = list(tok.encode(text, add_special_tokens=False))
        calls.append(CallRecord(episode_id=eid, call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                                stream=False, request={}, prompt_token_ids=list(prompt), output_token_ids=out,
                                output_logprobs=[fake_logprob(prompt + out[:j + 1]) for j in range(len(out))],
                                finish_reason="stop"))
        prompt = prompt + out + list(tok.encode(f"<|im_start|>user\nresult {i}<|im_end|>\n<|im_start|>assistant\n",
                                                add_special_tokens=False))
    rec = EpisodeRecord(episode_id=eid, task_id=task.split()[0], suite="unit", harness=harness, policy="tiny",
                        status="ok", reward=reward, num_calls=len(outputs))
    return rec, calls


def tool(path: str) -> str:
    return assistant_text("", tool_calls=[("read_file", {"path": path})])


def grpo_episodes(tok, groups: int):
    tasks = [("alpha Count the lines of a.txt", [[tool("a.txt"), assistant_text("It has 3 lines.")],
                                                 [tool("a.txt"), assistant_text("It has 4 lines.")],
                                                 [assistant_text("I could not tell.")]]),
             ("beta Report the size of b.txt", [[tool("b.txt"), tool("c.txt"), assistant_text("12 bytes.")],
                                                [assistant_text("No idea.")]]),
             ("gamma Say hello to the user politely", [[assistant_text("hello")], [assistant_text("Hi there!")],
                                                       [tool("x.txt"), assistant_text("hello!")]])]
    out = []
    for t, (task, runs) in enumerate(tasks[:groups]):
        for e, outputs in enumerate(runs):
            out.append(episode(tok, f"{t}-{e}", task, outputs, float((e + t) % 2), harness="mini"))
    return out


def ppo_trees(tok) -> list[CallTree]:
    eps = grpo_episodes(tok, 3)
    return [CallTree.from_episodes([ep]) for ep in eps[:4]]


# ---- the cases: the same code in one process and on every rank -----------------------------------------------
@dataclasses.dataclass
class Case:
    name: str
    algo: str
    lora: int = 0
    checkpointing: bool = False
    groups: int = 3
    minibatches: int = 1
    kl_coef: float = 0.0
    critic: str = "separate"
    mixed_precision: str | None = None
    model: str = "tiny"


CASES = {c.name: c for c in [
    Case("grpo", "grpo", groups=3, minibatches=2, kl_coef=0.05),
    Case("grpo_lora", "grpo", lora=4, checkpointing=True, groups=2),
    Case("grpo_one_pack", "grpo", groups=1),
    Case("ppo_separate", "ppo", minibatches=2, kl_coef=0.05),
    Case("ppo_shared", "ppo", critic="shared", minibatches=1),
    Case("ppo_lora_critic", "ppo", lora=4, checkpointing=True, critic="lora", minibatches=2),  # ranks: a sharded copy
    Case("sft", "sft"),
    Case("grpo_bf16", "grpo", groups=2, mixed_precision="bfloat16"),
    Case("grpo_moe_lora", "grpo", model="tiny-moe", lora=4, groups=2),
]}
PER_RANK_COUNTS = {"sft": {"train_tokens", "trainable_tokens"}}
"""Statistics that count per rank by design: SFT's ranks pack their episodes separately, so a prefix shared by
episodes on two ranks is packed (and counted) on both."""


def _snapshot(modules: dict[str, Any]) -> dict[str, Any]:
    """Full parameters (gathered from the shards on every rank: a collective)."""
    return {f"{k}:{n}": full_tensor(p.detach()).clone() for k, m in modules.items() for n, p in m.named_parameters()}


def _grads(modules: dict[str, Any]) -> dict[str, Any]:
    return {f"{k}:{n}": full_tensor(p.grad).clone() for k, m in modules.items() for n, p in m.named_parameters()
            if p.grad is not None}


def run_case(case: Case, tok) -> dict:
    """One update of ``case`` (sharded over the ranks when a process group exists); returns its statistics, full
    gradients and full parameter deltas."""
    random.seed(0)
    torch.manual_seed(0)
    import numpy as np

    np.random.seed(0)
    cfg = PolicyConfig(model=case.model, seed=3, lora_rank=case.lora, gradient_checkpointing=case.checkpointing)
    policy = TrainablePolicy(cfg, tokenizer=tok)
    if case.kl_coef > 0:
        policy.freeze_reference()
    modules: dict[str, Any] = {"policy": policy.module}
    stats: dict[str, Any]
    if case.algo == "ppo":
        from trainers.batch.tree_batch import rollout_packs
        from trainers.ppo.train import Args as PPOArgs
        from trainers.ppo.train import add_reference, prepare, update
        from trainers.ppo.value import Critic

        critic = Critic.for_policy(policy, case.critic, seed=1)
        shard_policy(policy, DistConfig())
        shard_model(critic)
        modules["critic"] = critic
        params = policy.trainable_parameters() + [p for p in critic.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=0.5)
        before = _snapshot(modules)
        ppo_args = PPOArgs(minibatches=case.minibatches, kl_coef=case.kl_coef, ent_coef=0.01, vf_clip=0.2,
                           normalize_advantages=True, max_grad_norm=0.5, chunk_size=64)
        packs = rollout_packs(ppo_trees(tok), None)
        model = policy.causal_lm
        targets = prepare(model, critic, packs, ppo_args, policy.vocab_limit, policy_root=policy.module)
        if case.kl_coef > 0:
            with policy.reference() as ref:
                add_reference(targets, ref, ppo_args, policy.vocab_limit)
        stats = update(model, critic, targets, ppo_args, opt, vocab_limit=policy.vocab_limit, rng=random.Random(7),
                       policy_root=policy.module)
        grads: dict[str, Any] = {}
    else:
        shard_policy(policy, DistConfig(mixed_precision=case.mixed_precision))
        opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)
        before = _snapshot(modules)
        if case.algo == "grpo":
            from trainers.batch.tree_batch import make_groups, pack_groups
            from trainers.grpo.train import Args, grpo_update

            args = Args(minibatches=case.minibatches, kl_coef=case.kl_coef, max_grad_norm=0.5, chunk_size=64)
            packs = pack_groups(make_groups(grpo_episodes(tok, case.groups)))
            assert len(packs) == case.groups
            stats = dict(grpo_update(policy, opt, packs, args))
        else:
            from trainers.sft.train import Args as SFTArgs
            from trainers.sft.train import sft_step

            stats = dict(sft_step(policy, opt, grpo_episodes(tok, 3)[:5], SFTArgs(max_grad_norm=0.5, chunk_size=64)))
        grads = _grads(modules)
    after = _snapshot(modules)
    numbers = {k: float(v) for k, v in stats.items() if isinstance(v, (int, float)) and not k.endswith("_s")
               and "per_s" not in k}
    return {"stats": numbers, "grads": grads, "delta": {k: after[k] - before[k] for k in after}}


def worker(out_dir: str) -> None:
    """Every case on this rank; rank 0 saves the results."""
    from clawgym_env.policy.tokenizer import load_tokenizer

    info = init_distributed("gloo", timeout_s=300)
    try:
        tok = load_tokenizer()
        for name, case in CASES.items():
            res = run_case(case, tok)
            if info.is_main:
                torch.save(res, Path(out_dir) / f"{name}.pt")
    finally:
        destroy_distributed()


# ---- the tests ---------------------------------------------------------------------------------------------------
def torchrun(args: list[str], *, cwd: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone --nproc-per-node 2 ARGS`` in its own process group, killed
    whole on timeout (a hung collective must not hang the test)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun timed out after {timeout} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


@pytest.fixture(scope="module")
def distributed_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    res = torchrun([str(Path(__file__).resolve()), str(out)], cwd=ROOT, timeout=540)
    assert res.returncode == 0, res.stdout[-6000:]
    return {name: torch.load(out / f"{name}.pt", weights_only=False) for name in CASES}


def _close(a: Any, b: Any) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.mixed_precision is None])
def test_two_ranks_equal_one_process(name, distributed_results, tokenizer):
    assert dist_info().world_size == 1
    dist = distributed_results[name]
    ref = run_case(CASES[name], tokenizer)
    assert set(dist["stats"]) == set(ref["stats"]) and ref["stats"], name
    for k, v in ref["stats"].items():
        if k in PER_RANK_COUNTS.get(name, set()):
            assert dist["stats"][k] >= v
            continue
        assert dist["stats"][k] == pytest.approx(v, rel=TOL, abs=TOL), (name, k)
    assert set(dist["grads"]) == set(ref["grads"])
    assert set(dist["delta"]) == set(ref["delta"]) and ref["delta"]
    for kind in ("grads", "delta"):
        for k, v in ref[kind].items():
            assert _close(dist[kind][k], v) <= TOL, (name, kind, k, _close(dist[kind][k], v))
    moved = [k for k, v in ref["delta"].items() if float(v.abs().max()) > 0]
    assert moved, "the update changed nothing: the comparison would be vacuous"
    if CASES[name].lora:
        assert all("lora_" in k or k.startswith("critic:head.") for k in moved)  # adapters (and a value head)


@pytest.mark.slow
def test_bf16_mixed_precision_tracks_the_fp32_step(distributed_results, tokenizer):
    """``dist.mixed_precision: bfloat16`` (bf16 compute, fp32 shards and gradient reduction) on 2 ranks: the
    loss and the gradient direction of the fp32 single-process step, to bf16 precision."""
    dist = distributed_results["grpo_bf16"]
    ref = run_case(dataclasses.replace(CASES["grpo_bf16"], mixed_precision=None), tokenizer)
    assert dist["stats"]["loss"] == pytest.approx(ref["stats"]["loss"], rel=0.05, abs=1e-3)
    keys = sorted(ref["grads"])
    a = torch.cat([dist["grads"][k].flatten().double() for k in keys])
    b = torch.cat([ref["grads"][k].flatten().double() for k in keys])
    assert bool(torch.isfinite(a).all()) and float(a.norm()) > 0
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.98


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/install.sh)")
def test_torchrun_grpo_end_to_end_rank0_alone_logs(tmp_path):
    """``torchrun --nproc-per-node 2 -m trainers.train``: rank 0 rolls out through the mini harness and logs,
    both ranks train and checkpoint; the metrics, the summary and the printed summary exist once."""
    import json

    from test_train_cli import make_suite, write_config

    from trainers.rollouts.synced_check import check_synced_sampling

    out = tmp_path / "run"
    # three steps: the first may make no update (constant rewards), and only a step after an update can show that
    # the engine sampled the synced weights
    cfg = write_config(tmp_path / "grpo.yaml", out, make_suite(tmp_path), steps=3)
    res = torchrun(["-m", "trainers.train", "--config", str(cfg)], cwd=tmp_path, timeout=540)
    assert res.returncode == 0, res.stdout[-6000:]
    assert res.stdout.count("== grpo finished") == 1, res.stdout[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["episodes"] + r["infra_failures"] == 3 and r["groups"] == 1 for r in rows)
    assert rows[-1]["version"] == sum(r["groups_trained"] for r in rows)
    synced = check_synced_sampling(rows, tol=1e-6)  # a step that trained on rollouts sampled after a sync
    synced.require(allow_unchecked=True)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["version"] == rows[-1]["version"] and summary["checkpoint"].endswith("step_000003")
    assert json.loads((out / "config.json").read_text())["algo"] == "grpo"
    if synced.status == "unchecked":  # no update before step 3, or none in it: say so rather than pass vacuously
        pytest.skip(synced.describe())


def test_balance_is_greedy_largest_first_and_slots_pad_the_short_rank():
    assert balance([5, 1, 3], 2) == [[0], [1, 2]]
    assert balance([7], 2) == [[0], []]
    assert balance([], 2) == [[], []]
    assert balance([2, 2, 2, 2], 3) == [[0, 3], [1], [2]]
    share = balance([10, 4, 3], 2)
    assert slots(share[0], share, filler=2) == [(0, True), (2, False)]
    assert slots(share[1], share, filler=2) == [(1, True), (2, True)]
    assert slots([], [[0, 1], []], filler=1) == [(1, False), (1, False)]


if __name__ == "__main__":
    worker(sys.argv[1])
