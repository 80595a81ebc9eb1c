"""Harness adapters found by name: ``harness_adapters.<name>`` exports exactly one ``Adapter`` class."""

from __future__ import annotations

import difflib
import importlib

from clawgym_env.errors import RegistrationError
from harness_adapters.base import HarnessAdapter

HARNESSES = {
    "mini": "harness_adapters.mini",
    "openclaw": "harness_adapters.openclaw",
    "claude-code": "harness_adapters.claude_code",
    "codex": "harness_adapters.codex",
    "qwen-code": "harness_adapters.qwen_code",
}


def get_adapter(name: str, **options) -> HarnessAdapter:
    """Instantiate the adapter registered as ``name`` (options go to its constructor)."""
    key = name.replace("_", "-").lower()
    if key not in HARNESSES:
        close = difflib.get_close_matches(key, HARNESSES, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise RegistrationError(f"unknown harness {name!r}{hint} (available: {', '.join(sorted(HARNESSES))})")
    try:
        module = importlib.import_module(HARNESSES[key])
    except ImportError as exc:
        raise RegistrationError(f"harness {key!r} could not be imported ({exc}); reinstall the project") from exc
    try:
        return module.Adapter(**options)
    except TypeError as exc:
        raise RegistrationError(f"bad options for harness {key!r}: {exc}") from exc


def list_harnesses() -> list[str]:
    return sorted(HARNESSES)
