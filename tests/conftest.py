"""Shared fixtures: one scripted-expert runtime per test session (a real proxy, real tokenizer)."""

from __future__ import annotations

import os
import sys

import pytest

collect_ignore_glob = ["fixtures/*"]
"""Task folders used as test data (their input files may hold tests that fail on purpose) are never collected."""

_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Keep the session's exit status for :func:`pytest_unconfigure`."""
    _STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After pytest has reported everything, end the process with the session's own status, skipping the
    interpreter's teardown: a full run once ended with every test reported and then "pure virtual method called"
    and a segfault while native libraries (torch's gloo, protobuf, ...) tore down their threads, which turned a
    passing run into exit 139. ``CLAWGYM_TEST_SOFT_EXIT=1`` keeps the normal teardown (to hunt that crash)."""
    if _STATUS and os.environ.get("CLAWGYM_TEST_SOFT_EXIT") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_STATUS[-1])


@pytest.fixture(scope="session")
def tokenizer():
    from clawgym_env.policy.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def builtin_suite():
    from tasks import load_suite

    return load_suite("builtin")


@pytest.fixture(scope="session")
def expert_runtime(tmp_path_factory):
    from clawgym_env.envs.runtime import Runtime

    with Runtime("scripted:expert", out_dir=tmp_path_factory.mktemp("episodes")) as rt:
        yield rt
