"""``clawgym export``: a checkpoint becomes a Hugging Face model directory (merged, or a LoRA adapter with its
base) that transformers and ``--policy transformers:DIR`` load and that scores like the trained policy.

The exports compared within float rounding ask for ``--dtype float32`` (the masters'); the default, bfloat16, is
tested in tests/test_gpu_readiness_weights.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from clawgym_cli.main import main  # noqa: E402
from trainers.policy import PolicyConfig, TrainablePolicy  # noqa: E402
from trainers.scale.checkpoint import save_checkpoint  # noqa: E402
from trainers.scale.export import EXPORT_NOTE  # noqa: E402

IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]])


def _trained_run(tmp_path, lora: int) -> tuple[TrainablePolicy, str]:
    """A tiny policy moved away from its initial weights (adapters non-zero), checkpointed as a run would."""
    cfg = PolicyConfig(model="tiny", device="cpu", seed=1, lora_rank=lora)
    policy = TrainablePolicy(cfg)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    with torch.no_grad():
        for name, p in policy.module.named_parameters():
            if p.requires_grad and ("lora_B" in name or not lora):
                p.add_(torch.randn_like(p) * 0.05)
    logits = policy.causal_lm(input_ids=IDS).logits
    torch.nn.functional.cross_entropy(logits[0, :-1], IDS[0, 1:]).backward()
    opt.step()
    run = tmp_path / "run"
    save_checkpoint(run, 3, policy, opt, config={"algo": "grpo", "policy": dataclasses.asdict(cfg)}, version=3)
    policy.module.eval()
    return policy, str(run)


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()


@pytest.mark.slow
def test_merged_lora_export_loads_in_transformers_and_matches_the_policy(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from clawgym_env.policy import make_policy

    policy, run = _trained_run(tmp_path, lora=4)
    out = tmp_path / "hf"
    assert main(["export", run, "--out", str(out), "--dtype", "float32"]) == 0
    assert "merged model" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert not any("lora" in k for k in model.state_dict())
    torch.testing.assert_close(_logits(model), _logits(policy.causal_lm), atol=1e-4, rtol=1e-4)
    note = json.loads((out / EXPORT_NOTE).read_text())
    assert (note["kind"], note["step"]) == ("merged", 3)
    served = make_policy(f"transformers:{out}", device="cpu")
    assert served.tokenizer.chat_template  # the chat template travels with the export
    torch.testing.assert_close(_logits(served.model), _logits(policy.causal_lm), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_adapter_export_applies_to_its_base(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    policy, run = _trained_run(tmp_path, lora=4)
    out = tmp_path / "adapter"
    assert main(["export", f"{run}/checkpoints/step_000003", "--out", str(out), "--adapter", "--dtype", "float32"]) == 0
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    base_dir = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    adapted = PeftModel.from_pretrained(base, str(out)).eval()
    torch.testing.assert_close(_logits(adapted), _logits(policy.causal_lm), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_full_finetune_export_matches(tmp_path):
    from transformers import AutoModelForCausalLM

    policy, run = _trained_run(tmp_path, lora=0)
    out = tmp_path / "hf"
    assert main(["export", run, "--out", str(out), "--dtype", "float32"]) == 0
    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    torch.testing.assert_close(_logits(model), _logits(policy.causal_lm), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_export_errors_name_the_fix(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    assert "no checkpoint in" in capsys.readouterr().err
    _, run = _trained_run(tmp_path, lora=0)
    assert main(["export", run, "--out", str(tmp_path / "a"), "--adapter"]) == 2
    assert "drop --adapter" in capsys.readouterr().err
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    assert main(["export", run, "--out", str(busy)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["export", run, "--out", str(busy), "--force"]) == 2
    assert "not an earlier export" in capsys.readouterr().err
    assert (busy / "keep.txt").read_text() == "mine"
    done = tmp_path / "done"
    assert main(["export", run, "--out", str(done)]) == 0
    assert main(["export", run, "--out", str(done)]) == 2
    assert main(["export", run, "--out", str(done), "--force"]) == 0
    no_cfg = tmp_path / "nocfg"
    save_checkpoint(no_cfg, 1, TrainablePolicy(PolicyConfig(device="cpu")), None)
    assert main(["export", str(no_cfg), "--out", str(tmp_path / "n")]) == 2
    assert "records no policy config" in capsys.readouterr().err
