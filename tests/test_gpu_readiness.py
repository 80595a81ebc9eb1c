"""Issue "ready for the first GPU run", points 3 and 5, on 2 gloo ranks: a sharded start never makes the model
whole on a rank's device, and a full fine-tune's KL reference is sharded too (:mod:`trainers.scale.meta_init`).

One launch (``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/test_gpu_readiness.py OUT``)
builds, per case, the policy through :func:`trainers.ranks.setup_policy` (meta skeleton → shard → rank 0
broadcasts), records on each rank which models the policy constructor saw (meta or materialised), the parameter
elements each rank stores, and (GRPO with a KL penalty) one update; rank 0 writes the full parameters and deltas.
The tests compare them with one process building the same policy the plain way, within 1e-5.

The other points are tested in one file per concept (``test_gpu_readiness_<concept>.py``); :data:`POINTS` names
the test that holds each point, and :func:`test_every_point_has_a_cpu_test_that_never_skips` keeps the map true.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-5


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    lora: int = 0
    kl: bool = True


CASES = {"dense": Case("tiny"), "lora": Case("tiny", lora=4), "moe": Case("tiny-moe")}


def _config(case: Case) -> Any:
    from trainers.policy import PolicyConfig

    return PolicyConfig(model=case.model, seed=3, lora_rank=case.lora, device="cpu")


def _update(policy: Any, tok: Any) -> dict[str, float]:
    """One GRPO update with a KL penalty (2 groups in 2 minibatches, SGD: the second minibatch's policy has moved
    from the reference, so the reference's scores enter the loss): its statistics."""
    import random

    import numpy as np
    from test_fsdp import grpo_episodes

    from trainers.batch.tree_batch import make_groups, pack_groups
    from trainers.grpo.train import Args, grpo_update

    random.seed(0)  # the minibatch order is drawn: the same draw on the ranks and in the one process
    np.random.seed(0)
    torch.manual_seed(0)
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.5)
    args = Args(minibatches=2, kl_coef=0.05, max_grad_norm=0.5, chunk_size=64)
    stats = grpo_update(policy, opt, pack_groups(make_groups(grpo_episodes(tok, 2))), args)
    return {k: float(v) for k, v in stats.items() if isinstance(v, (int, float)) and not k.endswith("_s")
            and "per_s" not in k}


def _full(module: Any) -> dict[str, Any]:
    from trainers.scale.fsdp import full_tensor

    return {n: full_tensor(p.detach()).clone() for n, p in module.named_parameters()}


def worker(out_dir: str) -> None:
    """Every case on this rank; each rank writes what it saw, rank 0 also the full parameters."""
    import trainers.scale.meta_init as meta_init
    from clawgym_env.policy.tokenizer import load_tokenizer
    from trainers.policy import TrainablePolicy, is_meta
    from trainers.ranks import setup_policy
    from trainers.scale.fsdp import DistConfig, destroy_distributed, init_distributed

    info = init_distributed("gloo", timeout_s=300)
    seen: list[bool] = []

    class Recording(TrainablePolicy):
        def __init__(self, config: Any, tokenizer: Any = None, model: Any = None) -> None:
            seen.append(model is not None and is_meta(model))
            super().__init__(config, tokenizer, model)

    meta_init.TrainablePolicy = Recording  # type: ignore[misc]
    try:
        tok = load_tokenizer()
        for name, case in CASES.items():
            seen.clear()
            setup = setup_policy(_config(case), DistConfig(), reference=case.kl, serve_in_process=True)
            policy = setup.policy
            from trainers.scale.meta_init import local_parameter_numel

            report: dict[str, Any] = {
                "meta": list(seen), "local": local_parameter_numel(policy.module),
                "ref_local": local_parameter_numel(policy._reference) if policy._reference is not None else None,
                "serving": setup.sync.__class__.__name__}
            start = _full(policy.module)
            report["stats"] = _update(policy, tok) if case.kl else {}
            (Path(out_dir) / f"{name}-rank{info.rank}.json").write_text(json.dumps(report))
            after = _full(policy.module)
            if info.is_main:
                torch.save({"start": start, "delta": {k: after[k] - start[k] for k in after}},
                           Path(out_dir) / f"{name}.pt")
    finally:
        destroy_distributed()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("meta-init")
    from test_fsdp import torchrun

    res = torchrun([str(Path(__file__).resolve()), str(out)], cwd=ROOT, timeout=540,
                   env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])})
    assert res.returncode == 0, res.stdout[-6000:]
    return {name: {"ranks": [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in (0, 1)],
                   "tensors": torch.load(out / f"{name}.pt", weights_only=False)} for name in CASES}


def _plain(case: Case, tok: Any) -> Any:
    from trainers.policy import TrainablePolicy

    policy = TrainablePolicy(_config(case), tokenizer=tok)
    if case.kl:
        policy.freeze_reference()
    return policy


