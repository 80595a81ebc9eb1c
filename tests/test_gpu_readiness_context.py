"""Issue 24, point 2: 64K context done right. One ``policy.rope_scaling`` (YaRN) reaches the trainer's rotary
embedding, the vLLM engine's argv and every model folder written; ``clawgym train`` (and ``--check-config``) refuses a
context above the model's positions, naming the YAML to add; both GPU recipes pass ``--check-config`` against
config-only folders shaped like Qwen3-8B's and Qwen3-30B-A3B's published configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from clawgym_env.errors import ConfigError, PolicyError
from clawgym_env.policy.rope import RopeScaling

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {"qwen3-8b": ROOT / "trainers/configs/qwen3_8b_lora_1gpu.yaml",
           "qwen3-30b-a3b": ROOT / "trainers/configs/qwen3_30b_a3b_8gpu.yaml"}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "decoder_sparse_step": 1,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}
MODELS = {"qwen3-8b": QWEN3_8B, "qwen3-30b-a3b": QWEN3_30B_A3B}
YARN_64K = RopeScaling(factor=2.0, original_max_position_embeddings=32768)


def _config_only(tmp_path: Path, name: str) -> Path:
    """A model folder holding only a ``config.json`` shaped like the published one."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MODELS[name], indent=2))
    return folder


def _reference_yarn(config_fields: dict, scaling: RopeScaling) -> tuple[torch.Tensor, float]:
    """transformers' own YaRN for a config built independently with the scaling written in (no project code)."""
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    fields = dict(config_fields)
    theta = fields.pop("rope_theta")
    ref = Qwen3Config(**fields, max_position_embeddings=scaling.positions,
                      rope_parameters={"rope_type": "yarn", "factor": scaling.factor, "rope_theta": theta,
                                       "original_max_position_embeddings": scaling.original_max_position_embeddings})
    inv_freq, attention = ROPE_INIT_FUNCTIONS["yarn"](ref)
    return inv_freq, float(attention)


# -- the trainer's model ---------------------------------------------------------------------------------------------
def test_trainer_model_built_with_the_setting_has_transformers_yarn_rotary_embedding(tmp_path):
    from trainers.policy import PolicyConfig, load_causal_lm, tokenizer_for

    small = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "intermediate_size": 128, "num_hidden_layers": 2}
    base = PolicyConfig(model="tiny", tiny_hidden_size=64, tiny_heads=4, tiny_kv_heads=2)
    tok = tokenizer_for(base)
    plain = load_causal_lm(base, tok)
    scaling = RopeScaling(factor=4.0, original_max_position_embeddings=8192)
    cfg = PolicyConfig(model="tiny", tiny_hidden_size=64, tiny_heads=4, tiny_kv_heads=2,
                       rope_scaling={"factor": 4.0, "original_max_position_embeddings": 8192})  # YAML's mapping form
    assert cfg.rope_scaling == scaling
    scaled = load_causal_lm(cfg, tok)
    theta = scaled.config.rope_parameters["rope_theta"]
    ref_inv, ref_att = _reference_yarn({**small, "rope_theta": theta}, scaling)
    rot = scaled.model.rotary_emb
    assert rot.rope_type == "yarn" and scaled.config.max_position_embeddings == 32768
    torch.testing.assert_close(rot.inv_freq, ref_inv, rtol=0, atol=0)
    assert rot.attention_scaling == pytest.approx(ref_att) and ref_att > 1.0  # YaRN's attention temperature
    assert not torch.equal(plain.model.rotary_emb.inv_freq, rot.inv_freq)  # not the unscaled rotary embedding
    # same weights (same seed), different positions: the logits past the original length differ from the plain model
    ids = torch.tensor([[1, 2, 3, 4]])
    pos = torch.tensor([[20000, 20001, 20002, 20003]])
    with torch.no_grad():
        assert not torch.allclose(plain(ids, position_ids=pos).logits, scaled(ids, position_ids=pos).logits)

    # a model folder on disk (from_pretrained path) and the folder the trainer writes for an engine restart
    folder = tmp_path / "base"
    plain.save_pretrained(str(folder))
    from_dir = load_causal_lm(PolicyConfig(model=str(folder), rope_scaling=scaling), tok)
    torch.testing.assert_close(from_dir.model.rotary_emb.inv_freq, ref_inv, rtol=0, atol=0)
    assert from_dir.model.rotary_emb.attention_scaling == pytest.approx(ref_att)


