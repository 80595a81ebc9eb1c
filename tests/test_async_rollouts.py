"""Async, off-policy rollouts (:mod:`trainers.rollouts.ahead`).

Fakes: ``collect`` functions that build real ``EpisodeResult`` / ``CallRecord`` objects whose calls carry the
version a fake serving side held when each was "sampled", and a fake trainer that bumps and pushes versions.
The last test runs real episodes through the ``mini`` harness against a tiny Qwen3 served in-process, with
real weight pushes (``InProcessSync``) landing while the next step's episodes are in flight.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import traceback
from pathlib import Path

import pytest

from clawgym_env.capture.records import CallRecord, EpisodeRecord, EpisodeStatus
from clawgym_env.episodes.run import EpisodeResult
from clawgym_env.errors import ConfigError, PolicyError
from trainers.batch.tree_batch import make_groups
from trainers.rollouts.ahead import AsyncConfig, RolloutAhead, StepBatch, _Intervals, episode_staleness, jobs_for


def episode(eid: str, task: str, reward: float, versions: list[int], status: EpisodeStatus = "ok") -> EpisodeResult:
    """An episode of ``len(versions)`` chained calls, call ``i`` sampled at ``versions[i]``."""
    base = [7, 11 + sum(map(ord, task)) % 50]
    rec = EpisodeRecord(episode_id=eid, task_id=task, suite="unit", harness="mini", policy="fake", status=status,
                        reward=reward, num_calls=len(versions))
    calls, prompt = [], list(base)
    for i, v in enumerate(versions):
        out = [1000 + (sum(map(ord, eid)) * 7 + i) % 500, 2000 + i]
        calls.append(CallRecord(episode_id=eid, call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                                stream=False, request={}, prompt_token_ids=list(prompt), output_token_ids=out,
                                output_logprobs=[-0.5, -0.25], finish_reason="stop", policy_version=v))
        prompt = prompt + out + [3, 4]
    return EpisodeResult(record=rec, calls=calls)


def batch_of(step: int, results: list[EpisodeResult]) -> StepBatch:
    return StepBatch(step=step, results=results, groups=make_groups(results))


class FakeWorld:
    """A serving version and a collector whose calls record it at their sampling time."""

    def __init__(self, groups: int = 2, size: int = 3, calls: int = 2, call_s: float = 0.0) -> None:
        self.version = 0
        self.groups, self.size, self.calls, self.call_s = groups, size, calls, call_s
        self.log: list[tuple[str, int, str]] = []  # (event, step, thread name)
        self.started = {s: threading.Event() for s in range(1, 50)}
        self._lock = threading.Lock()

    def collect(self, step: int) -> StepBatch:
        self.log.append(("collect", step, threading.current_thread().name))
        self.started[step].set()
        results = []
        for g in range(self.groups):
            for e in range(self.size):
                versions = []
                for _ in range(self.calls):
                    with self._lock:
                        versions.append(self.version)
                    time.sleep(self.call_s)
                results.append(episode(f"s{step}g{g}e{e}", f"task{g}", float((e + step) % 2), versions))
        return batch_of(step, results)


def run_trainer(ahead: RolloutAhead, world: FakeWorld, steps: int, *, wait_for_next: bool) -> list[StepBatch]:
    """The trainer's loop: get, (wait until the next step's rollouts began), push version + 1."""
    out, version = [], 0
    for step in range(1, steps + 1):
        world.log.append(("get", step, threading.current_thread().name))
        batch = ahead.get(step, version)
        out.append(batch)
        if wait_for_next and step < steps:
            assert world.started[step + 1].wait(10), "the producer did not start the next step while training"
        version += 1
        with world._lock:
            world.version = version
    return out


def test_synchronous_mode_collects_inline_in_order_without_a_thread():
    world = FakeWorld()
    before = threading.active_count()
    with RolloutAhead(world.collect, AsyncConfig(), start=1, stop=3) as ahead:
        batches = run_trainer(ahead, world, 3, wait_for_next=False)
        assert ahead._thread is None and threading.active_count() == before
    me = threading.current_thread().name
    assert world.log == [(ev, s, me) for s in (1, 2, 3) for ev in ("get", "collect")]
    for b in batches:  # everything on-policy: nothing dropped, the groups are the collected ones
        assert b.metrics is not None and b.metrics.dropped == 0 and b.metrics.lag_counts == [12]
        assert b.metrics.staleness_mean == 0.0 and b.metrics.row(0)["staleness_lag_over"] == 0


@pytest.mark.parametrize("staleness", [1, 2])
def test_the_bound_is_never_exceeded_while_rollouts_run_ahead(staleness):
    world = FakeWorld(calls=3, call_s=0.002)
    cfg = AsyncConfig(max_staleness=staleness)
    with RolloutAhead(world.collect, cfg, start=1, stop=6) as ahead:
        batches = run_trainer(ahead, world, 6, wait_for_next=True)
    collects = [s for ev, s, _ in world.log if ev == "collect"]
    assert collects == [1, 2, 3, 4, 5, 6] and {t for ev, _, t in world.log if ev == "collect"} == {"rollouts-ahead"}
    order = [(ev, s) for ev, s, _ in world.log]
    assert order.index(("collect", 2)) < order.index(("get", 2)), "step 2 was not collected ahead"
    lags_seen = set()
    for version, b in enumerate(batches):
        assert b.metrics is not None and b.metrics.dropped == 0
        for g in b.groups:
            for _, calls in g.episodes:
                assert episode_staleness(calls, version) <= staleness
                lags_seen |= {version - c.policy_version for c in calls}
        n_calls = sum(len(r.calls) for r in b.results)
        assert sum(b.metrics.lag_counts) == n_calls
        row = b.metrics.row(staleness)
        assert sum(row[f"staleness_lag_{i}"] for i in range(staleness + 1)) == n_calls  # type: ignore[misc]
    assert max(lags_seen) >= 1, "no call was ever sampled by an older version: nothing overlapped"


def test_stale_episodes_are_dropped_and_their_group_rebuilt_among_survivors():
    a = [episode("a0", "alpha", 1.0, [5, 5]), episode("a1", "alpha", 0.0, [3, 5]),  # a1 spans an update: its
         episode("a2", "alpha", 0.0, [5]), episode("a3", "alpha", 1.0, [4, 5])]      # oldest call decides
    b = [episode("b0", "beta", 1.0, [2]), episode("b1", "beta", 0.0, [2, 3])]
    c = [episode("c0", "gamma", 1.0, [4]), episode("c1", "gamma", 0.0, [5])]
    infra = [episode("a4", "alpha", 0.0, [1], status="infra_error")]
    collected = batch_of(1, a + b + c + infra)
    untouched = collected.groups[2]
    ahead = RolloutAhead(lambda step: collected, AsyncConfig(max_staleness=1, queue_steps=0), start=1, stop=1)
    got = ahead.get(1, 5)
    m = got.metrics
    assert m is not None and m.dropped == 3 and m.regenerated_groups == 0  # a1 (lag 2), b0, b1 (lag 3)
    assert m.lag_counts == [6, 2, 2, 2, 1]  # every call collected, before the bound (the infra one has lag 4)
    assert m.row(1) == pytest.approx({**m.row(1), "staleness_lag_0": 6, "staleness_lag_1": 2,
                                      "staleness_lag_over": 5, "stale_dropped": 3})
    ga, gb, gc = got.groups
    assert [rec.episode_id for rec, _ in ga.episodes] == ["a0", "a2", "a3"] and ga.infra_excluded == 1
    want = make_groups([r for r in a if r.record.episode_id != "a1"])[0]
    assert ga.advantages == pytest.approx(want.advantages) and ga.rewards == [1.0, 0.0, 1.0]
    assert gb.skipped == "all_stale" and gb.episodes == [] and gb.key == ("unit", "beta", "mini")
    assert gc is untouched
    assert m.staleness_max == 1 and m.staleness_mean == pytest.approx(2 / 7)  # kept calls: lags 0,0,0,1,0,1,0
    assert {r.record.episode_id for r in got.results} == {"a0", "a2", "a3", "c0", "c1", "a4"}


def test_stale_groups_are_regenerated_at_the_current_version_and_counted():
    tasks = [type("T", (), {"id": "alpha", "suite": "unit"})(), type("T", (), {"id": "beta", "suite": "unit"})()]
    a = [episode("a0", "alpha", 1.0, [5]), episode("a1", "alpha", 0.0, [3, 5])]
    b = [episode("b0", "beta", 1.0, [5]), episode("b1", "beta", 0.0, [5])]
    asked = []

    def rerun(keys):
        asked.append(list(keys))
        (task, harness), = jobs_for(keys, tasks)
        assert task is tasks[0] and harness == "mini"
        return [episode("r0", "alpha", 0.0, [5]), episode("r1", "alpha", 1.0, [5, 5]),
                episode("r2", "alpha", 1.0, [2])]  # a straggler from an old engine: still stale, dropped

    ahead = RolloutAhead(lambda step: batch_of(step, a + b), AsyncConfig(max_staleness=1, stale="regenerate"),
                         start=1, stop=1, rerun=rerun)
    with ahead:
        got = ahead.get(1, 5)
    assert asked == [[("unit", "alpha", "mini")]]
    m = got.metrics
    assert m is not None and (m.regenerated_groups, m.regenerated_episodes, m.dropped) == (1, 3, 1)
    ga = got.groups[0]
    assert [rec.episode_id for rec, _ in ga.episodes] == ["r0", "r1"]
    assert ga.advantages == pytest.approx([-1, 1], abs=1e-4)
    assert got.groups[1].skipped is None and len(got.groups[1].episodes) == 2
    assert sorted(r.record.episode_id for r in got.results) == ["b0", "b1", "r0", "r1"]
    # without groups (PPO trains on the results): the bound applies to the results alone
    ungrouped = RolloutAhead(lambda step: StepBatch(step, a + b, []), AsyncConfig(max_staleness=1, stale="regenerate",
                             queue_steps=0), start=1, stop=1, rerun=rerun).get(1, 5)
    assert sorted(r.record.episode_id for r in ungrouped.results) == ["b0", "b1", "r0", "r1"]
    assert ungrouped.groups == [] and ungrouped.metrics is not None and ungrouped.metrics.regenerated_groups == 1
    with pytest.raises(PolicyError, match="not in the train suite"):
        jobs_for([("unit", "zeta", "mini")], tasks)


def test_config_is_checked():
    with pytest.raises(ConfigError, match="stale"):
        AsyncConfig(max_staleness=1, stale="keep")
    with pytest.raises(ConfigError, match="queue_steps"):
        AsyncConfig(max_staleness=1, queue_steps=2)
    with pytest.raises(ConfigError, match="rerun"):
        RolloutAhead(lambda s: batch_of(s, []), AsyncConfig(max_staleness=1, stale="regenerate"), start=1, stop=2)
    with RolloutAhead(lambda s: batch_of(s, []), AsyncConfig(), start=1, stop=2) as ahead:
        with pytest.raises(PolicyError, match="out of order"):
            ahead.get(2, 0)


def test_a_producer_exception_surfaces_in_get_with_its_traceback():
    def collect(step: int) -> StepBatch:
        if step == 2:
            explode_in_the_producer()
        return batch_of(step, [episode(f"e{step}", "alpha", 1.0, [0])])

    def explode_in_the_producer():
        raise ValueError("sandbox pool is gone")

    with RolloutAhead(collect, AsyncConfig(max_staleness=1), start=1, stop=3) as ahead:
        assert ahead.get(1, 0).step == 1
        with pytest.raises(ValueError, match="sandbox pool is gone") as info:
            ahead.get(2, 1)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "explode_in_the_producer" in frames and "collect" in frames


def test_close_mid_collection_returns_promptly_and_wakes_a_waiting_get():
    entered, release = threading.Event(), threading.Event()

    def collect(step: int) -> StepBatch:
        entered.set()
        release.wait(60)  # an episode that will not end soon
        return batch_of(step, [])

    ahead = RolloutAhead(collect, AsyncConfig(max_staleness=2, close_timeout_s=0.2), start=1, stop=5).begin()
    assert entered.wait(10)
    errors: list[BaseException] = []

    def trainer():
        try:
            ahead.get(1, 0)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    waiting = threading.Thread(target=trainer)
    waiting.start()
    t0 = time.monotonic()
    ahead.close()
    waiting.join(10)
    assert time.monotonic() - t0 < 10, "close() waited for the collection"  # a hang check, not a speed one
    assert not waiting.is_alive() and len(errors) == 1 and isinstance(errors[0], PolicyError)
    with pytest.raises(PolicyError, match="closed"):
        ahead.get(2, 0)
    release.set()


def test_utilisation_is_measured_between_gets():
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731

    def collect(step: int) -> StepBatch:
        now[0] += 3.0  # three seconds of rollouts
        return batch_of(step, [])

    ahead = RolloutAhead(collect, AsyncConfig(), start=1, stop=3, clock=clock).begin()
    first = ahead.get(1, 0).metrics
    now[0] += 1.0  # one second of training
    second = ahead.get(2, 1).metrics
    assert first is not None and (first.rollout_util, first.train_util, first.wait_s) == (1.0, 0.0, 3.0)
    assert second is not None and (second.rollout_util, second.train_util) == (0.75, 0.25)

    spans = _Intervals(clock)
    now[0] = 10.0
    t1 = spans.begin()
    now[0] = 12.0
    t2 = spans.begin()
    now[0] = 13.0
    spans.end(t1)
    now[0] = 15.0
    spans.end(t2)
    now[0] = 20.0
    spans.begin()  # still open
    assert spans.busy(11.0, 22.0) == pytest.approx(4.0 + 2.0)  # overlapping [11,13] ∪ [12,15], then [20,22]
    assert spans.busy(0.0, 9.0) == 0.0


REWARD_SH = """#!/usr/bin/env bash
set -euo pipefail
python3 -c 'import json, os
p = json.load(open(os.environ["OPENCLAW_REWARD_PAYLOAD"]))
print(1.0 if len(p.get("final_message") or "") % 2 == 0 else 0.0)'
"""


def parity_task(root: Path):
    """One task whose verifier scores the parity of the answer's length (a random policy gets mixed rewards)."""
    from tasks import load_suite

    d = root / "parity" / "parity_0"
    (d / "reward").mkdir(parents=True)
    (d / "data_entry.json").write_text(json.dumps({
        "task_id": "parity_0", "user_query": "Say something.", "input_mount_dir": "/root/.openclaw/workspace",
        "metadata": {"grading_type": "automated"},
        "limits": {"timeout_s": 60, "max_turns": 2, "reward_timeout_s": 30}}))
    (d / "reward" / "reward.sh").write_text(REWARD_SH)
    return list(load_suite(str(root / "parity")).tasks)[0]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/install.sh)")
