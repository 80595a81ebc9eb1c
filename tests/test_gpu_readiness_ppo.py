"""PPO's critic under LoRA (issue 24, point 9): ``critic: lora`` and ``critic: head``, and the one-node PPO recipe.

A tiny random Qwen3 (real tokenizer, fp32, CPU) with LoRA adapters on the policy; real peft, real packed trees
with a retry fork (a tree attention mask), the trainer's own ``prepare``/``update``/checkpoint code.
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")
pytest.importorskip("peft")

from clawgym_env.capture.records import CallRecord, EpisodeRecord  # noqa: E402
from clawgym_env.capture.tree import CallTree  # noqa: E402
from clawgym_env.errors import ConfigError  # noqa: E402
from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids  # noqa: E402
from trainers.batch.logprobs import token_logprobs  # noqa: E402
from trainers.batch.tree_batch import rollout_pack  # noqa: E402
from trainers.policy import PolicyConfig, TrainablePolicy  # noqa: E402
from trainers.ppo.critic_trunk import full_copy_bytes  # noqa: E402
from trainers.ppo.targets import forward_pack  # noqa: E402
from trainers.ppo.train import Args, ppo_loss, prepare, update  # noqa: E402
from trainers.ppo.value import ActorCritic, Critic  # noqa: E402

LORA = 4


def _episode(tok, eid: str, answers: list[str], reward: float, retry: str | None = None):
    prompt = render_prompt_ids(tok, [{"role": "system", "content": "You are an agent. Be brief."},
                                     {"role": "user", "content": f"Task {eid[0]}: count the lines of notes.txt"}])
    calls = []
    for i, text in enumerate(answers + ([retry] if retry else [])):
        if retry and i == len(answers):  # a retry re-sends the last prompt: a fork after shared sampled tokens
            prompt = calls[-1].prompt_token_ids
        out = list(tok.encode(assistant_text(text), add_special_tokens=False))
        calls.append(CallRecord(episode_id=eid, call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                                stream=False, request={}, prompt_token_ids=list(prompt), output_token_ids=out,
                                output_logprobs=[-1.0] * len(out), finish_reason="stop"))
        prompt = prompt + out + list(tok.encode(f"<|im_start|>user\nresult {i}<|im_end|>\n<|im_start|>assistant\n",
                                                add_special_tokens=False))
    rec = EpisodeRecord(episode_id=eid, task_id=eid[0], suite="unit", harness="mini", policy="tiny", status="ok",
                        reward=reward)
    return rec, calls


@pytest.fixture(scope="module")
def trees(tokenizer) -> list[CallTree]:
    """Two one-episode trees; the first forks (a retry), so its pack needs the tree mask."""
    first = CallTree.from_episodes([_episode(tokenizer, "a-0", ["Reading it.", "There are 3 lines."], 1.0,
                                             retry="It has 4 lines.")])
    second = CallTree.from_episodes([_episode(tokenizer, "b-0", ["Opening the file.", "5 lines."], 0.0)])
    assert len(first.leaves()) == 2
    return [first, second]


def _policy(seed: int = 0) -> TrainablePolicy:
    """A LoRA policy whose adapters are NOT the identity (lora_B moved off zero), so leaks would show."""
    policy = TrainablePolicy(PolicyConfig(model="tiny", device="cpu", lora_rank=LORA, lora_alpha=8.0, seed=seed))
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in policy.module.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return policy


def _trainable(module) -> dict[str, int]:
    return {n: p.numel() for n, p in module.named_parameters() if p.requires_grad}


def _optimizer(policy, critic):
    return torch.optim.AdamW([{"params": policy.trainable_parameters(), "lr": 1e-4},
                              {"params": [p for p in critic.parameters() if p.requires_grad], "lr": 3e-3}])


def _value_loss(policy, critic, targets, args) -> float:
    denom = sum(t.denom for t in targets)
    with torch.no_grad():
        return sum(ppo_loss(policy.causal_lm, critic, t, args, denom, vocab_limit=policy.vocab_limit)[1]["v_loss"]
                   for t in targets)


# ---- what trains ---------------------------------------------------------------------------------------------
def test_lora_critic_trains_only_its_adapters_and_head_over_the_policys_own_frozen_base():
    policy = _policy()
    critic = Critic.for_policy(policy, "lora", seed=1)
    trunk_params = sum(p.numel() for n, p in policy.causal_lm.model.named_parameters() if ".lora_" not in n)
    trainable = _trainable(critic)
    assert critic.kind == "lora" and trainable
    assert all(".lora_A.critic." in n or ".lora_B.critic." in n or n.startswith("head.") for n in trainable)
    hidden, layers = policy.causal_lm.config.hidden_size, policy.causal_lm.config.num_hidden_layers
    assert trainable["head.linear.weight"] == hidden
    adapters = sum(v for n, v in trainable.items() if not n.startswith("head."))
    assert adapters == sum(v for n, v in _trainable(policy.module).items())  # same rank and targets as the policy's
    assert len([n for n in trainable if ".lora_A.critic." in n]) == 7 * layers  # every targeted linear of every layer
    assert sum(trainable.values()) < 0.05 * trunk_params, (sum(trainable.values()), trunk_params)
    # one process: every base tensor IS the policy's (no copy), and none of the critic's trainables is the policy's
    policy_ids = {id(p) for p in policy.module.parameters()}
    base = [p for n, p in critic.trunk.named_parameters() if ".lora_" not in n]
    assert base and all(id(p) in policy_ids and not p.requires_grad for p in base)
    assert not any(id(p) in policy_ids for p in critic.parameters() if p.requires_grad)
    assert critic.trunk.config._attn_implementation == policy.causal_lm.config._attn_implementation
    bigger = Critic.for_policy(policy, "lora", seed=1, lora_rank=2 * LORA)  # critic_lora_rank overrides the rank
    assert sum(v for n, v in _trainable(bigger).items() if ".lora_" in n) == 2 * adapters


def test_head_critic_trains_only_the_head_and_sends_no_gradient_into_the_policy(tokenizer, trees):
    policy = _policy()
    args = Args()
    pack = rollout_pack(trees)
    for kind in ("head", "shared"):  # shared: the same head trained THROUGH the trunk (the test can tell them apart)
        critic = Critic.for_policy(policy, kind, seed=1)
        assert sum(_trainable(critic).values()) == policy.causal_lm.config.hidden_size + 1
        policy.module.zero_grad(set_to_none=True)
        _, values, _ = forward_pack(policy.causal_lm, critic, pack.packed, args, pack.trainable,
                                    vocab_limit=policy.vocab_limit)  # the policy's forward inside autograd
        values.pow(2).sum().backward()
        assert critic.head.linear.weight.grad is not None and critic.head.linear.weight.grad.abs().sum() > 0
        touched = [n for n, p in policy.module.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
        if kind == "head":
            assert touched == [], touched[:3]
        else:
            assert any(".lora_" in n for n in touched)  # shared under LoRA trains the policy's adapters too


# ---- it learns --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lora", "head"])
def test_one_ppo_update_moves_the_value_loss_down_on_a_fixed_batch(tokenizer, trees, kind):
    policy = _policy()
    critic = Critic.for_policy(policy, kind, seed=1, init_std=0.1)
    args = Args(update_epochs=6, minibatches=1, vf_clip=0.0)
    targets = prepare(policy.causal_lm, critic, [rollout_pack(trees)], args, vocab_limit=policy.vocab_limit)
    before = _value_loss(policy, critic, targets, args)
    adapters_before = {n: p.detach().clone() for n, p in critic.named_parameters() if p.requires_grad}
    base_before = {n: p.detach().clone() for n, p in critic.named_parameters() if not p.requires_grad}
    stats = update(policy.causal_lm, critic, targets, args, _optimizer(policy, critic),
                   vocab_limit=policy.vocab_limit, rng=random.Random(0))
    after = _value_loss(policy, critic, targets, args)
    assert stats["grad_norm_value"] > 0 and stats["grad_norm"] > 0  # a full PPO update: policy and critic stepped
    assert after < 0.5 * before, (before, after)
    moved = {n for n, p in critic.named_parameters() if p.requires_grad and not torch.equal(p, adapters_before[n])}
    assert "head.linear.weight" in moved
    if kind == "lora":
        assert any(".lora_B.critic." in n for n in moved)
    assert all(torch.equal(p, base_before[n]) for n, p in critic.named_parameters() if not p.requires_grad)


# ---- no leak between the two sets of adapters -----------------------------------------------------------------
def test_the_policys_forward_is_unchanged_by_the_critics_adapters_and_the_other_way_round(tokenizer, trees):
    policy = _policy()
    packs = [rollout_pack(trees[:1]).packed, rollout_pack(trees[1:]).packed]

    def logprobs():
        with torch.no_grad():
            return [token_logprobs(policy.causal_lm, p, vocab_limit=policy.vocab_limit) for p in packs]

    alone = logprobs()  # no critic attached
    critic = Critic.for_policy(policy, "lora", seed=1, init_std=0.1)
    args = Args(update_epochs=4, minibatches=1, vf_clip=0.0)
    targets = prepare(policy.causal_lm, critic, [rollout_pack(trees)], args, vocab_limit=policy.vocab_limit)
    update(policy.causal_lm, critic, targets, args, _optimizer(policy, critic), pretrain=True,
           vocab_limit=policy.vocab_limit, rng=random.Random(0))  # the policy is frozen; the critic's adapters move
    assert any(p.abs().sum() > 0 for n, p in critic.named_parameters() if ".lora_B.critic." in n)
    assert all(torch.equal(a, b) for a, b in zip(alone, logprobs()))  # bit-identical with the critic attached

    def values():
        with torch.no_grad():
            return [critic(p) for p in packs]

    v = values()
    with policy.reference():  # the policy's adapters off (its KL reference): the critic's stay on
        assert all(torch.equal(a, b) for a, b in zip(v, values()))
    with torch.no_grad():
        for name, p in policy.module.named_parameters():
            if "lora_B" in name:
                p.mul_(3.0)  # the policy's adapters change: its logprobs move, the critic's values do not
    assert not all(torch.equal(a, b) for a, b in zip(alone, logprobs()))
    assert all(torch.equal(a, b) for a, b in zip(v, values()))
    with torch.no_grad():
        for name, p in critic.named_parameters():
            if ".lora_B.critic." in name:
                p.zero_()  # the critic's adapters are what made its values differ from the bare base's
    assert not all(torch.allclose(a, b) for a, b in zip(v, values()))


# ---- checkpoints ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lora", "head"])
def test_checkpoints_save_and_restore_the_critic(tmp_path, tokenizer, trees, kind):
    from trainers.scale.checkpoint import load_checkpoint, save_checkpoint, stored_keys

    policy = _policy()
    critic = Critic.for_policy(policy, kind, seed=1, init_std=0.1)
    args = Args(update_epochs=2, minibatches=1)
    optimizer = _optimizer(policy, critic)
    targets = prepare(policy.causal_lm, critic, [rollout_pack(trees)], args, vocab_limit=policy.vocab_limit)
    update(policy.causal_lm, critic, targets, args, optimizer, vocab_limit=policy.vocab_limit, rng=random.Random(0))
    folder = save_checkpoint(tmp_path, 3, ActorCritic(policy, critic), optimizer, version=2)
    keys = {k for k in stored_keys(folder) if k.startswith("model.critic.")}
    assert keys == {f"model.critic.{n}" for n in _trainable(critic)}  # adapters and head only, never the base
    assert not any(k.startswith("model.policy.") and ".lora_" not in k for k in stored_keys(folder))

    fresh_policy = _policy(seed=5)  # other adapters and another critic: everything trainable must come back
    fresh = Critic.for_policy(fresh_policy, kind, seed=9, init_std=0.1)
    fresh_opt = _optimizer(fresh_policy, fresh)
    assert not torch.equal(fresh.head.linear.weight, critic.head.linear.weight)
    state = load_checkpoint(tmp_path, ActorCritic(fresh_policy, fresh), fresh_opt, restore_rng=False)
    assert state["step"] == 3 and state["version"] == 2
    want = dict(critic.named_parameters())
    for name, p in fresh.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, want[name]), name
    mine = {id(p): n for n, p in critic.named_parameters()}
    theirs = {id(p): n for n, p in fresh.named_parameters()}
    for group_a, group_b in zip(optimizer.param_groups, fresh_opt.param_groups):
        for a, b in zip(group_a["params"], group_b["params"]):
            if id(a) in mine:  # the critic's AdamW moments are restored too
                assert theirs[id(b)] == mine[id(a)]
                assert torch.equal(optimizer.state[a]["exp_avg"], fresh_opt.state[b]["exp_avg"])
    if kind == "lora":  # the restored critic still runs on the fresh policy's own frozen base
        assert all(id(p) in {id(q) for q in fresh_policy.module.parameters()}
                   for n, p in fresh.trunk.named_parameters() if ".lora_" not in n)


# ---- config ---------------------------------------------------------------------------------------------------
def test_a_full_copy_separate_critic_under_lora_warns_with_its_memory():
    policy = _policy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        critic = Critic.for_policy(policy, "separate", seed=1)
    gib = full_copy_bytes(critic.trunk) / 2**30
    assert gib == pytest.approx(4 * 4 * sum(p.numel() for p in critic.trunk.parameters()) / 2**30)  # fp32: 4 B
    texts = [str(w.message) for w in caught if "critic: separate under LoRA" in str(w.message)]
    assert texts and f"{gib:.1f} GiB" in texts[0] and "critic: lora" in texts[0]
    full = TrainablePolicy(PolicyConfig(model="tiny", device="cpu"))  # a full fine-tune: no warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Critic.for_policy(full, "separate", seed=1)
    assert not [w for w in caught if "critic: separate under LoRA" in str(w.message)]


def test_critic_settings_are_checked_before_anything_runs():
    with pytest.raises(ConfigError, match="critic_lora_rank"):
        Args(critic="lora")  # no LoRA rank anywhere
    with pytest.raises(ConfigError, match="value_model"):
        Args(critic="head", value_model="/models/x")
    with pytest.raises(ConfigError, match="separate|shared|lora|head"):
        Args(critic="frozen")
    assert Args(critic="lora", critic_lora_rank=8).critic == "lora"
    assert Args(critic="lora", policy=PolicyConfig(lora_rank=8)).critic_lora_rank == 0


# ---- the one-node recipe ----------------------------------------------------------------------------------------
RECIPE = Path(__file__).resolve().parent.parent / "trainers/configs/qwen3_8b_ppo_lora_1node.yaml"
QWEN3_8B = {  # the published Qwen3-8B config.json's fields
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def _qwen3_8b_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_8B))
    return folder


def test_the_ppo_recipe_passes_check_config_against_a_qwen3_8b_shaped_folder(tmp_path, capsys):
    from clawgym_cli.main import main

    folder = _qwen3_8b_folder(tmp_path)
    recipe = yaml.safe_load(RECIPE.read_text())
    assert recipe["algo"] == "ppo" and recipe["critic"] == "lora" and recipe["policy"]["lora_rank"] == 64
    argv = ["train", "--check-config", "--config", str(RECIPE), "--set", f"policy.model={folder}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "config OK" in out and "(algo ppo)" in out and f"65536 positions of {folder}" in out
    assert main([*argv, "--set", "critic_lora_rank=-1"]) != 0  # the critic's own settings are checked too
    assert "critic_lora_rank must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not Path(recipe["out_dir"]).exists()  # nothing written


def test_the_recipes_memory_model_counts_the_real_shapes_adapters(tmp_path, tokenizer):
    """The recipe's policy and critic on a meta Qwen3-8B (shapes only): 175M adapter parameters each, a
    4,097-parameter head, and the critic's trunk holds no weight of its own."""
    from trainers.policy import load_causal_lm

    recipe = yaml.safe_load(RECIPE.read_text())
    cfg = PolicyConfig(model=str(_qwen3_8b_folder(tmp_path)), device="cpu", dtype="bfloat16",
                       lora_rank=recipe["policy"]["lora_rank"], lora_alpha=recipe["policy"]["lora_alpha"])
    policy = TrainablePolicy(cfg, tokenizer=tokenizer, model=load_causal_lm(cfg, tokenizer, meta=True))
    critic = Critic.for_policy(policy, recipe["critic"], lora_rank=recipe["critic_lora_rank"])
    policy_adapters = sum(p.numel() for p in policy.trainable_parameters())
    critic_trainable = _trainable(critic)
    assert policy_adapters == 36 * 64 * (2 * 8192 + 2 * 5120 + 3 * 16384) == 174_587_904
    assert sum(v for n, v in critic_trainable.items() if ".lora_" in n) == policy_adapters
    assert critic_trainable["head.linear.weight"] + critic_trainable["head.linear.bias"] == 4097
    base = sum(p.numel() for p in policy.causal_lm.parameters() if not p.requires_grad)
    assert 8.1e9 < base < 8.3e9  # the 8.2B of the memory model (16.4 GB in bf16)
    policy_ids = {id(p) for p in policy.module.parameters()}
    assert all(id(p) in policy_ids for n, p in critic.trunk.named_parameters() if ".lora_" not in n)
    text = RECIPE.read_text()
    assert "175M params" in text and "4,097 params" in text and "16.4 GB" in text


