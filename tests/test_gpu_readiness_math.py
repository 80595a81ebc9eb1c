"""Issue 24, points 6, 7, 10 and 11: trainer maths that only bites at scale, checked on CPU.

* 6 — ``loss_norm: token`` with ``minibatches > 1``: every optimiser step's (token, episode) weights sum to 1
  (verl's and DAPO's token mean per minibatch), whatever the minibatches' sizes; ``loss_norm: constant``
  divides by the episode token budget (``max_context_tokens``), not by one call's ``max_tokens``.
* 7 — a token sampled by several episodes of a group (one shared node) keeps each episode's own behaviour
  logprob and policy version, so each episode's truncated importance weight uses the policy that sampled it.
* 10 — dynamic-sampling refills draw without replacement within a step: never two groups with one key (which
  async ``stale: regenerate`` turned into ``all_stale``); a suite with too few tasks says so in a log line.
* 11 — the "engine sampled the synced weights" check reports ``unchecked`` (and fails when required) when no
  step scored rollouts sampled after a sync, instead of passing vacuously.

Each test fails on the code before its fix. The update tests replace the model's forward by fixed logprobs
(``fsdp_forward``): what they check is the weighting, not a model.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import types

import pytest

torch = pytest.importorskip("torch")

import trainers.grpo.update as update  # noqa: E402
from clawgym_env.capture.records import CallRecord, EpisodeRecord  # noqa: E402
from clawgym_env.episodes.run import EpisodeResult  # noqa: E402
from trainers.batch.tree_batch import make_groups, pack_groups  # noqa: E402
from trainers.grpo.train import Args, collect_groups  # noqa: E402
from trainers.rollouts.ahead import AsyncConfig, RolloutAhead, StepBatch, jobs_for  # noqa: E402

PROMPT = [1, 2, 3, 4]


def call(eid: str, out: list[int], lp: float, version: int = 0, index: int = 0,
         prompt: list[int] | None = None) -> CallRecord:
    """One captured call: ``PROMPT`` (or ``prompt``) then ``out``, every sampled token at logprob ``lp``."""
    return CallRecord(episode_id=eid, call_index=index, dialect="openai_chat", path="/v1/chat/completions",
                      stream=False, request={}, prompt_token_ids=list(prompt or PROMPT), output_token_ids=out,
                      output_logprobs=[lp] * len(out), finish_reason="stop", policy_version=version)


def result(eid: str, task: str, reward: float, calls: list[CallRecord], suite: str = "unit",
           harness: str = "mini") -> EpisodeResult:
    """An episode of ``task`` with ``calls``."""
    rec = EpisodeRecord(episode_id=eid, task_id=task, suite=suite, harness=harness, policy="tiny", status="ok",
                        reward=reward, num_calls=len(calls),
                        policy_version=min((c.policy_version for c in calls), default=0))
    return EpisodeResult(rec, calls)


def fixed_forward(value: float):
    """An ``fsdp_forward`` stand-in: every token's logprob is ``value`` (a leaf that takes gradients)."""
    def forward(_root, fn):
        pack = fn.args[2]  # functools.partial(score_pack, policy, model, pack, args)
        return torch.full((pack.num_tokens,), value, dtype=torch.float32, requires_grad=torch.is_grad_enabled())
    return forward


class StepRecorder:
    """An optimiser stand-in over one probe parameter: records the probe's gradient at every step."""

    def __init__(self, probe: torch.Tensor) -> None:
        self.probe, self.steps = probe, []

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: D102 - the optimiser's interface
        self.probe.grad = None

    def step(self) -> None:  # noqa: D102 - the optimiser's interface
        self.steps.append(float(self.probe.grad) if self.probe.grad is not None else 0.0)


def probe_policy(probe: torch.Tensor):
    """The few fields of a policy the update reads, around a probe parameter."""
    return types.SimpleNamespace(module=None, causal_lm=None, vocab_limit=None, lora=False,
                                 trainable_parameters=lambda: [probe])


