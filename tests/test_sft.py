"""Black-box trajectory SFT on expert episodes captured through the real mini harness (bwrap sandbox).

Checks that only the sampled (assistant) tokens are trained — every context token masked —, that
each episode weighs the same whatever its length, that a few steps lower the NLL of the expert's
tokens, and that the saved model serves through ``TransformersPolicy``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainers.batch.logprobs import token_logprobs  # noqa: E402
from trainers.policy import PolicyConfig, TrainablePolicy  # noqa: E402
from trainers.run_args import LogArgs  # noqa: E402
from trainers.sft import train as sft  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/install.sh)")

FAMILY = Path(__file__).resolve().parents[1] / "tasks" / "families" / "count_errors_train"


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite") / "three"
    for name in sorted(p.name for p in FAMILY.iterdir() if p.is_dir())[:3]:
        shutil.copytree(FAMILY / name, root / name)
    return root


@pytest.fixture(scope="module")
def collected(suite, tmp_path_factory):
    args = sft.Args(out_dir=str(tmp_path_factory.mktemp("sft")), suite=str(suite), concurrency=3)
    return sft.collect_expert(args)


def test_expert_episodes_are_captured_through_the_harness(collected):
    episodes, counts = collected
    assert counts.episodes == 3 and counts.kept == 3 and counts.infra_failures == 0
    for rec, calls in episodes:
        assert rec.harness == "mini" and rec.reward == 1.0 and len(calls) == 2
        assert all(c.token_exact for c in calls)


def test_only_sampled_tokens_are_trained_and_episodes_weigh_equally(collected, tokenizer):
    episodes, _ = collected
    pack = sft.sft_pack(episodes)
    packed = pack.packed
    # every output token of every call, identified by its prefix, is trainable; nothing else is
    want = {tuple(list(c.prompt_token_ids) + list(c.output_token_ids)[:j + 1])
            for _, calls in episodes for c in calls for j in range(len(c.output_token_ids))}
    got = set()
    for idx in pack.trainable.nonzero()[:, 0].tolist():
        tree_path = packed.path_indices(0, int(packed.node_ids[packed.token_node[idx]]))
        upto = tree_path[: int((tree_path == idx).nonzero()[0, 0]) + 1]
        got.add(tuple(packed.input_ids[upto].tolist()))
    assert got == want
    assert pack.num_trainable == len(want) < packed.num_tokens // 4
    system_prompt = episodes[0][1][0].prompt_token_ids
    assert not bool(pack.trainable[: len(system_prompt) // 2].any())  # the shared system prompt: context
    per_episode = torch.zeros(len(episodes)).index_add_(0, pack.pair_episode, pack.pair_weight)
    assert torch.allclose(per_episode, torch.full((len(episodes),), 1 / len(episodes)))


def test_sft_lowers_the_expert_nll_and_saves_a_servable_model(collected, suite, tmp_path, tokenizer):
    episodes, _ = collected
    policy = TrainablePolicy(PolicyConfig(model="tiny", seed=2), tokenizer=tokenizer)
    pack = sft.sft_pack(episodes)

    def nll() -> float:
        with torch.no_grad():
            lp = token_logprobs(policy.causal_lm, pack.packed, mask=pack.trainable, vocab_limit=policy.vocab_limit)
            return float(sft.sft_loss(lp, pack))

    before = nll()
    args = sft.Args(out_dir=str(tmp_path / "run"), suite=str(suite), steps=12, batch_episodes=3,
                    learning_rate=1e-2, log_every=4, log=LogArgs(progress=False), policy=policy.config)
    summary = sft.train(args, policy=policy, episodes=episodes)
    after = nll()
    assert after < before / 3, (before, after)
    assert summary.episodes == 3 and Path(summary.metrics).is_file()

    from clawgym_env.policy.base import GenerationContext, SamplingParams
    from clawgym_env.policy.transformers_backend import TransformersPolicy

    served = TransformersPolicy.from_pretrained(summary.model_dir, device="cpu")
    prompt = episodes[0][1][0].prompt_token_ids
    gen = served.generate(prompt, SamplingParams(max_tokens=4, temperature=0.0), GenerationContext())
    with torch.no_grad():
        logits = policy.causal_lm(input_ids=torch.tensor([prompt])).logits[0, -1, :policy.vocab_limit]
    assert gen.token_ids[0] == int(logits.argmax())


def test_sft_stops_at_a_loss_not_a_step_count(collected, suite, tmp_path, tokenizer):
    """``stop_nll``: training ends after the first step whose batch token NLL is at or below it (the quickstart's
    warm start stops at a loss, so every seed leaves RL about as much to learn); the summary, the last metrics
    row and the checkpoint name the step it stopped at. A negative value is refused."""
    episodes, _ = collected
    common = dict(suite=str(suite), batch_episodes=3, learning_rate=1e-2, log_every=100, save_model=False,
                  log=LogArgs(progress=False))
    full = sft.train(sft.Args(out_dir=str(tmp_path / "full"), steps=12, **common),
                     policy=TrainablePolicy(PolicyConfig(model="tiny", seed=2), tokenizer=tokenizer), episodes=episodes)
    rows = [json.loads(line) for line in Path(full.metrics).read_text().splitlines()]
    assert full.steps == 12 and rows[-1]["step"] == 12
    target = float(rows[-1]["token_nll"]) * 4  # a loss the full run crosses before its last step
    early = sft.train(sft.Args(out_dir=str(tmp_path / "early"), steps=12, stop_nll=target, **common),
                      policy=TrainablePolicy(PolicyConfig(model="tiny", seed=2), tokenizer=tokenizer),
                      episodes=episodes)
    last = [json.loads(line) for line in Path(early.metrics).read_text().splitlines()][-1]
    assert 1 <= early.steps < 12 and last["step"] == early.steps and last["token_nll"] <= target
    assert Path(early.checkpoint).name.endswith(str(early.steps))
    with pytest.raises(Exception, match="stop_nll"):
        sft.Args(stop_nll=-1.0)
