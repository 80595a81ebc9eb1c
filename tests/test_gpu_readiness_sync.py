"""A weight sync does not charge the agent (issue 24, point 8): design (A), the time an episode's calls are held
back while the serving weights change is not counted against the harness's wall-clock limit.

Real episodes (the mini harness in bubblewrap, the scripted expert behind a
:class:`~clawgym_env.policy.replicas.ReplicaPolicy` and its :class:`~clawgym_env.policy.replicas.VersionGate`):
a test "sync" holds the gate for longer than the episode's whole limit and the episode still ends ``ok`` with
the wait recorded; the same episode with a slow agent (its model answering slower than the limit) and no sync
ends ``timeout``; a sync does not excuse an agent that is slow besides. Unit tests pin the accounting (the union
of an episode's held intervals, an open wait counted up to now) and the deadlines built from it.
"""

from __future__ import annotations

import json
import math
import threading
import time

import pytest

from clawgym_env.envs.runtime import Runtime
from clawgym_env.plugins import make_harness
from clawgym_env.policy import make_policy
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams
from clawgym_env.policy.replicas import ReplicaPolicy, VersionGate
from clawgym_env.policy.sync_wait import SyncWaits, sync_waits_of
from clawgym_env.sandbox.deadline import MIN_POLL_S, AgentTimeout, Deadline
from clawgym_env.testing import SlowPolicy

LIMIT_S = 12.0
"""The episodes' wall-clock limit: room for mini to start and finish a task on a loaded machine."""
HOLD_S = LIMIT_S + 4.0
"""How long the test sync holds the gate: longer than the episode's whole limit."""


