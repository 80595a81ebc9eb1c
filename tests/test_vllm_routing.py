"""Routing over vLLM replicas and the version gate, without a server (fake replicas, a fake metrics page).

Episode-sticky routing and balance, the readers-writer gate that keeps each call's recorded version
exact while weights change, and the prefix-cache counters read from a Prometheus page. The same
classes against a real vLLM server: tests/test_vllm_train.py.
"""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from clawgym_env.errors import PolicyError
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams
from clawgym_env.policy.replicas import (
    HITS_METRIC,
    QUERIES_METRIC,
    ReplicaPolicy,
    VersionGate,
    parse_prometheus,
)
from clawgym_env.policy.vllm.server import free_port

# -- fake replicas ------------------------------------------------------------------------------------


class Engine:
    """A stand-in engine: its ``weights`` version, and how many calls run on it right now."""

    def __init__(self) -> None:
        self.weights = 0
        self.active = 0
        self.lock = threading.Lock()
        self.hold: dict[str, threading.Event] = {}


class FakeReplica(PolicyBackend):
    """Answers ``[weights at start, weights at end, replica index]``; blocks on ``engine.hold[episode]``."""

    def __init__(self, idx: int, engine: Engine, delay: float = 0.0) -> None:
        self.idx, self.engine, self.delay = idx, engine, delay
        self.episodes: list[str] = []

    @property
    def tokenizer(self):
        return None

    def generate(self, prompt_ids, params, ctx):
        with self.engine.lock:
            self.engine.active += 1
            start = self.engine.weights
        self.episodes.append(ctx.episode_id)
        hold = self.engine.hold.get(ctx.episode_id)
        if hold is not None:
            assert hold.wait(10)
        time.sleep(self.delay)
        with self.engine.lock:
            self.engine.active -= 1
            end = self.engine.weights
        return Generation([start, end, self.idx], [0.0, 0.0, 0.0], "length", policy_version=-1)


def ctx(episode: str) -> GenerationContext:
    return GenerationContext(episode_id=episode)


P = SamplingParams(max_tokens=3)


def test_routing_is_sticky_and_balanced():
    engine = Engine()
    reps = [FakeReplica(i, engine) for i in range(3)]
    pol = ReplicaPolicy(reps, metrics_urls=[None] * 3)
    for _ in range(3):
        for e in range(30):
            assert pol.generate([1], P, ctx(f"ep{e}")).token_ids[2] == pol.route(f"ep{e}")
    for rep in reps:  # each episode stayed on one replica, and each replica got 10 episodes
        assert len(set(rep.episodes)) == 10 and len(rep.episodes) == 30
    assert set().union(*[set(r.episodes) for r in reps]) == {f"ep{e}" for e in range(30)}
    assert pol.calls() == [30, 30, 30]
    row = pol.step_metrics()
    assert row["replica_calls/r0"] == 30.0 and row["prefix_cache_hit_rate"] is None
    assert pol.step_metrics()["replica_calls/r1"] == 0.0  # a window since the last call


def test_new_episodes_avoid_the_busy_replica_and_the_table_is_bounded():
    engine = Engine()
    engine.hold["a"] = threading.Event()
    reps = [FakeReplica(i, engine) for i in range(2)]
    pol = ReplicaPolicy(reps, metrics_urls=[None, None], max_sticky=3)
    blocked = threading.Thread(target=pol.generate, args=([1], P, ctx("a")))
    blocked.start()
    while pol.calls()[0] == 0:
        time.sleep(0.001)
    # replica 0 is busy with "a": new episodes go to replica 1 although it has as many episodes
    assert [pol.generate([1], P, ctx(e)).token_ids[2] for e in ("b", "c")] == [1, 1]
    engine.hold["a"].set()
    blocked.join(10)
    assert pol.route("a") == 0 and pol.route("d") == 0  # now idle: fewest episodes
    pol.route("e")  # the table keeps 3 episodes: "b" (least recent) went
    assert pol.route("b") in (0, 1) and len(pol._sticky) == 3
    assert sum(pol._episodes) == 3
    pol.close()
    with pytest.raises(PolicyError, match="closed"):
        pol.generate([1], P, ctx("x"))


