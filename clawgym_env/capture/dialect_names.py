"""The dialect registry: the names calls are recorded under (``CallRecord.dialect``) → the modules that speak them.

It lives with the records, the engine's lowest layer, so a record can check its dialect against it (the capture
package may not import the proxy); the proxy re-exports it as :data:`clawgym_env.proxy.dialects.dialects`, and
:mod:`clawgym_env.plugins` lists it with the other registries.

Invariants:
  * A dialect is a module registered here: a built-in below, an entry point of group ``clawgym.dialects``
    (``my-dialect = "my_package.my_dialect"``), or a runtime :meth:`~clawgym_env.registry.RegistryBase.register`.
    What the module provides is :mod:`clawgym_env.proxy.dialects.contract`'s; this module imports none of them.
  * :func:`check_dialect` accepts exactly the registered names (case-insensitive, ``_`` equals ``-``, as every
    registry) and refuses any other with a message naming the registered ones and how to add one.
"""

from __future__ import annotations

from clawgym_env.registry import ModuleRegistry

__all__ = ["check_dialect", "dialects"]

dialects = ModuleRegistry("dialect", "clawgym.dialects", builtins={
    "openai_chat": "clawgym_env.proxy.dialects.openai_chat.dialect",
    "anthropic_messages": "clawgym_env.proxy.dialects.anthropic.dialect",
    "openai_responses": "clawgym_env.proxy.dialects.responses.dialect",
})
"""Wire-dialect modules of the serving proxy (entry points ``clawgym.dialects``: a module that declares
``DIALECT``, see :mod:`clawgym_env.proxy.dialects.contract`)."""


def check_dialect(name: str) -> str:
    """``name`` unchanged when a dialect of that name is registered; ``ValueError`` naming the registered ones
    (and how to register one) otherwise."""
    if name in dialects:
        return name
    raise ValueError(f"{dialects.unknown(name)}; a dialect is registered by an entry point of group "
                     f"'clawgym.dialects' (or clawgym_env.plugins.dialects.register at runtime)")