class _Clock:
    """A settable monotonic clock for the ledger."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the accounting -------------------------------------------------------------------------------------------
def test_an_episodes_wait_is_the_union_of_its_held_intervals():
    clock = _Clock()
    waits = SyncWaits(clock=clock)
    waits.begin("a")                      # t=100: a's first call held
    clock.now = 102.0
    waits.begin("a")                      # a second call of a held at the same time: no extra credit
    waits.begin("b")                      # b held from 102
    clock.now = 105.0
    assert waits.waited_s("a") == pytest.approx(5.0)        # an open wait counts up to now
    assert waits.waited_s("a", now=104.0) == pytest.approx(4.0)
    assert waits.holding("a") and waits.holding("b")
    waits.end("a")
    clock.now = 106.0
    waits.end("a")                        # a's calls all admitted at 106: 6 s, not 6 + 4
    waits.end("b")
    assert waits.waited_s("a") == pytest.approx(6.0)
    assert waits.waited_s("b") == pytest.approx(4.0)
    assert not waits.holding("a")
    clock.now = 200.0                     # time passing while nothing is held adds nothing
    assert waits.waited_s("a") == pytest.approx(6.0)
    with waits.waiting("a"):              # a second sync later: closed intervals add up
        clock.now = 203.5
    assert waits.waited_s("a") == pytest.approx(9.5)
    waits.end("a")                        # an end without a begin (or after forget) changes nothing
    waits.begin("")                       # a call without an episode id is nobody's
    clock.now = 300.0
    assert waits.waited_s("a") == pytest.approx(9.5) and waits.waited_s("") == 0.0
    waits.forget("a")
    assert waits.waited_s("a") == 0.0 and waits.waited_s("nobody") == 0.0
    assert len(waits) == 1                # b only


def test_the_ledger_stays_bounded():
    waits = SyncWaits(max_episodes=3, clock=_Clock())
    for i in range(5):
        waits.begin(f"e{i}")
        waits.end(f"e{i}")
    assert len(waits) == 3 and waits.waited_s("e0") == 0.0


def test_the_gate_notes_only_calls_held_back_by_a_writer():
    gate = VersionGate()
    with gate.read("free") as v:          # no writer: admitted at once, nothing noted
        assert v == 0
    assert gate.waits.waited_s("free") == 0.0 and len(gate.waits) == 0
    writing = threading.Event()
    release = threading.Event()

    def sync() -> None:
        with gate.write():
            writing.set()
            release.wait(10)
            gate.version = 1

    writer = threading.Thread(target=sync)
    writer.start()
    assert writing.wait(10) and gate.closed
    got: list[int] = []

    def call() -> None:
        with gate.read("held") as version:
            got.append(version)

    reader = threading.Thread(target=call)
    reader.start()
    deadline = time.monotonic() + 10
    while not gate.waits.holding("held") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gate.waits.holding("held")
    time.sleep(0.3)
    release.set()
    writer.join(10)
    reader.join(10)
    assert got == [1]                     # admitted on the new version, after the writer
    assert 0.3 <= gate.waits.waited_s("held") < 5.0
    assert not gate.closed and gate.readers == 0


def test_an_agent_timeout_moves_by_the_excused_time_and_nothing_else():
    excused = [0.0]
    t0 = time.monotonic()
    fixed = Deadline.of(5.0, t0)
    moving = Deadline.of(AgentTimeout(5.0, lambda: excused[0]), t0)
    assert fixed is not None and moving is not None and Deadline.of(None, t0) is None
    assert float(AgentTimeout(5.0, lambda: 0.0)) == 5.0        # a backend that knows nothing of it: 5 s
    assert not fixed.extendable and moving.extendable
    assert fixed.at() == moving.at() == pytest.approx(t0 + 5.0)
    excused[0] = 7.5
    assert moving.at() == pytest.approx(t0 + 12.5) and fixed.at() == pytest.approx(t0 + 5.0)
    for bad in (-3.0, math.nan, math.inf):                     # a broken source grants nothing
        excused[0] = bad
        assert moving.at() == pytest.approx(t0 + 5.0)
    boom = Deadline.of(AgentTimeout(5.0, lambda: 1 / 0), t0)
    assert boom is not None and boom.at() == pytest.approx(t0 + 5.0)
    past = Deadline(time.monotonic() - 10, 1.0, lambda: 0.0)
    assert past.expired() and past.poll_s() == 0.0
    soon = Deadline(time.monotonic(), 0.001, lambda: 0.0)      # an extendable deadline is polled, not spun on
    assert soon.poll_s() in (0.0, MIN_POLL_S)
    with pytest.raises(ValueError, match="seconds > 0"):
        AgentTimeout(0, lambda: 0.0)


@pytest.mark.parametrize("backend", [pytest.param("bwrap", id="bwrap"),
                                     pytest.param("docker", id="docker", marks=pytest.mark.docker)])
def test_an_exec_outlives_its_limit_only_by_the_excused_time(tmp_path, backend):
    from clawgym_env.sandbox import SandboxSpec, get_backend

    ws = tmp_path / "ws"
    ws.mkdir()
    excused = [0.0]
    with get_backend(backend)(SandboxSpec(workspace_host=ws, workspace_target="/work")) as sb:
        plain = sb.exec(["sleep", "3"], timeout=1.0)
        grown = threading.Timer(0.5, lambda: excused.__setitem__(0, 4.0))
        grown.start()
        extended = sb.exec(["sleep", "3"], timeout=AgentTimeout(1.0, lambda: excused[0]))
        short = sb.exec(["sleep", "30"], timeout=AgentTimeout(1.0, lambda: 2.0))
    assert plain.timed_out and plain.wall_s < 2.5
    assert not extended.timed_out and extended.returncode == 0 and extended.wall_s >= 3.0
    assert short.timed_out and 3.0 <= short.wall_s < 10.0      # 1 s of its own + 2 s excused, not 30


# -- real episodes --------------------------------------------------------------------------------------------
class SyncOnCall(PolicyBackend):
    """``inner``, which on its ``call``-th call starts a weight sync of ``serving`` that holds the gate for
    ``hold_s`` (a reload as long as that), and answers only once the sync waits at the gate, so the episode's
    next call is certainly held back."""

    def __init__(self, inner: PolicyBackend, *, call: int, hold_s: float) -> None:
        self.inner, self.call, self.hold_s = inner, call, hold_s
        self.name = inner.name
        self.serving: ReplicaPolicy | None = None
        self.syncs: list[threading.Thread] = []
        self._calls = 0
        self._lock = threading.Lock()

    @property
    def tokenizer(self):  # noqa: D102
        return self.inner.tokenizer

    def _reload(self) -> str:
        time.sleep(self.hold_s)
        return "test-reload"

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        gen = self.inner.generate(prompt_ids, params, ctx)
        with self._lock:
            n, self._calls = self._calls, self._calls + 1
        if n == self.call and self.serving is not None:
            serving = self.serving
            sync = threading.Thread(target=serving.update_weights, args=(self._reload,), daemon=True)
            sync.start()
            self.syncs.append(sync)
            deadline = time.monotonic() + 10
            while not serving.gate.closed and time.monotonic() < deadline:
                time.sleep(0.005)
            assert serving.gate.closed, "the test sync never reached the gate"
        return gen

    def close(self) -> None:  # noqa: D102
        self.inner.close()


def _task(builtin_suite):
    for t in builtin_suite.tasks:  # a task the expert solves in >= 2 tool steps: >= 3 calls
        if sum("tool" in s for s in json.loads(t.expert_path.read_text())["steps"]) >= 2:
            task = t.model_copy(deep=True)
            task.limits.timeout_s = LIMIT_S
            return task
    raise AssertionError("the builtin suite needs a multi-step task")


def _episode(replica: PolicyBackend, task, out):
    serving = ReplicaPolicy([replica], name="gated-expert")
    if isinstance(replica, SyncOnCall):
        replica.serving = serving
    assert sync_waits_of(serving) is serving.sync_waits
    try:
        with Runtime(serving, out_dir=out) as rt:
            res = rt.run(task, make_harness("mini"))
    finally:
        serving.close()
    assert len(serving.sync_waits) == 0, "the runner forgets its episode's account when done"
    return res, serving


def test_an_episode_whose_only_overrun_is_a_weight_sync_ends_ok(builtin_suite, tmp_path):
    task = _task(builtin_suite)
    replica = SyncOnCall(make_policy("scripted:expert"), call=0, hold_s=HOLD_S)
    res, serving = _episode(replica, task, tmp_path / "eps")
    rec = res.record
    for sync in replica.syncs:
        sync.join(HOLD_S + 30)
    assert (rec.status, rec.reward) == ("ok", 1.0), (rec.status, rec.error, rec.logs)
    assert rec.wall_s > LIMIT_S, "the episode ran past its limit, all of it waiting for the new weights"
    assert HOLD_S - 2.0 <= rec.sync_wait_s <= rec.wall_s, rec.sync_wait_s
    assert rec.timings["harness_s"] - rec.sync_wait_s < LIMIT_S  # the agent's own time stayed within the limit
    assert serving.version == 1 and serving.last_sync is not None and serving.last_sync["version"] == 1
    assert [c.policy_version for c in res.calls][0] == 0 and res.calls[-1].policy_version == 1
    on_disk = json.loads((tmp_path / "eps" / rec.episode_id / "episode.json").read_text())
    assert on_disk["sync_wait_s"] == pytest.approx(rec.sync_wait_s)


def test_the_same_episode_with_a_slow_agent_and_no_sync_times_out(builtin_suite, tmp_path):
    task = _task(builtin_suite)
    slow = SlowPolicy(make_policy("scripted:expert"), delay_s=HOLD_S, calls={1})   # its model, slower than the limit
    res, serving = _episode(slow, task, tmp_path / "eps")
    rec = res.record
    assert (rec.status, rec.failure_boundary) == ("timeout", "harness"), (rec.status, rec.error)
    assert rec.sync_wait_s == 0.0 and serving.version == 0 and rec.is_task_outcome
    assert LIMIT_S <= rec.wall_s < HOLD_S + 10.0


def test_a_sync_does_not_excuse_an_agent_that_is_slow_besides(builtin_suite, tmp_path):
    task = _task(builtin_suite)
    hold = 3.0
    slow = SlowPolicy(SyncOnCall(make_policy("scripted:expert"), call=0, hold_s=hold), delay_s=LIMIT_S + 2, calls={1})
    serving = ReplicaPolicy([slow], name="gated-expert")
    slow.inner.serving = serving  # type: ignore[attr-defined]
    try:
        with Runtime(serving, out_dir=tmp_path / "eps") as rt:
            rec = rt.run(task, make_harness("mini")).record
    finally:
        serving.close()
    assert (rec.status, rec.failure_boundary) == ("timeout", "harness"), (rec.status, rec.error)
    assert hold - 1.0 <= rec.sync_wait_s <= hold + 1.0          # recorded, and only the hold
    assert rec.wall_s >= LIMIT_S + rec.sync_wait_s - 0.5        # killed at its limit plus the hold, no later


def test_sync_wait_s_is_a_record_field_a_policy_without_a_gate_leaves_at_zero(expert_runtime, builtin_suite):
    rec = expert_runtime.run(_task(builtin_suite), make_harness("mini")).record
    assert rec.status == "ok" and rec.sync_wait_s == 0.0
    assert sync_waits_of(expert_runtime.policy) is None
