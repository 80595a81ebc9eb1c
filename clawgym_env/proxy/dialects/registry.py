"""The registered dialects, resolved: each one's name, its declared routes and its module.

Invariants:
  * The routes the proxy serves, and the conformance check's history field, come from here, and here only from
    each registered module's own ``DIALECT`` (:mod:`~clawgym_env.proxy.dialects.contract`): there is no table of
    dialects besides the registry (:data:`clawgym_env.plugins.dialects`).
  * :func:`spec` imports the one module it names; :func:`registered` imports every registered one (the proxy
    calls it once, when it starts). A module that does not keep the contract (no ``DIALECT``, a route naming a
    function it lacks, a missing required function) and two dialects claiming one route are each a
    :class:`~clawgym_env.errors.RegistrationError` naming the dialect, its module and the fix.
"""

from __future__ import annotations

import dataclasses
from typing import cast

from clawgym_env.capture.records import Dialect
from clawgym_env.errors import RegistrationError
from clawgym_env.proxy.dialects import dialects as dialect_registry
from clawgym_env.proxy.dialects.contract import DialectModule, DialectSpec, Route

__all__ = ["BoundDialect", "DialectModule", "DialectName", "DialectSpec", "Route", "registered", "spec"]

DialectName = Dialect
"""The name of a dialect, as calls are recorded (``CallRecord.dialect``)."""

REQUIRED = ("parse_request", "render_response", "stream_response", "error_body", "keepalive")
"""The functions every dialect module provides (:class:`~clawgym_env.proxy.dialects.contract.DialectModule`)."""


@dataclasses.dataclass(frozen=True)
class BoundDialect:
    """One registered dialect: its name (as recorded), what its module declares, and the module."""

    name: str
    spec: DialectSpec
    module: DialectModule

    @property
    def history_key(self) -> str:
        """The request field that carries the conversation."""
        return self.spec.history_key

    def load(self) -> DialectModule:
        """The dialect's module."""
        return self.module


def _bind(name: str) -> BoundDialect:
    module = dialect_registry.load(name)
    where = f"dialect {name!r} (module {module.__name__})"
    declared = getattr(module, "DIALECT", None)
    if not isinstance(declared, DialectSpec):
        raise RegistrationError(f"{where} declares no DIALECT = DialectSpec(routes=..., history_key=...) "
                                "(clawgym_env.proxy.dialects.contract); add one naming its routes")
    wanted = list(REQUIRED) + [r.side if r.side is not None else r.parse for r in declared.routes]
    missing = [f for f in dict.fromkeys(wanted) if not callable(getattr(module, f, None))]
    if missing:
        raise RegistrationError(f"{where} lacks the function(s) {', '.join(missing)} that the dialect contract "
                                "or its routes name; define them in the module")
    return BoundDialect(name, declared, cast(DialectModule, module))


def spec(name: str) -> BoundDialect:
    """The dialect registered as ``name`` (its module imported); a :class:`RegistrationError` naming the
    registered ones otherwise."""
    return _bind(name)


def registered() -> tuple[BoundDialect, ...]:
    """Every registered dialect (built-ins first, in registration order, then the rest by name); a
    :class:`RegistrationError` when two claim one method and path."""
    names = list(dict.fromkeys(["openai_chat", "anthropic_messages", "openai_responses"]
                               + [n.replace("-", "_") for n in dialect_registry.names()]))
    bound = [_bind(n) for n in names if n in dialect_registry]
    seen: dict[tuple[str, str], str] = {}
    for d in bound:
        for route in d.spec.routes:
            key = (route.method, route.path)
            if key in seen and seen[key] != d.name:
                raise RegistrationError(f"dialects {seen[key]!r} and {d.name!r} both claim {route.method} "
                                        f"{route.path}; unregister one or change its route")
            seen[key] = d.name
    return tuple(bound)

