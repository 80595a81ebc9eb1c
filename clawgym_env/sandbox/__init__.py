"""Sandboxes: one interface (:class:`Sandbox`), backends found by name."""

from __future__ import annotations

from clawgym_env.sandbox.base import ExecResult, Sandbox, SandboxLimits, SandboxSpec, host_toolchain_paths

BACKENDS = {
    "bwrap": "clawgym_env.sandbox.bwrap:BwrapSandbox",
    "docker": "clawgym_env.sandbox.docker:DockerSandbox",
}


def get_backend(name: str):
    """Return the sandbox class registered under ``name`` ("bwrap" or "docker")."""
    import importlib

    from clawgym_env.errors import RegistrationError

    if name not in BACKENDS:
        raise RegistrationError(f"unknown sandbox backend {name!r}; choose one of {sorted(BACKENDS)}")
    mod, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(mod), cls)


__all__ = ["ExecResult", "Sandbox", "SandboxLimits", "SandboxSpec", "host_toolchain_paths", "get_backend", "BACKENDS"]
