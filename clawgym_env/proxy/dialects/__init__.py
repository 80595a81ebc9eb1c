"""The wire dialects the proxy speaks, one folder each (request models, answer rendering, streaming), behind one
registry; a dialect's contract (its declared routes, history field and functions) is
:mod:`clawgym_env.proxy.dialects.contract`."""

from __future__ import annotations

from clawgym_env.capture.dialect_names import dialects

__all__ = ["dialects"]
