"""Shared fixtures: one scripted-expert runtime per test session (a real proxy, real tokenizer)."""

from __future__ import annotations

import pytest

collect_ignore_glob = ["fixtures/*"]
"""Task folders used as test data (their input files may hold tests that fail on purpose) are never collected."""


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