# --------------------------------------------------------------------------------------------------- point 6

def two_unequal_groups() -> list:
    """A group of short episodes (2 sampled tokens each) and one of long ones (80 each): different pair counts."""
    short = [result(f"s{i}", "short", float(i), [call(f"s{i}", [10 + i, 20], -1.0)]) for i in range(2)]
    long = [result(f"l{i}", "long", float(i), [call(f"l{i}", [30 + i] + list(range(100, 179)), -1.0)])
            for i in range(2)]
    groups = make_groups(short + long)
    assert [g.skipped for g in groups] == [None, None]
    return groups


def minibatch_weight_sums(monkeypatch, packs, args) -> list[float]:
    """The sum of the (token, episode) weights each optimiser step of :func:`grpo_update` applies."""
    probe = torch.zeros((), requires_grad=True)

    def weight_sum_loss(logp, logp_old, is_weight, pack, **_):  # the loss is d/dprobe = Σ pair weights
        return probe * pack.pair_weight.sum(), {"pg_loss": 0.0, "tokens": float(pack.num_trainable)}

    monkeypatch.setattr(update, "fsdp_forward", fixed_forward(-1.0))
    monkeypatch.setattr(update, "grpo_loss", weight_sum_loss)
    opt = StepRecorder(probe)
    update.grpo_update(probe_policy(probe), opt, packs, args)
    return opt.steps


def test_point6_token_norm_gives_each_minibatch_weight_one(monkeypatch):
    groups = two_unequal_groups()
    packs = pack_groups(groups, loss_norm="token")
    assert len(packs) == 2 and abs(sum(float(p.pair_weight.sum()) for p in packs) - 1.0) < 1e-6
    pairs = [int(p.pair_weight.numel()) for p in packs]
    assert pairs[0] * 10 < pairs[1]  # very unequal minibatches: the bug scaled them 2·4/164 and 2·160/164
    args = Args(loss_norm="token", minibatches=2, update_epochs=2, max_grad_norm=1e9)
    sums = minibatch_weight_sums(monkeypatch, packs, args)
    assert len(sums) == 4 and sums == pytest.approx([1.0] * 4, abs=1e-6)
    # one minibatch: unchanged (one mean over the step's pairs)
    assert minibatch_weight_sums(monkeypatch, packs, Args(loss_norm="token", max_grad_norm=1e9)) == \
        pytest.approx([1.0], abs=1e-6)
    # episode norm: every minibatch is the mean over its groups, as before
    ep = pack_groups(groups, loss_norm="episode")
    assert minibatch_weight_sums(monkeypatch, ep, Args(minibatches=2, max_grad_norm=1e9)) == \
        pytest.approx([1.0, 1.0], abs=1e-6)


def test_point6_constant_norm_divides_by_the_episode_budget(monkeypatch):
    args = Args(loss_norm="constant", max_tokens=64, max_context_tokens=4096, max_pack_tokens=4096)
    assert args.norm_constant == 4096  # the episode's token budget, not one call's max_tokens
    assert Args(loss_norm="constant", loss_norm_constant=500.0).norm_constant == 500.0
    # an agent episode of 3 calls of up to max_tokens each: N_e > max_tokens, yet its weights stay below 1
    eps = [result(f"e{i}", "multi", float(i),
                  [call(f"e{i}", list(range(200 + 60 * k, 260 + 60 * k)), -1.0, index=k,
                        prompt=PROMPT + list(range(200, 200 + 60 * k))) for k in range(3)]) for i in range(2)]
    packs = pack_groups(make_groups(eps), loss_norm="constant", norm_constant=args.norm_constant)
    total = sum(float(p.pair_weight.sum()) for p in packs)
    assert total == pytest.approx(180 / 4096, rel=1e-5) and total <= 1.0
    sums = minibatch_weight_sums(monkeypatch, packs, dataclasses.replace(args, max_grad_norm=1e9))
    assert sums == pytest.approx([180 / 4096], rel=1e-5)