def test_clawgym_train_runs_ppo_with_a_lora_critic_and_checkpoints_only_what_trains(tmp_path):
    """``clawgym train`` (a real subprocess: sandboxes, proxy, the tiny LoRA policy sampling): a value-pretraining
    step and a PPO step with ``critic: lora``; the checkpoints hold the critic's adapters and head, which moved,
    and no base weight."""
    import subprocess
    import sys

    from trainers.scale.checkpoint import checkpoint_tensors

    cfg = {"algo": "ppo", "out_dir": str(tmp_path / "run"), "steps": 2, "save_every": 1, "value_pretrain_steps": 1,
           "harnesses": {"mini": 1.0}, "tasks_per_step": 2, "samples_per_task": 1, "concurrency": 2,
           "max_tokens": 16, "policy": {"model": "tiny", "device": "cpu", "lora_rank": LORA},
           "critic": "lora", "critic_lora_rank": 2, "learning_rate": 1e-4, "critic_learning_rate": 1e-2,
           "minibatches": 1, "log": {"plot": False}}
    path = tmp_path / "ppo_lora.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "clawgym_cli", "train", "--config", str(path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["value_pretrain", "ppo"] and rows[0]["v_loss"] > 0
    assert rows[0]["grad_norm_value"] > 0 and rows[1]["grad_norm"] > 0
    first = checkpoint_tensors(tmp_path / "run" / "checkpoints" / "step_000001")
    second = checkpoint_tensors(tmp_path / "run" / "checkpoints" / "step_000002")
    critic_keys = set(second["critic"])
    assert "head.linear.weight" in critic_keys and all(k.startswith("head.") or ".lora_" in k for k in critic_keys)
    assert all(".critic." in k for k in critic_keys if ".lora_" in k)
    assert {second["critic"][k].shape[0] for k in critic_keys if ".lora_A." in k} == {2}  # critic_lora_rank
    assert all(".lora_" in k for k in second["policy"])  # the policy's adapters only: the base never trains
    assert any(not torch.equal(first["critic"][k], second["critic"][k]) for k in critic_keys)
