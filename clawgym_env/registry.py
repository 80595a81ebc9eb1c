"""The plugin registry type: names → implementations of one kind of plugin, found lazily.

:class:`Registry` is generic over the kind it builds: ``Registry[Sandbox]`` loads a factory of
sandboxes (``load() -> Callable[..., Sandbox]``, a class or a function) and builds one
(``create() -> Sandbox``). :class:`ModuleRegistry` names modules (training algorithms, wire dialects):
its ``load()`` returns the module. Both share naming, registration and lookup (:class:`RegistryBase`).
The registries themselves live with the kind they build (``clawgym_env.sandbox.sandboxes``, ...) and
are all listed in :mod:`clawgym_env.plugins`.

Invariants: a target is an object (registered at runtime) or ``"module:attr"`` or, by convention, a bare
``"module"`` that defines exactly one implementation of the registry's ``base``; names are
case-insensitive and ``_`` equals ``-``; a runtime registration wins over an entry point (group
``clawgym.<kind>``), which wins over a built-in of the same name; every failure is a
:class:`~clawgym_env.errors.RegistrationError` that names the kind, the close names ("did you mean")
and the available ones. This module imports no plugin and no registry.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from importlib import metadata
from types import ModuleType
from typing import Generic, TypeVar, cast

from clawgym_env.errors import RegistrationError

T = TypeVar("T")

_MISSING = object()


def _norm(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


class RegistryBase:
    """Names → implementations of one kind of plugin (see the module doc): naming, registration, lookup.

    A target is an object (registered at runtime) or a ``"module[:attr]"`` string, resolved on first use."""

    def __init__(self, kind: str, group: str, *, builtins: dict[str, str] | None = None,
                 base: type | None = None) -> None:
        self.kind = kind
        """Singular, for messages: ``harness``, ``suite``, ..."""
        self.group = group
        """The entry-point group plugin packages declare their entries in (``clawgym.harnesses``, ...)."""
        self.base = base
        self._builtins = {_norm(k): v for k, v in (builtins or {}).items()}
        self._runtime: dict[str, object] = {}
        self._entry_points: dict[str, str] | None = None
        self._lock = threading.Lock()

    # -- discovery --------------------------------------------------------------------------------
    def _discovered(self) -> dict[str, str]:
        with self._lock:
            if self._entry_points is None:
                found: dict[str, str] = {}
                for ep in metadata.entry_points(group=self.group):
                    found[_norm(ep.name)] = ep.value
                self._entry_points = found
            return self._entry_points

    def _targets(self) -> dict[str, object]:
        return {**self._builtins, **self._discovered(), **self._runtime}

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._targets())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _norm(name) in self._targets()

    def register(self, name: str, target: object, *, replace: bool = False) -> None:
        """Register ``target`` (an object, or a ``"module[:attr]"`` string) under ``name`` at runtime."""
        key = _norm(name)
        if key in self._runtime and not replace:
            raise RegistrationError(f"{self.kind} {name!r} is already registered; pass replace=True to replace it")
        self._runtime[key] = target

    def unregister(self, name: str) -> None:
        """Forget a runtime registration (built-ins and entry points stay)."""
        self._runtime.pop(_norm(name), None)

    @contextlib.contextmanager
    def registered(self, name: str, target: object) -> Iterator[None]:
        """Register ``target`` as ``name`` for the ``with`` block only (tests), restoring what was there."""
        key = _norm(name)
        before = self._runtime.get(key, _MISSING)
        self._runtime[key] = target
        try:
            yield
        finally:
            if before is _MISSING:
                self._runtime.pop(key, None)
            else:
                self._runtime[key] = before

    # -- lookup -----------------------------------------------------------------------------------
    def unknown(self, name: str, what: str = "") -> RegistrationError:
        """The error for an unknown ``name``: close names, the available ones, how to add one."""
        names = self.names()
        close = difflib.get_close_matches(_norm(name), names, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        avail = ", ".join(names) if names else (f"none; is ClawGym installed (`pip install -e .`)? Plugins are "
                                                f"entry points of group {self.group!r}")
        return RegistrationError(f"unknown {what or self.kind} {name!r}{hint} (available: {avail})")

    def _load(self, name: str) -> object:
        """The implementation registered as ``name`` (imported on first use), untyped."""
        key = _norm(name)
        targets = self._targets()
        if key not in targets:
            raise self.unknown(name)
        target = targets[key]
        if not isinstance(target, str):
            return target
        return self._resolve(key, target)

    def _resolve(self, key: str, target: str) -> object:
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise RegistrationError(f"{self.kind} {key!r} ({target}) could not be imported: {exc}; install the "
                                    f"package that provides it (`pip install -e .` for this project's own)") from exc
        if attr:
            try:
                obj: object = module
                for part in attr.split("."):
                    obj = getattr(obj, part)
                return obj
            except AttributeError as exc:
                raise RegistrationError(f"{self.kind} {key!r}: {module_name} has no {attr!r}") from exc
        return self._by_convention(key, module)

    def _by_convention(self, key: str, module: ModuleType) -> object:
        if self.base is None:
            return module
        found = {id(v): v for v in vars(module).values()
                 if inspect.isclass(v) and issubclass(v, self.base) and v is not self.base
                 and not inspect.isabstract(v) and v.__module__.startswith(module.__name__)}
        if len(found) != 1:
            names = sorted(v.__name__ for v in found.values())
            raise RegistrationError(
                f"{self.kind} {key!r}: module {module.__name__} must define exactly one {self.base.__name__} "
                f"subclass (found {len(found)}: {names or 'none'}); or register it as 'module:Class'")
        return next(iter(found.values()))


class Registry(RegistryBase, Generic[T]):
    """Names → factories of ``T`` (classes or functions returning a ``T``); see the module doc."""

    def load(self, name: str) -> Callable[..., T]:
        """The factory registered as ``name`` (imported on first use)."""
        return cast("Callable[..., T]", self._load(name))

    def create(self, name: str, /, **options: object) -> T:
        """Instantiate (or call) the factory registered as ``name`` with ``options`` (plugin-specific
        keywords: each plugin declares its own; a wrong one is a :class:`RegistrationError`)."""
        impl = self.load(name)
        try:
            return impl(**options)
        except TypeError as exc:
            if options and "argument" in str(exc):
                raise RegistrationError(f"bad options for {self.kind} {name!r}: {exc}") from exc
            raise


class ModuleRegistry(RegistryBase):
    """Names → modules (or a module's attribute, for a ``"module:attr"`` target); see the module doc."""

    def load(self, name: str) -> ModuleType:
        """The module registered as ``name`` (imported on first use)."""
        return cast(ModuleType, self._load(name))
