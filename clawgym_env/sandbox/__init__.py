"""Sandboxes: one interface (:class:`Sandbox`), backends found by name (:func:`get_backend`)."""

from __future__ import annotations

from typing import cast

from clawgym_env.registry import Registry
from clawgym_env.sandbox.base import (
    ExecResult,
    PlaceFullError,
    Sandbox,
    SandboxLimits,
    SandboxSpec,
    hidden_paths_with,
    host_toolchain_paths,
)
from clawgym_env.sandbox.deadline import AgentTimeout

sandboxes: Registry[Sandbox] = Registry("sandbox", "clawgym.sandboxes",
                                       builtins={"bwrap": "clawgym_env.sandbox.bwrap.sandbox:BwrapSandbox",
                                                 "docker": "clawgym_env.sandbox.docker.sandbox:DockerSandbox"})
"""Sandbox backends (classes implementing :class:`Sandbox`), also :data:`clawgym_env.plugins.sandboxes`."""


def get_backend(name: str) -> type[Sandbox]:
    """The sandbox class registered as ``name`` in :data:`sandboxes` (built-ins:
    ``bwrap``, ``docker``; plugins: entry points of group ``clawgym.sandboxes``), or of an open
    :class:`~clawgym_env.sandbox.docker.pool.DockerPool` of this process (its ``name``, ``docker-pool:<id>``)."""
    if name.startswith("docker-pool:"):
        from clawgym_env.sandbox.docker.pool import pool_class

        return pool_class(name)
    return cast("type[Sandbox]", sandboxes.load(name))


__all__ = ["AgentTimeout", "ExecResult", "PlaceFullError", "Sandbox", "SandboxLimits", "SandboxSpec",
           "hidden_paths_with", "host_toolchain_paths", "get_backend", "sandboxes"]
