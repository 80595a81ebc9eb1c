"""The plugin registry type: names → implementations of one kind of plugin, found lazily.

:class:`Registry` is generic over the kind it builds: ``Registry[Sandbox]`` loads a factory of
sandboxes (``load() -> Callable[..., Sandbox]``, a class or a function) and builds one
(``create() -> Sandbox``). :class:`ModuleRegistry` names modules (training algorithms, wire dialects):
its ``load()`` returns the module. Both share naming, registration and lookup (:class:`RegistryBase`).
The registries themselves live with the kind they build (``clawgym_env.sandbox.sandboxes``, ...) and
are all listed in :mod:`clawgym_env.plugins`.

Invariants: a target is an object (registered at runtime) or ``"module:attr"`` or, by convention, a bare
``"module"`` that defines exactly one implementation of the registry's ``base``; names are
case-insensitive and ``_`` equals ``-``; a runtime registration deliberately wins over an entry point (group
``clawgym.<kind>``), which wins over a built-in of the same name; two *distributions* declaring one name in
one group are a conflict, never a silent last-win: the name is listed, and using it is an error naming both
distributions (until one is uninstalled, or a runtime registration settles it); every failure is a
:class:`~clawgym_env.errors.RegistrationError` that names the kind and the name, and for an entry point its
target, its distribution (name and version), the original exception (chained) and the fix. An unknown name
lists the close names ("did you mean") and the available ones. :meth:`RegistryBase.problem` says, in one
line, why a registered name cannot be used (for listings that mark broken plugins). This module imports no
plugin and no registry.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
        self._entry_points: dict[str, tuple[EntryPointSource, ...]] | None = None
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    # -- discovery --------------------------------------------------------------------------------
    def _discovered(self) -> dict[str, tuple[EntryPointSource, ...]]:
        """name → the entry points declaring it (one; several only when distributions conflict)."""
        with self._lock:
            if self._entry_points is None:
                found: dict[str, dict[str, EntryPointSource]] = {}
                for ep in metadata.entry_points(group=self.group):
                    source = EntryPointSource.of(ep)
                    # one distribution is seen once; the same target twice is the same implementation
                    found.setdefault(_norm(ep.name), {}).setdefault(source.target, source)
                self._entry_points = {k: tuple(v.values()) for k, v in found.items()}
            return self._entry_points

    def refresh(self) -> None:
        """Forget the discovered entry points: the next lookup reads the installed distributions again (after a
        ``pip install`` in this process, or a test that puts a distribution on ``sys.path``)."""
        with self._lock:
            self._entry_points = None
        self._changed()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every runtime (un)registration and :meth:`refresh` (e.g. to keep the
        Gymnasium ids of the harnesses in step)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def _targets(self) -> dict[str, object]:
        discovered = {k: v[0].target for k, v in self._discovered().items()}
        return {**self._builtins, **discovered, **self._runtime}

    def source(self, name: str) -> str:
        """Where ``name`` comes from, for listings: ``runtime``, ``built-in`` or ``<dist> <version>`` (several
        joined by `` and `` when distributions conflict); :meth:`unknown` raised for an unknown name."""
        key = _norm(name)
        if key in self._runtime:
            return "runtime"
        found = self._discovered().get(key)
        if found:
            return " and ".join(s.where for s in found)
        if key in self._builtins:
            return "built-in"
        raise self.unknown(name)

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
        self._changed()

    def unregister(self, name: str) -> None:
        """Forget a runtime registration (built-ins and entry points stay)."""
        self._runtime.pop(_norm(name), None)
        self._changed()

    @contextlib.contextmanager
    def registered(self, name: str, target: object) -> Iterator[None]:
        """Register ``target`` as ``name`` for the ``with`` block only (tests), restoring what was there."""
        key = _norm(name)
        before = self._runtime.get(key, _MISSING)
        self._runtime[key] = target
        self._changed()
        try:
            yield
        finally:
            if before is _MISSING:
                self._runtime.pop(key, None)
            else:
                self._runtime[key] = before
            self._changed()

    # -- lookup -----------------------------------------------------------------------------------
    def unknown(self, name: str, what: str = "") -> RegistrationError:
        """The error for an unknown ``name``: close names, the available ones, how to add one."""
        names = self.names()
        close = difflib.get_close_matches(_norm(name), names, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        avail = ", ".join(names) if names else (f"none; is ClawGym installed (`pip install -e .`)? Plugins are "
                                                f"entry points of group {self.group!r}")
        return RegistrationError(f"unknown {what or self.kind} {name!r}{hint} (available: {avail})")

    def problem(self, name: str) -> str | None:
        """Why the registered ``name`` cannot be used, in one line (it is loaded to find out), or None when it
        loads: for listings that mark broken plugins instead of listing them as fine."""
        try:
            self._load(name)
        except RegistrationError as exc:
            return " ".join(str(exc).split())
        return None

    def _load(self, name: str) -> object:
        """The implementation registered as ``name`` (imported on first use), untyped."""
        key = _norm(name)
        if key in self._runtime:
            target = self._runtime[key]
            return self._resolve(key, target, None) if isinstance(target, str) else target
        found = self._discovered().get(key)
        if found:
            if len(found) > 1:
                raise self._conflict(key, found)
            return self._resolve(key, found[0].target, found[0])
        if key in self._builtins:
            return self._resolve(key, self._builtins[key], None)
        raise self.unknown(name)

    def _conflict(self, key: str, found: tuple[EntryPointSource, ...]) -> RegistrationError:
        declared = "; ".join(f"{s.where} declares {s.target!r}" for s in found)
        return RegistrationError(
            f"{self.kind} {key!r} is declared by {len(found)} distributions in entry-point group {self.group!r} "
            f"({declared}): a conflict, not resolved by install order; uninstall one of them (`pip uninstall "
            f"{found[-1].dist_name}`), or rename the entry point in one, or register the one to use at runtime "
            f"({self.kind} registry .register({key!r}, ..., replace=True))")

    def _resolve(self, key: str, target: str, source: EntryPointSource | None) -> object:
        module_name, _, attr = target.partition(":")
        what = f"{self.kind} {key!r} ({target}" + (f", entry point of {source.where})" if source else ")")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - any failure of a plugin's import is reported as that plugin's
            raise self._import_error(what, module_name, source, exc) from exc
        if attr:
            try:
                obj: object = module
                for part in attr.split("."):
                    obj = getattr(obj, part)
                return obj
            except AttributeError as exc:
                fix = (f"misnamed entry point: fix it in {source.dist_name}'s metadata (pyproject.toml "
                       f"[project.entry-points.{self.group!r}]) and reinstall it; or uninstall it" if source else
                       "register the right 'module:attr'")
                raise RegistrationError(f"{what}: {module_name} has no {attr!r}; {fix}") from exc
        return self._by_convention(key, module, what)

    def _import_error(self, what: str, module_name: str, source: EntryPointSource | None,
                      exc: Exception) -> RegistrationError:
        """The error for a target whose module raised on import (a missing module of an installed distribution
        is a misnamed entry point, not a missing install)."""
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        own = missing is not None and (module_name == missing or module_name.startswith(missing + "."))
        raised = f"{type(exc).__name__}: {exc}"
        if source is None:
            fix = ("install the package that provides it (`pip install -e .` for this project's own)"
                   if isinstance(exc, ImportError) else "fix the module: its import raised")
            return RegistrationError(f"{what} could not be imported: {raised}; {fix}")
        if own:
            return RegistrationError(
                f"{what} could not be imported: {source.where} is installed but has no module {missing!r} "
                f"({raised}): a misnamed entry point (or a broken install); fix the entry point in "
                f"{source.dist_name}'s metadata (pyproject.toml [project.entry-points.{self.group!r}]) or reinstall "
                f"{source.dist_name}; or uninstall it (`pip uninstall {source.dist_name}`)")
        return RegistrationError(
            f"{what} could not be imported: its module raised {raised}; reinstall or fix {source.where}; or "
            f"uninstall it (`pip uninstall {source.dist_name}`)")

    def _by_convention(self, key: str, module: ModuleType, what: str = "") -> object:
        if self.base is None:
            return module
        found = {id(v): v for v in vars(module).values()
                 if inspect.isclass(v) and issubclass(v, self.base) and v is not self.base
                 and not inspect.isabstract(v) and v.__module__.startswith(module.__name__)}
        if len(found) != 1:
            names = sorted(v.__name__ for v in found.values())
            raise RegistrationError(
                f"{what or f'{self.kind} {key!r}'}: module {module.__name__} must define exactly one "
                f"{self.base.__name__} subclass (found {len(found)}: {names or 'none'}); or register it as "
                "'module:Class'")
        return next(iter(found.values()))


@dataclasses.dataclass(frozen=True)
class EntryPointSource:
    """One entry point that declares a plugin: its target and the distribution that declares it."""

    target: str
    """``"module[:attr]"``, as declared."""
    dist_name: str
    """The declaring distribution's name (``unknown distribution`` when the entry point has none)."""
    dist_version: str
    """Its version (empty when unknown)."""

    @classmethod
    def of(cls, ep: metadata.EntryPoint) -> EntryPointSource:
        """The source of ``ep`` (its distribution from ``ep.dist``)."""
        dist = ep.dist
        if dist is None:
            return cls(target=ep.value, dist_name="unknown distribution", dist_version="")
        return cls(target=ep.value, dist_name=str(dist.name or "unknown distribution"),
                   dist_version=str(dist.version or ""))

    @property
    def where(self) -> str:
        """``"<dist> <version>"``, for messages."""
        return f"{self.dist_name} {self.dist_version}".strip()


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