def _numel(module: Any) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_point3_no_rank_holds_the_whole_model_at_init(name, two_ranks, tokenizer):
    """Point 3: rank 1 only ever builds a meta skeleton; rank 0 materialises one host copy (plus its skeleton);
    each rank stores ~1/2 of the parameter elements; the shards are exactly the plain model's weights."""
    case, got = CASES[name], two_ranks[name]
    rank0, rank1 = got["ranks"]
    assert rank1["meta"] == [True], "rank 1 built a materialised model"
    assert rank0["meta"] == [False, True], "rank 0: one host copy, then the skeleton it trains"
    plain = _plain(case, tokenizer)
    total = _numel(plain.module)
    for r in (rank0, rank1):
        assert abs(r["local"] - total / 2) <= 0.01 * total, (r["local"], total)
    assert rank0["serving"] == "InProcessSync" and rank1["serving"] == "GatherOnlySync"
    expected = _full(plain.module)
    assert set(got["tensors"]["start"]) == set(expected)
    for k, v in expected.items():
        assert torch.equal(got["tensors"]["start"][k], v), k


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.kl])
def test_point5_the_kl_reference_is_sharded_and_scores_like_the_plain_one(name, two_ranks, tokenizer):
    """Point 5: a full fine-tune's reference holds ~1/2 of the model per rank (LoRA's is the base: none); a GRPO
    update with a KL penalty over it equals the one-process update with an unsharded reference."""
    from trainers.grpo.train import Args  # noqa: F401 - the same module the worker used

    case, got = CASES[name], two_ranks[name]
    plain = _plain(case, tokenizer)
    total = _numel(plain.causal_lm)
    for r in got["ranks"]:
        if case.lora:
            assert r["ref_local"] is None
        else:
            assert abs(r["ref_local"] - total / 2) <= 0.01 * total, (r["ref_local"], total)
    start = _full(plain.module)
    stats = _update(plain, tokenizer)
    assert stats and got["ranks"][0]["stats"].keys() == stats.keys()
    assert stats["kl_ref"] > 0, "the reference equals the policy throughout: the comparison would be vacuous"
    for k, v in stats.items():
        assert got["ranks"][0]["stats"][k] == pytest.approx(v, rel=TOL, abs=TOL), k
    after = _full(plain.module)
    moved = 0
    for k in after:
        delta = after[k] - start[k]
        moved += int(float(delta.abs().max()) > 0)
        assert float((got["tensors"]["delta"][k] - delta).abs().max()) <= TOL, k
    assert moved, "the update changed nothing: the comparison would be vacuous"


POINTS = {
    1: "test_gpu_readiness_weights.py::test_moe_v0_folder_and_every_sync_carry_the_checkpoint_layout",
    2: "test_gpu_readiness_context.py::test_train_refuses_a_context_above_the_positions_and_its_fix_works",
    3: "test_gpu_readiness.py::test_point3_no_rank_holds_the_whole_model_at_init",
    4: "test_gpu_readiness_weights.py::test_fp32_masters_are_served_in_bf16_by_default_and_the_engines_run_bf16",
    5: "test_gpu_readiness.py::test_point5_the_kl_reference_is_sharded_and_scores_like_the_plain_one",
    6: "test_gpu_readiness_math.py::test_point6_token_norm_gives_each_minibatch_weight_one",
    7: "test_gpu_readiness_math.py::test_point7_shared_tokens_keep_each_episodes_behaviour_logprob",
    8: "test_gpu_readiness_sync.py::test_an_episode_whose_only_overrun_is_a_weight_sync_ends_ok",
    9: "test_gpu_readiness_ppo.py::test_lora_critic_trains_only_its_adapters_and_head_over_the_policys_own_frozen_base",
    10: "test_gpu_readiness_math.py::test_point10_refill_never_redraws_a_task_of_the_same_step",
    11: "test_gpu_readiness_math.py::test_point11_synced_sampling_check_is_unchecked_without_a_comparable_step",
}
"""Point of the issue → the CPU test that holds it."""


def test_every_point_has_a_cpu_test_that_never_skips():
    """Each of points 1-11 names a test that exists, is collected (a ``test_`` function) and carries no skip or
    xfail mark; the files also hold more tests per point than the one named."""
    import ast

    assert sorted(POINTS) == list(range(1, 12))
    for point, ref in POINTS.items():
        file, name = ref.split("::")
        tree = ast.parse((ROOT / "tests" / file).read_text())
        found = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == name]
        assert found, f"point {point}: {ref} does not exist"
        marks = [ast.unparse(d) for d in found[0].decorator_list]
        assert not [m for m in marks if "skip" in m or "xfail" in m], (point, marks)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    worker(sys.argv[1])
