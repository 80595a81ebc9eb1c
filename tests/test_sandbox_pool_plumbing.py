"""Warm Docker sandbox pools reached from the command line, the train config and the Ray fleet.

What is checked: ``--sandbox-pool N`` parses for ``clawgym eval`` and ``clawgym run`` and, without
``--sandbox docker``, fails at once with an error naming the fix (no results file written); the
fleet's and the trainer's configuration refuse a pool for another sandbox; with a Docker engine, a
whole ``clawgym eval`` through the pool writes graded rows and the pool served warm containers, and
a one-node Ray fleet's worker keeps its own pool on its node.
"""

from __future__ import annotations

import json
import sys

import pytest

from clawgym_cli.main import build_parser, main
from clawgym_env.fleet import FleetConfig
from clawgym_env.testing import EchoHarness, echo_suite

try:
    from helpers_docker import require_engine
except ImportError:  # tests run as a package
    from tests.helpers_docker import require_engine


def test_the_pool_options_parse():
    p = build_parser()
    ev = p.parse_args(["eval", "--suite", "builtin", "--out", "r.jsonl", "--sandbox", "docker", "--sandbox-pool", "3"])
    assert (ev.sandbox, ev.sandbox_pool) == ("docker", 3)
    assert p.parse_args(["eval", "--suite", "builtin", "--out", "r.jsonl"]).sandbox_pool == 0
    assert p.parse_args(["run", "--task", "builtin/csv_total", "--sandbox", "docker", "--sandbox-pool", "2"]
                        ).sandbox_pool == 2


@pytest.mark.parametrize("command", ["eval", "run"])
def test_a_pool_without_docker_fails_naming_the_fix(command, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    args = (["eval", "--suite", "builtin", "--out", str(out), "--limit", "1"] if command == "eval"
            else ["run", "--task", "builtin/csv_total", "--out", str(tmp_path / "eps")])
    assert main([*args, "--sandbox-pool", "2"]) == 2
    err = capsys.readouterr().err
    assert "--sandbox-pool 2" in err and "--sandbox docker" in err and "'bwrap'" in err, err
    assert not out.exists() and not (tmp_path / "eps").exists()  # refused before anything ran
    assert main([*args, "--sandbox", "docker", "--sandbox-pool", "-1"]) == 2
    assert "must be >= 0" in capsys.readouterr().err


def test_fleet_and_train_configs_refuse_a_pool_for_another_sandbox():
    with pytest.raises(ValueError, match="sandbox_pool: warm sandboxes are for sandbox='docker' only"):
        FleetConfig(policy="scripted:expert", sandbox_pool=2)
    assert FleetConfig(policy="scripted:expert", sandbox="docker", sandbox_pool=2).sandbox_pool == 2
    from trainers.rollouts.sync import RolloutConfig

    with pytest.raises(ValueError, match="rollout.sandbox_pool must be >= 0"):
        RolloutConfig(sandbox_pool=-1)
    assert RolloutConfig(sandbox_pool=2).sandbox_pool == 2


def test_the_runtime_hands_its_pool_to_a_ray_fleet():
    from clawgym_env.envs.runtime import RolloutPool, Runtime

    rt = Runtime("scripted:expert", sandbox="docker", sandbox_pool=2)
    pool = RolloutPool(rt, backend="ray", concurrency=3)
    assert pool.fleet_config is not None
    assert (pool.fleet_config.sandbox, pool.fleet_config.sandbox_pool) == ("docker", 2)


# ---- with a Docker engine -----------------------------------------------------------------------

@pytest.fixture
def engine():
    require_engine()


def _http_echo() -> EchoHarness:
    return EchoHarness(client="http")


@pytest.mark.docker
@pytest.mark.slow
def test_eval_through_a_warm_pool_from_the_command_line(engine, tmp_path, monkeypatch, capsys):
    from clawgym_env import plugins
    from clawgym_env.sandbox.docker import pool as docker_pool

    served: list[docker_pool.PoolStats] = []

    class Watched(docker_pool.DockerPool):
        def close(self) -> None:
            served.append(self.stats)
            super().close()

    monkeypatch.setattr(docker_pool, "DockerPool", Watched)
    suite = echo_suite(tmp_path / "suite")
    out = tmp_path / "r.jsonl"
    with plugins.harnesses.registered("echo", _http_echo):
        rc = main(["eval", "--suite", str(tmp_path / "suite"), "--harness", "echo", "--policy", "scripted:expert",
                   "--samples", "2", "--concurrency", "2", "--sandbox", "docker", "--sandbox-pool", "2",
                   "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * len(suite.tasks)
    assert sorted((r["task_id"], r["sample"]) for r in rows) == sorted((t.id, k) for t in suite.tasks for k in range(2))
    assert all(r["status"] == "ok" and r["reward"] == 1.0 for r in rows), rows
    assert len(served) == 1 and served[0].hits > 0, served  # the pool was made, served warm containers, closed


@pytest.mark.docker
@pytest.mark.slow
def test_a_fleet_worker_keeps_its_own_pool(engine, tmp_path):
    ray = pytest.importorskip("ray", reason="the ray backend needs Ray: pip install 'clawgym[ray]'")
    from ray.cluster_utils import Cluster

    from clawgym_env.fleet import RayFleet

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    suite = echo_suite(tmp_path / "suite")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        cfg = FleetConfig(policy="scripted:expert", sandbox="docker", sandbox_pool=2, out_dir=str(tmp_path / "eps"),
                          max_episodes_per_node=2, episode_cpus=0.5, start_timeout_s=180.0)
        with RayFleet(cfg) as fleet:
            results = fleet.run(suite.tasks[:2], _http_echo(), samples=2)
            pools = ray.get(fleet.workers[0].handle.pool_stats.remote())
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert [r.record.status for r in results] == ["ok"] * 4, [r.record.error for r in results]
    assert pools is not None and pools.hits > 0, pools
