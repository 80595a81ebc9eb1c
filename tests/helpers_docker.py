"""Shared by the Docker tests: whether a Docker engine answers here, and starting the project's own dockerd."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERD_SH = ROOT / "scripts" / "dockerd.sh"


def engine_problem() -> str | None:
    """None when a Docker engine answers a ping; otherwise why not (shortened)."""
    try:
        import docker

        client = docker.from_env(timeout=20)
        client.ping()
        client.close()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "no engine answers"
        return str(exc).strip()[:300] or type(exc).__name__


def can_start_dockerd() -> bool:
    """Whether this process may start the project's dockerd (root, and the binary is installed)."""
    return os.geteuid() == 0 and shutil.which("dockerd") is not None


def start_dockerd() -> subprocess.CompletedProcess[str]:
    """``scripts/dockerd.sh start`` (idempotent; up to 3 minutes)."""
    return subprocess.run([str(DOCKERD_SH), "start"], capture_output=True, text=True, timeout=180)


def require_engine() -> None:
    """Skip the calling test unless a Docker engine answers, after starting the project's dockerd when none
    does and this process may."""
    why = engine_problem()
    if why is not None and can_start_dockerd():
        start_dockerd()
        why = engine_problem()
    if why is not None:
        pytest.skip(f"no Docker engine can run here: {why}")