# --------------------------------------------------------------------------------------------------- point 7

def test_point7_shared_tokens_keep_each_episodes_behaviour_logprob(monkeypatch):
    # a0 (version 0, logprob -1.0) and a1 (version 1, logprob -2.0) sampled the same first three tokens
    a0 = result("a0", "task", 1.0, [call("a0", [10, 11, 12, 13], -1.0, version=0)])
    a1 = result("a1", "task", 0.0, [call("a1", [10, 11, 12, 14], -2.0, version=1)])
    group, = make_groups([a0, a1])
    pack, = pack_groups([group])
    tokens, counts = torch.unique(pack.pair_token, return_counts=True)
    assert int((counts == 2).sum()) == 3  # the shared node: one token, two pairs
    behaviour = {"a0": -1.0, "a1": -2.0}
    own = torch.tensor([behaviour[pack.episodes[int(e)].episode_id] for e in pack.pair_episode])
    assert torch.equal(pack.pair_logprobs(), own)  # each pair carries its own episode's sampler's logprob
    assert int((~torch.isnan(pack.pair_own_logprob)).sum()) == 3  # only where it differs from the first sampler
    versions = {v for (_, _, e), (_, v) in group.behaviour.items() if e == 1}
    assert versions == {1}  # and its policy version

    # the update's importance weights: min(exp(logp_old - behaviour of the pair's episode), is_clip)
    monkeypatch.setattr(update, "fsdp_forward", fixed_forward(-1.5))
    args = Args(is_clip=2.0, max_grad_norm=1e9)
    probe = torch.zeros((), requires_grad=True)
    stats = update.grpo_update(probe_policy(probe), StepRecorder(probe), [pack], args)
    is_w = torch.exp(-1.5 - own).clamp(max=args.is_clip)
    expected = -float((pack.pair_weight * is_w * pack.pair_adv).sum())
    assert stats["pg_loss"] == pytest.approx(expected, rel=1e-5)
    first_sampler_only = -float((pack.pair_weight * math.exp(-0.5) * pack.pair_adv).sum())
    assert abs(expected - first_sampler_only) > 0.1  # what the first sampler's logprob alone would give


# -------------------------------------------------------------------------------------------------- point 10

def fake_suite(n: int) -> list:
    return [types.SimpleNamespace(id=f"t{i}", suite="unit") for i in range(n)]


class FakeRollouts:
    """``run(jobs)``: ``group_size`` episodes per job. The first call of each step (its first draw) gets constant
    rewards (every group skipped, so refills run); later calls (refills, regenerations) varied ones."""

    def __init__(self, group_size: int = 2) -> None:
        self.group_size, self.calls, self.version, self.fresh = group_size, 0, 0, True

    def __call__(self, jobs):
        self.calls += 1
        constant, self.fresh = self.fresh, False
        out = []
        for task, harness in jobs:
            for e in range(self.group_size):
                eid = f"c{self.calls}-{task.id}-{harness}-{e}"
                out.append(result(eid, task.id, 0.0 if constant else float(e % 2),
                                  [call(eid, [40 + e, 41], -1.0, version=self.version)], harness=harness))
        return out


def test_point10_refill_never_redraws_a_task_of_the_same_step():
    tasks = fake_suite(8)
    args = Args(groups_per_step=4, refill_groups=4, group_size=2, harnesses={"mini": 1.0, "claude-code": 1.0})
    for step in range(1, 41):
        run = FakeRollouts()
        _, groups, stats = collect_groups(args, tasks, step, run)
        keys = [g.key for g in groups]
        assert len(keys) == len(set(keys)) == 8, (step, keys)  # 4 drawn, 4 refilled: 8 distinct groups
        assert stats == {"refill_groups": 4, "refill_rounds": 1}