def test_real_mini_rollouts_record_the_version_that_sampled_every_call(tmp_path, tokenizer):
    """Step k+1's episodes run through the mini harness while the trainer pushes new weights (InProcessSync)."""
    torch = pytest.importorskip("torch")
    from clawgym_env.envs.runtime import Runtime
    from trainers.policy import PolicyConfig, TrainablePolicy
    from trainers.rollouts.sync import run_jobs
    from trainers.scale.weight_sync import InProcessSync

    task = parity_task(tmp_path)
    policy = TrainablePolicy(PolicyConfig(model="tiny", seed=1), tokenizer=tokenizer)
    sync = InProcessSync.for_policy(policy)
    version = sync.push(policy, 1)  # start at 1: a generation reporting version 0 is read as "unknown"
    serving, generate = sync.serving, sync.serving.generate
    sampled: dict[tuple[int, ...], int] = {}
    collecting = [0]
    first_call = {s: threading.Event() for s in range(1, 5)}

    def spy(prompt_ids, params, ctx):
        gen = generate(prompt_ids, params, ctx)
        sampled[tuple(prompt_ids) + tuple(gen.token_ids)] = gen.policy_version
        first_call[collecting[0]].set()
        return gen

    serving.generate = spy
    with Runtime(serving, sandbox="bwrap", out_dir=tmp_path / "episodes") as rt:
        def collect(step: int) -> StepBatch:
            collecting[0] = step
            results = run_jobs(rt, [(task, "mini")], group_size=3, concurrency=1, policy_version=None,
                               sampling={"temperature": 1.0, "max_tokens": 8})
            return batch_of(step, results)

        with RolloutAhead(collect, AsyncConfig(max_staleness=1), start=1, stop=3) as ahead:
            batches = []
            for step in range(1, 4):
                batches.append(ahead.get(step, version))
                if step < 3:  # a call of the next step was sampled: its later episodes are still to come
                    assert first_call[step + 1].wait(60)
                    with torch.no_grad():
                        for p in policy.trainable_parameters():
                            p.add_(0.01)
                    version = sync.push(policy, version + 1)
    mixed = False
    for trained_at, b in enumerate(batches, start=1):
        calls = [c for r in b.results for c in r.calls]
        assert calls and all(r.record.status != "infra_error" for r in b.results), [r.record for r in b.results]
        for c in calls:
            assert c.policy_version == sampled[tuple(c.prompt_token_ids) + tuple(c.output_token_ids)]
            assert trained_at - c.policy_version <= 1
        mixed |= len({c.policy_version for c in calls}) > 1
        assert b.metrics is not None and sum(b.metrics.lag_counts) == len(calls) and b.metrics.dropped == 0
    assert mixed, "no step had episodes sampled on both sides of a weight push"
