"""Sandboxes: one interface (:class:`Sandbox`), backends found by name (:func:`get_backend`)."""

from __future__ import annotations

from clawgym_env.sandbox.base import (
    ExecResult,
    PlaceFullError,
    Sandbox,
    SandboxLimits,
    SandboxSpec,
    host_toolchain_paths,
)


def get_backend(name: str) -> type[Sandbox]:
    """The sandbox class registered as ``name`` in :data:`clawgym_env.plugins.sandboxes` (built-ins:
    ``bwrap``, ``docker``; plugins: entry points of group ``clawgym.sandboxes``), or of an open
    :class:`~clawgym_env.sandbox.docker.pool.DockerPool` of this process (its ``name``, ``docker-pool:<id>``)."""
    if name.startswith("docker-pool:"):
        from clawgym_env.sandbox.docker.pool import pool_class

        return pool_class(name)
    from clawgym_env.plugins import sandboxes

    return sandboxes.load(name)


__all__ = ["ExecResult", "PlaceFullError", "Sandbox", "SandboxLimits", "SandboxSpec", "host_toolchain_paths",
           "get_backend"]
