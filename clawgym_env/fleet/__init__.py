"""Rollouts on Ray: a fleet of sandboxed harness episodes across machines, with nothing lost.

One :class:`~clawgym_env.fleet.worker.RolloutWorker` actor per Ray node owns that node's
sandboxes, its own serving proxy (a harness's HTTP traffic never leaves the node) and its harness
installs; the policy inside is built from a spec string (``"vllm:http://HOST:PORT"`` for remote
engines, ``"scripted:expert"`` for tests). :class:`RayFleet` feeds the workers from one queue with
a per-node cap, retries infrastructure failures on another node and returns the same
:class:`~clawgym_env.episodes.run.EpisodeResult` s as the threads backend, one per requested episode::

    from clawgym_env.fleet import FleetConfig, RayFleet

    with RayFleet(FleetConfig(policy="vllm:http://10.0.0.5:8000", address="auto",
                              max_episodes_per_node=16, out_dir="/shared/runs/eps")) as fleet:
        results = fleet.run(suite.tasks, make_harness("openclaw"), samples=8)
        fleet.attempts          # the infrastructure failures met on the way (retried or final)

or through the usual pool: ``RolloutPool(runtime, backend="ray", fleet=FleetConfig(...))``.

On a cluster, every node needs this project installed, the sandbox (bubblewrap or Docker) and the
harnesses' installs. A task's folders travel with its episodes to the nodes that lack them (packed once,
unpacked once per node in a cache keyed by content hash, :mod:`~clawgym_env.fleet.ship`); a task larger
than ``ship_max_mb`` must be on every node at the same path, else its episodes there end as
``infra_error`` (boundary ``task``). Each episode holds its harness's declared resources
(``adapter.resources``) on its node: a node runs episodes only while their sum fits its CPUs and memory
(:mod:`~clawgym_env.fleet.placement`), harnesses mixed in one batch with :meth:`RayFleet.run_mixed`;
:func:`fleet_metrics` gives the live counts as flat metrics.

Invariants: importing this package does not import Ray (it is an optional dependency, the extra
``clawgym[ray]``); every requested episode ends exactly once; an infrastructure failure is never a
reward of 0 (see :mod:`~clawgym_env.fleet.scheduler`).
"""

from __future__ import annotations

from clawgym_env.fleet.config import RETRIABLE_BOUNDARIES, AttemptRecord, FleetConfig, WorkerInfo
from clawgym_env.fleet.scheduler import FleetError, RayFleet
from clawgym_env.fleet.ship import ShipError
from clawgym_env.fleet.stats import Counts, FleetProgress, FleetStats, bar_postfix, fleet_metrics

__all__ = ["RETRIABLE_BOUNDARIES", "AttemptRecord", "Counts", "FleetConfig", "FleetError", "FleetProgress",
           "FleetStats", "RayFleet", "ShipError", "WorkerInfo", "bar_postfix",
           "fleet_metrics"]