def test_the_folders_written_for_engines_and_export_carry_the_scaling(tmp_path):
    from trainers.policy import PolicyConfig, TrainablePolicy, load_causal_lm
    from trainers.scale.export import policy_config_of
    from trainers.scale.weight_sync import write_model_dir

    cfg = PolicyConfig(model="tiny", rope_scaling=YARN_64K, lora_rank=4, device="cpu")
    policy = TrainablePolicy(cfg)
    expected = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768}
    served = write_model_dir(policy.serving_state_dict(), policy.causal_lm, policy.tokenizer, tmp_path / "v0")
    exported = policy.save_pretrained(tmp_path / "export")
    for folder in (served, exported):
        written = json.loads((folder / "config.json").read_text())
        assert {k: written["rope_parameters"][k] for k in expected} == expected, folder
        assert written["max_position_embeddings"] == 65536
        # a restarted engine or trainer reading the folder alone (no setting) gets the same rotary embedding
        again = load_causal_lm(PolicyConfig(model=str(folder)), policy.tokenizer)
        torch.testing.assert_close(again.model.rotary_emb.inv_freq, policy.causal_lm.model.rotary_emb.inv_freq)
    # clawgym export rebuilds the policy from the checkpoint's recorded config (a JSON mapping)
    state = {"config": {"policy": {"model": "tiny", "rope_scaling": {"type": "yarn", "factor": 2.0,
                                                                      "original_max_position_embeddings": 32768}}}}
    assert policy_config_of(state, tmp_path).rope_scaling == YARN_64K


def test_bad_rope_scaling_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="factor must be a number > 1"):
        RopeScaling(factor=1.0, original_max_position_embeddings=32768)
    with pytest.raises(ConfigError, match="give factor and original_max_position_embeddings"):
        RopeScaling.parse({"factor": 2.0})
    with pytest.raises(ConfigError, match="pretrained on"):
        RopeScaling(factor=2.0, original_max_position_embeddings=65536).overrides(QWEN3_8B)
    from trainers.train import args_from_config

    with pytest.raises(ConfigError, match="rope_scaling"):
        args_from_config({"algo": "grpo", "policy": {"rope_scaling": {"type": "linear", "factor": 2.0,
                                                                      "original_max_position_embeddings": 8}}})


# -- the vLLM engine ------------------------------------------------------------------------------------------------
def _server(tmp_path: Path, model_dir: Path, **kw):
    from clawgym_env.policy.vllm.server import VLLMServer

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "python").touch()  # never started here
    (model_dir / "model.safetensors").touch()
    return VLLMServer(model_dir, venv=venv, port=1, **kw)


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_vllm_server_argv_carries_the_same_scaling_as_the_trainer(tmp_path):
    from trainers.policy import PolicyConfig, model_config

    folder = _config_only(tmp_path, "qwen3-8b")
    cmd = _server(tmp_path, folder, max_model_len=65536, rope_scaling=YARN_64K).command()
    overrides = json.loads(_flag(cmd, "--hf-overrides"))
    assert _flag(cmd, "--max-model-len") == "65536"
    trainer = model_config(PolicyConfig(model=str(folder), rope_scaling=YARN_64K))  # what the trainer's model gets
    assert overrides == {"max_position_embeddings": trainer.max_position_embeddings,
                         "rope_parameters": dict(trainer.rope_parameters)}
    assert overrides["rope_parameters"] == {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1000000.0,
                                            "original_max_position_embeddings": 32768}
    assert "--hf-overrides" not in _server(tmp_path, folder, max_model_len=32768).command()
    with pytest.raises(PolicyError, match="rope_scaling: {type: yarn"):
        _server(tmp_path, folder, max_model_len=65536)  # no scaling: above the folder's 40960 positions


def test_training_starts_engines_with_the_policy_scaling(tmp_path, monkeypatch):
    """The vLLM generation path hands policy.rope_scaling to every engine it starts."""
    import trainers.rollouts.generation as generation

    seen: list = []

    class Recorder:
        def __init__(self, model_dir, **kw):
            seen.append(kw)

        def start(self):
            raise PolicyError("not started in this test")

        def stop(self):
            pass

    monkeypatch.setattr("clawgym_env.policy.vllm.server.VLLMServer", Recorder)
    from trainers.policy import PolicyConfig, TrainablePolicy

    policy = TrainablePolicy(PolicyConfig(model="tiny", rope_scaling=YARN_64K, device="cpu"))
    cfg = generation.GenerationConfig(backend="vllm", replicas=2, max_model_len=65536)
    with pytest.raises(PolicyError, match="not started"):
        with generation.open_generation(cfg, policy, tmp_path, max_context_tokens=65536):
            pass
    assert [kw["rope_scaling"] for kw in seen] == [YARN_64K, YARN_64K]
    assert {kw["max_model_len"] for kw in seen} == {65536}


