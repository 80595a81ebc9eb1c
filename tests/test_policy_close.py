"""A policy our own code built from a spec is closed when that code is done with it; a given one is not.

A passthrough's SDK clients hold HTTP connections, a local model holds memory: ``Runtime.close()`` closes the
policy it built from a spec string (and builds it again for a later episode), never one it was given, and
``clawgym serve-proxy`` closes the policy it built when it stops, however it stops.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

import clawgym_env.policy as policy_mod
import clawgym_env.proxy.server as server_mod
from clawgym_cli.commands import cmd_serve_proxy
from clawgym_env.envs.runtime import Runtime
from clawgym_env.testing import EchoScriptPolicy


class _Closing(EchoScriptPolicy):
    """The echo policy, counting its ``close()`` calls."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def built(tokenizer, monkeypatch):
    """``make_policy`` builds a fresh :class:`_Closing` per call; the list holds every one built."""
    made: list[_Closing] = []

    def make_policy(spec: str, **_: Any) -> _Closing:
        made.append(_Closing(tokenizer))
        return made[-1]

    monkeypatch.setattr(policy_mod, "make_policy", make_policy)
    return made


def test_runtime_closes_the_policy_it_built_and_rebuilds_it(built):
    rt = Runtime("closing:test")
    assert rt.proxy.running
    rt.close()
    rt.close()  # idempotent: closed once
    assert [p.closed for p in built] == [1]
    assert rt.proxy.running and rt.policy is built[1], "a later episode must get a policy that answers"
    rt.close()
    assert [p.closed for p in built] == [1, 1]


def test_runtime_never_closes_a_policy_it_was_given(tokenizer):
    mine = _Closing(tokenizer)
    with Runtime(mine) as rt:
        assert rt.proxy.running
    assert mine.closed == 0 and rt.policy is mine


@pytest.mark.parametrize("fails", [False, True], ids=["stopped", "crashed"])
def test_serve_proxy_closes_the_policy_it_built(built, monkeypatch, fails):
    real = server_mod.serve_proxy
    stop = threading.Event()
    stop.set()  # serve, open the episode, then stop at once

    def serve(policy: Any, **kwargs: Any) -> Any:
        assert policy.closed == 0, "closed while serving"
        if fails:
            raise RuntimeError("the server broke")
        return real(policy, stop_event=stop, announce=lambda _: None, **kwargs)

    monkeypatch.setattr(server_mod, "serve_proxy", serve)
    args = SimpleNamespace(policy="closing:test", host="127.0.0.1", port=0, calls_out=None)
    if fails:
        with pytest.raises(RuntimeError, match="broke"):
            cmd_serve_proxy(args)
    else:
        assert cmd_serve_proxy(args) == 0
    assert [p.closed for p in built] == [1]


def test_a_rollout_worker_closes_the_policy_it_built_once(built, tmp_path):
    from clawgym_env.fleet import FleetConfig
    from clawgym_env.fleet.worker import RolloutWorker

    worker = RolloutWorker(FleetConfig(policy="closing:test", out_dir=str(tmp_path / "eps"),
                                       ship_cache_dir=str(tmp_path / "cache")), 0, "0" * 8, 1)
    assert worker.proxy.running and [p.closed for p in built] == [0]
    worker.close()
    worker.close()  # idempotent
    assert not worker.proxy.running and [p.closed for p in built] == [1]