def test_version_gate_drains_readers_and_holds_new_ones():
    gate = VersionGate()
    release, writer_in, late_in = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def reader():
        with gate.read() as v:
            seen["first"] = v
            release.wait(10)

    def writer():
        with gate.write():
            writer_in.set()
            gate.version = 1

    def late():
        with gate.read() as v:
            seen["late"] = v
            late_in.set()

    r = threading.Thread(target=reader)
    r.start()
    while gate.readers == 0:
        time.sleep(0.001)
    w = threading.Thread(target=writer)
    w.start()
    while gate._waiting_writers == 0:
        time.sleep(0.001)
    lt = threading.Thread(target=late)
    lt.start()
    assert not writer_in.wait(0.2) and not late_in.is_set()  # the writer waits for the reader ...
    release.set()  # ... the late reader waits for the writer
    for t in (r, w, lt):
        t.join(10)
    assert writer_in.is_set() and seen == {"first": 0, "late": 1}


def test_updates_under_concurrent_calls_record_exact_versions():
    engine = Engine()
    pol = ReplicaPolicy([FakeReplica(i, engine, delay=0.002) for i in range(2)], metrics_urls=[None, None])
    stop, results, errors, actives = threading.Event(), [], [], []

    def worker(w):
        n = 0
        while not stop.is_set():
            try:
                results.append(pol.generate([1], P, ctx(f"w{w}-{n // 3}")))
            except Exception as exc:  # noqa: BLE001 - collected and asserted empty
                errors.append(exc)
            n += 1

    def apply(new):
        def run():
            actives.append(engine.active)
            engine.weights = new
            return "fake"
        return run

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for version in range(1, 6):
        time.sleep(0.02)
        assert pol.update_weights(apply(version), version) == version == pol.version
    time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join(10)
    assert not errors and actives == [0] * 5  # no call ran on an engine while its weights changed
    assert all(g.token_ids[0] == g.token_ids[1] == g.policy_version for g in results)
    assert {g.policy_version for g in results} == set(range(6))
    with pytest.raises(PolicyError, match="must increase"):
        pol.update_weights(apply(9), 5)
    assert pol.version == 5 and engine.weights == 5  # a refused update changed nothing
    assert pol.last_sync is not None and pol.last_sync["method"] == "fake"


# -- prefix-cache metrics -------------------------------------------------------------------------------
PAGE = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="trainee"}} {q}
vllm:prefix_cache_queries_created{{engine="0",model_name="trainee"}} 1.7e+09
vllm:prefix_cache_hits_total{{engine="0",model_name="trainee"}} {h}
"""


class _Metrics(http.server.BaseHTTPRequestHandler):
    page = {"q": 0.0, "h": 0.0}

    def do_GET(self):  # noqa: N802 - the http.server API
        body = PAGE.format(**self.page).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_prefix_cache_rates_from_prometheus_counters():
    assert parse_prometheus(PAGE.format(q=10.0, h=4.0), (QUERIES_METRIC, HITS_METRIC)) == {
        QUERIES_METRIC: 10.0, HITS_METRIC: 4.0}
    with pytest.raises(PolicyError, match="no"):
        parse_prometheus("other 1\n", (QUERIES_METRIC,))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        pol = ReplicaPolicy([FakeReplica(0, Engine()), FakeReplica(1, Engine())],
                            metrics_urls=[url, f"http://127.0.0.1:{free_port()}"])
        _Metrics.page.update(q=100.0, h=25.0)
        stats = pol.prefix_cache_stats()
        assert stats[0].rate == 0.25 and stats[1].rate is None and stats[1].queries is None
        assert pol.step_metrics()["prefix_cache_hit_rate/r0"] == 0.25
        _Metrics.page.update(q=200.0, h=100.0)  # this window: 75 of 100 tokens
        row = pol.step_metrics()
        assert row["prefix_cache_hit_rate/r0"] == row["prefix_cache_hit_rate"] == 0.75
        assert row["prefix_cache_hit_rate/r1"] is None
        _Metrics.page.update(q=10.0, h=5.0)  # the engine restarted: counts from zero
        assert pol.step_metrics()["prefix_cache_hit_rate"] == 0.5
    finally:
        server.shutdown()