def _vllm_python() -> Path | None:
    from clawgym_env.policy.vllm.server import vllm_python

    try:
        return vllm_python()
    except PolicyError:
        if os.environ.get("CLAWGYM_REQUIRE_VLLM") == "1":
            raise
        return None


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(_vllm_python() is None, reason="vLLM is not installed (bash scripts/vllm_env.sh)")
def test_vllm_accepts_the_argv_at_64k_and_refuses_it_without_scaling(tmp_path):
    """vLLM's own engine config (no server started): the argv's overrides make 65536 legal, with YaRN."""
    from clawgym_env.policy.tokenizer import default_tokenizer_dir

    folder = _config_only(tmp_path, "qwen3-8b")
    cmd = _server(tmp_path, folder, max_model_len=65536, rope_scaling=YARN_64K).command()
    script = textwrap.dedent("""
        import json, sys
        from vllm.config import ModelConfig
        model, tok, overrides, max_len = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
        m = ModelConfig(model=model, tokenizer=tok, hf_overrides=overrides, max_model_len=max_len)
        print(json.dumps({"max_model_len": m.max_model_len, "rope": m.hf_config.rope_parameters}))
        try:
            ModelConfig(model=model, tokenizer=tok, max_model_len=max_len)
            print("unscaled accepted")
        except Exception as exc:
            print("unscaled refused:", type(exc).__name__)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run([str(_vllm_python()), "-c", script, str(folder), str(default_tokenizer_dir()),
                          _flag(cmd, "--hf-overrides"), _flag(cmd, "--max-model-len")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    accepted = json.loads(lines[-2])
    assert accepted["max_model_len"] == 65536 and accepted["rope"]["rope_type"] == "yarn"
    assert accepted["rope"]["factor"] == 2.0 and accepted["rope"]["original_max_position_embeddings"] == 32768
    assert lines[-1].startswith("unscaled refused")


# -- clawgym train refuses, --check-config passes the recipes --------------------------------------------------------
def test_train_refuses_a_context_above_the_positions_and_its_fix_works(tmp_path):
    from trainers.train import check_only, run

    config = {"algo": "grpo", "out_dir": str(tmp_path / "run"), "max_context_tokens": 40000,
              "max_pack_tokens": 40000, "policy": {"model": "tiny"}}  # the tiny model covers 32768 positions
    for attempt in (lambda: run(dict(config)), lambda: check_only(dict(config), echo=lambda _: None)):
        with pytest.raises(ConfigError) as err:
            attempt()
        message = str(err.value)
        assert "max_context_tokens 40000 is above the 32768 positions" in message
        assert "policy:\n  rope_scaling: {type: yarn, factor: 1.23, original_max_position_embeddings: 32768}" in message
    assert not (tmp_path / "run" / "config.json").exists()  # refused before anything was written
    fix = yaml.safe_load(message.split("):\n", 1)[1].split("\n(", 1)[0])  # the YAML the message gives, as written
    printed: list[str] = []
    assert check_only({**config, "policy": {**config["policy"], **fix["policy"]}}, echo=printed.append) == 0
    assert "40000 <= 40304 positions of tiny (YaRN factor 1.23 over 32768)" in printed[0]
    # a scaling that is too small is refused too, naming a factor that fits
    with pytest.raises(ConfigError, match=r"raise the factor:\npolicy:\n  rope_scaling: .*factor: 1.23"):
        check_only({**config, "policy": {"model": "tiny", "rope_scaling": {"factor": 1.1,
                                                                           "original_max_position_embeddings": 32768}}})


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_passes_check_config_and_is_refused_without_rope_scaling(tmp_path, name, capsys):
    from clawgym_cli.main import main

    folder = _config_only(tmp_path, name)
    recipe = yaml.safe_load(RECIPES[name].read_text())
    assert RopeScaling.parse(recipe["policy"]["rope_scaling"]) == YARN_64K
    assert recipe["max_context_tokens"] == recipe["scale"]["generation"]["max_model_len"] == 65536
    argv = ["train", "--check-config", "--config", str(RECIPES[name]), "--set", f"policy.model={folder}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "config OK" in out
    assert (f"context: max_context_tokens 65536, scale.generation.max_model_len 65536 <= 65536 positions of {folder} "
            "(YaRN factor 2 over 32768)") in out
    assert main([*argv, "--set", "policy.rope_scaling=null"]) != 0
    err = capsys.readouterr().err
    assert "max_context_tokens 65536 is above the 40960 positions" in err
    assert "rope_scaling: {type: yarn, factor: 1.6, original_max_position_embeddings: 40960}" in err
    assert "Qwen3: 32768 with factor 2.0" in err
    assert not (tmp_path / "runs").exists() and not Path(recipe["out_dir"]).exists()  # nothing written


def test_recipe_scaling_gives_the_real_shaped_model_yarn_positions(tmp_path):
    """The trainer's config for each recipe against the published shapes: 65536 positions, transformers' YaRN."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from trainers.policy import PolicyConfig, model_config

    for name in RECIPES:
        cfg = PolicyConfig(model=str(_config_only(tmp_path, name)), rope_scaling=YARN_64K)
        config = model_config(cfg)
        assert config.max_position_embeddings == 65536 and config.rope_parameters["rope_type"] == "yarn"
        inv_freq, attention = ROPE_INIT_FUNCTIONS["yarn"](config)
        assert inv_freq.shape == (64,) and attention == pytest.approx(0.1 * torch.log(torch.tensor(2.0)).item() + 1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
