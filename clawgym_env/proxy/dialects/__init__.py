"""The wire dialects the proxy speaks, one folder each (request models, answer rendering, streaming), behind one
registry."""

from __future__ import annotations

from clawgym_env.registry import ModuleRegistry

__all__ = ["dialects"]

dialects = ModuleRegistry("dialect", "clawgym.dialects", builtins={
    "openai_chat": "clawgym_env.proxy.dialects.openai_chat.dialect",
    "anthropic_messages": "clawgym_env.proxy.dialects.anthropic.dialect",
    "openai_responses": "clawgym_env.proxy.dialects.responses.dialect",
})
"""Wire-dialect modules of the serving proxy, also :data:`clawgym_env.plugins.dialects` (their routes:
:data:`clawgym_env.proxy.dialects.registry.DIALECTS`, which loads each module from here and checks at import
that both name the same dialects)."""