def test_point10_async_regenerate_never_leaves_a_duplicate_key_all_stale():
    tasks = fake_suite(8)
    args = Args(groups_per_step=4, refill_groups=4, group_size=2)
    run = FakeRollouts()

    def collect(step):
        run.fresh, run.version = True, 0
        return StepBatch(step, *collect_groups(args, tasks, step, run))

    def rerun(keys):
        run.version = 5
        return run(jobs_for(keys, tasks))

    ahead = RolloutAhead(collect, AsyncConfig(max_staleness=1, stale="regenerate", queue_steps=0), start=1, stop=30,
                         rerun=rerun)
    for step in range(1, 31):
        batch = ahead.get(step, 5)  # every episode sampled at version 0: all stale, every group regenerated
        assert [g.skipped for g in batch.groups if g.skipped == "all_stale"] == [], step


def test_point10_a_suite_too_small_for_the_refill_says_so(caplog):
    tasks = fake_suite(5)
    args = Args(groups_per_step=4, refill_groups=4, group_size=2)
    with caplog.at_level(logging.WARNING, logger="trainers.rollouts.draw"):
        _, groups, stats = collect_groups(args, tasks, 3, FakeRollouts())
    keys = [g.key for g in groups]
    assert len(keys) == len(set(keys)) == 5  # every task once; the refill got the one task left
    assert stats == {"refill_groups": 1, "refill_rounds": 1}
    assert any("undrawn" in r.getMessage() and "5 tasks" in r.getMessage() for r in caplog.records)
    # nothing left at all: no empty rounds are run
    _, groups, stats = collect_groups(Args(groups_per_step=5, refill_groups=4, group_size=2), tasks, 3,
                                      FakeRollouts())
    assert len(groups) == 5 and stats == {"refill_groups": 0, "refill_rounds": 0}


# -------------------------------------------------------------------------------------------------- point 11

def test_point11_synced_sampling_check_is_unchecked_without_a_comparable_step():
    from trainers.rollouts.synced_check import check_synced_sampling

    tol = 1e-6
    # step 1 sampled the start weights (v0) and trained; step 2's groups all had constant rewards (no update,
    # no kl_rollout): nothing sampled after a sync was ever compared
    vacuous = [{"step": 1, "version": 1, "updates": 1, "kl_rollout": 1e-12},
               {"step": 2, "version": 1, "updates": None, "kl_rollout": None}]
    check = check_synced_sampling(vacuous, tol=tol)
    assert check.status == "unchecked" and check.compared == [] and "unchecked" in check.describe()
    with pytest.raises(AssertionError, match="unchecked"):
        check.require()
    check.require(allow_unchecked=True)  # a caller may accept it, but must say so
    assert check_synced_sampling([], tol=tol).status == "unchecked"

    # step 2 trained on rollouts sampled at v1 (after the first sync): compared, and close
    good = [{"step": 1, "version": 1, "updates": 1, "kl_rollout": 1e-12},
            {"step": 2, "version": 2, "updates": 1, "kl_rollout": 2e-12}]
    check = check_synced_sampling(good, tol=tol)
    assert check.status == "ok" and check.compared == [2]
    check.require()

    # a stale engine leaves the update's change in the rollout KL
    stale = [{"step": 1, "version": 1, "updates": 1, "kl_rollout": 1e-12},
             {"step": 2, "version": 2, "updates": 1, "kl_rollout": 3e-3}]
    check = check_synced_sampling(stale, tol=tol)
    assert check.status == "stale" and check.stale == [2]
    with pytest.raises(AssertionError, match="stale"):
        check.require(allow_unchecked=True)

    # a resumed run: step 3 follows step 2's version (rows appended to one metrics file)
    resumed = vacuous + [{"step": 3, "version": 2, "updates": 1, "kl_rollout": 1e-12}]
    assert check_synced_sampling(resumed, tol=tol).compared == [3]
