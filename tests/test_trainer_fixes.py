"""Regression tests for trainer bugs found in review: the GRPO KL reference on resume, gradient
checkpointing of a separate PPO critic, and in-loop evaluation through every harness of a mix."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from clawgym_env.capture.records import EpisodeRecord  # noqa: E402
from clawgym_env.episodes.run import EpisodeResult  # noqa: E402
from clawgym_env.task import Task  # noqa: E402
from trainers.batch.logprobs import _checkpointing  # noqa: E402
from trainers.grpo import train as grpo  # noqa: E402
from trainers.policy import PolicyConfig, TrainablePolicy  # noqa: E402
from trainers.ppo.value import Critic  # noqa: E402
from trainers.rollouts.evaluation import eval_harnesses, evaluate_harnesses  # noqa: E402
from trainers.scale.checkpoint import save_checkpoint  # noqa: E402


def _tiny(**kw) -> TrainablePolicy:
    return TrainablePolicy(PolicyConfig(model="tiny", device="cpu", seed=0, **kw))


def test_grpo_resume_keeps_the_initial_weights_as_kl_reference(tmp_path):
    """A resumed run's KL reference is the model the run started from, not the resumed weights."""
    args = grpo.Args(out_dir=str(tmp_path), kl_coef=0.1)
    trained = _tiny()
    initial = {k: v.clone() for k, v in trained.causal_lm.state_dict().items()}
    with torch.no_grad():
        for p in trained.causal_lm.parameters():
            p.add_(0.5)
    opt = torch.optim.AdamW(trained.trainable_parameters(), lr=1e-3)
    save_checkpoint(tmp_path, 3, trained, opt, config=args, version=3, keep=2)

    fresh = _tiny()  # what a restarted process builds from args.policy
    opt2 = torch.optim.AdamW(fresh.trainable_parameters(), lr=1e-3)
    start, version = grpo.resume(args, fresh, opt2, tmp_path, echo=lambda *_: None)
    assert (start, version) == (4, 3)
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(fresh.causal_lm.state_dict()[name], initial[name] + 0.5)  # resumed weights
    with fresh.reference() as ref:
        assert torch.equal(ref.state_dict()[name], initial[name])  # reference: the starting weights


def test_separate_critic_checkpoints_activations_when_the_policy_does():
    policy = _tiny(gradient_checkpointing=True)
    critic = Critic.for_policy(policy, "separate")
    critic.train()
    with torch.enable_grad():
        assert _checkpointing(critic.trunk)
    plain = Critic.for_policy(_tiny(), "separate")
    plain.train()
    assert not _checkpointing(plain.trunk)


@dataclasses.dataclass
class _FakePolicy:
    name: str = "fake"


class _FakeRuntime:
    """Runs nothing: each episode passes through ``mini`` and fails through every other harness."""

    policy = _FakePolicy()

    def __init__(self) -> None:
        self.harnesses: list[str] = []

    def run(self, task, adapter, **_kw) -> EpisodeResult:
        self.harnesses.append(adapter.name)
        reward = 1.0 if adapter.name == "mini" else 0.0
        rec = EpisodeRecord(episode_id=f"e{len(self.harnesses)}", task_id=task.id, harness=adapter.name,
                            policy="fake", status="ok", reward=reward)
        return EpisodeResult(rec, [])


def test_in_loop_evaluation_covers_every_harness_of_the_mix():
    assert eval_harnesses(None, {"mini": 1.0, "codex": 2.0, "openclaw": 0.0}) == ["codex", "mini"]
    assert eval_harnesses("openclaw", {"mini": 1.0}) == ["openclaw"]
    rt = _FakeRuntime()
    tasks = [Task(id="a", instruction="x"), Task(id="b", instruction="y")]
    row = evaluate_harnesses(rt, tasks, ["codex", "mini"], samples=2, concurrency=2)
    assert sorted(set(rt.harnesses)) == ["codex", "mini"] and len(rt.harnesses) == 8
    assert row["eval/mini/pass_rate"] == 1.0 and row["eval/codex/pass_rate"] == 0.0
    assert row["eval/episodes"] == 8 and row["eval/passed"] == 4 and row["eval/pass_rate"] == 0.5
