"""Sharded checkpoints (torch.distributed.checkpoint): a checkpoint saved on 2 FSDP2 ranks (gloo, CPU)
resumes in 1 process without a process group and vice versa, with the same full weights and optimiser
state; under LoRA only the adapters are stored; a save that dies midway leaves ``latest`` alone.

Run as a script (``python tests/test_checkpoint_dcp.py save|load OUT LORA`` under ``torch.distributed.run``)
this file is the worker of the 2-rank cases.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainers.policy import PolicyConfig, TrainablePolicy  # noqa: E402
from trainers.scale import checkpoint as ckpt  # noqa: E402
from trainers.scale.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint  # noqa: E402

TIMEOUT_S = 240


def _policy(lora: int) -> TrainablePolicy:
    return TrainablePolicy(PolicyConfig(model="tiny", device="cpu", seed=0, lora_rank=lora))


def _shard(policy: TrainablePolicy) -> None:
    """FSDP2 the way a trainer does: each decoder block, then the trained module (peft's under LoRA) as the root."""
    from torch.distributed.fsdp import fully_shard

    for block in policy.causal_lm.model.layers:
        fully_shard(block)
    fully_shard(policy.module)


def _train_step(policy: TrainablePolicy, opt: torch.optim.Optimizer) -> None:
    ids = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])
    logits = policy.module(input_ids=ids).logits  # through the FSDP root
    loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
    loss.backward()
    opt.step()
    opt.zero_grad()


def _full_state(policy: TrainablePolicy, opt: torch.optim.Optimizer) -> dict:
    """Full weights and full optimiser state (by parameter name): what must survive a resume."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    bundle = torch.nn.ModuleDict(policy.checkpoint_modules())
    optim = get_optimizer_state_dict(bundle, opt, options=StateDictOptions(full_state_dict=True))
    return {"model": {k: v.detach().clone() for k, v in policy.state_dict().items()},
            "optim": {name: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                      for name, s in optim["state"].items()}}


def _assert_same(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["optim"].keys() == b["optim"].keys() and a["optim"]
    for name in a["optim"]:
        for k, v in a["optim"][name].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(b["optim"][name][k])), (name, k)


def _worker(mode: str, out: str, lora: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        policy = _policy(lora)
        _shard(policy)
        assert policy.sharded
        opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
        if mode == "save":
            _train_step(policy, opt)
            save_checkpoint(out, 1, policy, opt, config={"lora": lora}, version=1)
            name = "expect.pt"
        else:
            state = load_checkpoint(out, policy, opt)
            assert state["step"] == 1
            name = "got.pt"
        full = _full_state(policy, opt)  # a collective: every rank gathers
        if dist.get_rank() == 0:
            torch.save(full, Path(out) / name)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_ranks(mode: str, out: Path, lora: int) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(Path(__file__).resolve()), mode, str(out), str(lora)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"2-rank {mode} did not finish in {TIMEOUT_S}s: {str(exc.stderr)[-3000:]}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.mark.slow
def test_saved_on_two_ranks_resumes_in_one_process(tmp_path):
    _run_two_ranks("save", tmp_path, lora=0)
    expect = torch.load(tmp_path / "expect.pt", weights_only=True)
    policy = _policy(0)
    fresh = {k: v.clone() for k, v in policy.state_dict().items()}
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    state = load_checkpoint(tmp_path, policy, opt)
    assert (state["step"], state["version"], state["world_size"]) == (1, 1, 2)
    assert not policy.sharded
    got = _full_state(policy, opt)
    _assert_same(expect, got)
    assert any(not torch.equal(fresh[k], got["model"][k]) for k in fresh)  # the step did change the weights
    stored = ckpt.checkpoint_tensors(tmp_path)["policy"]  # read without building a model
    assert stored.keys() == expect["model"].keys()
    assert all(torch.equal(stored[k], expect["model"][k]) for k in stored)
    # the resumed optimiser carries on: one more step works and moves the weights
    _train_step(policy, opt)


@pytest.mark.slow
def test_lora_saved_in_one_process_resumes_on_two_ranks_with_adapters_only(tmp_path):
    policy = _policy(4)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    _train_step(policy, opt)
    folder = save_checkpoint(tmp_path, 1, policy, opt, version=1)
    expect = _full_state(policy, opt)
    base = sum(p.numel() for p in policy.module.parameters() if not p.requires_grad) * 4  # float32 bytes
    size = _dir_bytes(folder / ckpt.DCP_DIR)
    assert size < base / 30  # adapters, their two Adam moments and metadata; no base weights
    stored = ckpt.stored_keys(folder)
    assert stored and all(".lora_" in k for k in stored if k.startswith("model.")), stored
    _run_two_ranks("load", tmp_path, lora=4)
    got = torch.load(tmp_path / "got.pt", weights_only=True)
    _assert_same(expect, got)


def test_crash_mid_save_keeps_the_previous_latest(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    policy = _policy(4)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    _train_step(policy, opt)
    first = save_checkpoint(tmp_path, 1, policy, opt, version=1)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    _train_step(policy, opt)

    def dies(*_a, **_k):
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(dcp, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, policy, opt, version=2)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == first
    fresh = _policy(4)
    opt2 = torch.optim.AdamW(fresh.trainable_parameters(), lr=1e-2)
    assert load_checkpoint(tmp_path, fresh, opt2)["step"] == 1
    after = fresh.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_keep_prunes_and_the_older_single_file_format_still_loads(tmp_path):
    policy = _policy(0)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    _train_step(policy, opt)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, policy, opt, keep=2)
    names = sorted(p.name for p in (tmp_path / ckpt.CKPT_DIR).glob("step_*"))
    assert names == ["step_000002", "step_000003"]
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    torch.save(policy.state_dict(), legacy / ckpt.LEGACY_MODEL)
    torch.save(opt.state_dict(), legacy / ckpt.LEGACY_OPTIMIZER)
    (legacy / "state.json").write_text((tmp_path / ckpt.CKPT_DIR / "step_000003" / "state.json").read_text())
    fresh = _policy(0)
    opt2 = torch.optim.AdamW(fresh.trainable_parameters(), lr=1e-2)
    load_checkpoint(legacy, fresh, opt2)
    _assert_same(_full_state(policy, opt), _full_state(fresh, opt2))


def test_mismatched_policy_and_missing_checkpoint_name_the_fix(tmp_path):
    policy = _policy(4)
    save_checkpoint(tmp_path, 1, policy, None)
    with pytest.raises(Exception, match="another model, LoRA setting"):
        load_checkpoint(tmp_path, _policy(0))
    other = _policy(4)
    with pytest.raises(Exception, match="holds no optimizer state"):
        load_checkpoint(tmp_path, other, torch.optim.AdamW(other.trainable_parameters()))
    with pytest.raises(Exception, match="no checkpoint in"):
        load_checkpoint(tmp_path / "nothing")


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
