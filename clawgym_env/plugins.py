"""One registry for every kind of plugin: harnesses, suites, graders, sandboxes, policies, algorithms.

The engine never imports its plugins. It finds them by name, lazily, through one small
:class:`Registry` per kind:

  * built-in entries of the engine itself (sandboxes, policies, the ``reward.sh`` grader) are
    registered below as ``"module:attr"`` strings;
  * plugin packages declare theirs as Python entry points in their ``pyproject.toml``, group
    ``clawgym.<kind>`` (this project's own harnesses, suites, graders and algorithms are declared that
    way, and a third-party package adds its own the same way)::

        [project.entry-points."clawgym.harnesses"]
        my-harness = "my_package.my_harness"          # a module exporting exactly one HarnessAdapter

  * code can also call :meth:`Registry.register` at runtime (tests, notebooks).

A target is ``"module:attr"`` or, by convention, a bare ``"module"`` that defines exactly one
implementation of the registry's base type (e.g. one :class:`~clawgym_env.harness.HarnessAdapter`
subclass). Invariants: names are case-insensitive and ``_`` equals ``-``; a runtime registration
wins over an entry point, which wins over a built-in of the same name; every failure is a
:class:`~clawgym_env.errors.RegistrationError` that names the kind, the close names ("did you
mean") and the available ones.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import threading
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from clawgym_env.errors import RegistrationError

_MISSING = object()


def _norm(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


class Registry:
    """Names → implementations of one kind of plugin (see the module doc)."""

    def __init__(self, kind: str, group: str, *, builtins: dict[str, str] | None = None,
                 base: type | None = None) -> None:
        self.kind = kind
        """Singular, for messages: ``harness``, ``suite``, ..."""
        self.group = group
        """The entry-point group plugin packages declare their entries in (``clawgym.harnesses``, ...)."""
        self.base = base
        self._builtins = {_norm(k): v for k, v in (builtins or {}).items()}
        self._runtime: dict[str, Any] = {}
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

    def _targets(self) -> dict[str, Any]:
        return {**self._builtins, **self._discovered(), **self._runtime}

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._targets())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _norm(name) in self._targets()

    def register(self, name: str, target: Any, *, replace: bool = False) -> None:
        """Register ``target`` (an object, or a ``"module[:attr]"`` string) under ``name`` at runtime."""
        key = _norm(name)
        if key in self._runtime and not replace:
            raise RegistrationError(f"{self.kind} {name!r} is already registered; pass replace=True to replace it")
        self._runtime[key] = target

    def unregister(self, name: str) -> None:
        """Forget a runtime registration (built-ins and entry points stay)."""
        self._runtime.pop(_norm(name), None)

    @contextlib.contextmanager
    def registered(self, name: str, target: Any) -> Iterator[None]:
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

    def load(self, name: str) -> Any:
        """The implementation registered as ``name`` (imported on first use)."""
        key = _norm(name)
        targets = self._targets()
        if key not in targets:
            raise self.unknown(name)
        target = targets[key]
        if not isinstance(target, str):
            return target
        return self._resolve(key, target)

    def _resolve(self, key: str, target: str) -> Any:
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise RegistrationError(f"{self.kind} {key!r} ({target}) could not be imported: {exc}; install the "
                                    f"package that provides it (`pip install -e .` for this project's own)") from exc
        if attr:
            try:
                obj: Any = module
                for part in attr.split("."):
                    obj = getattr(obj, part)
                return obj
            except AttributeError as exc:
                raise RegistrationError(f"{self.kind} {key!r}: {module_name} has no {attr!r}") from exc
        return self._by_convention(key, module)

    def _by_convention(self, key: str, module: Any) -> Any:
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

    def create(self, name: str, /, **options: Any) -> Any:
        """Instantiate (or call) the implementation registered as ``name`` with ``options``."""
        impl = self.load(name)
        try:
            return impl(**options)
        except TypeError as exc:
            if options and "argument" in str(exc):
                raise RegistrationError(f"bad options for {self.kind} {name!r}: {exc}") from exc
            raise


def _harness_base() -> type:
    from clawgym_env.harness import HarnessAdapter

    return HarnessAdapter


harnesses = Registry("harness", "clawgym.harnesses", base=_harness_base())
"""Harness adapters (entry points ``clawgym.harnesses``: a module defining one ``HarnessAdapter``)."""

suites = Registry("suite", "clawgym.suites")
"""Suite loaders ``(spec, data=None, **options) -> Suite`` (entry points ``clawgym.suites``; the name
``folder`` loads a folder of task dirs). Use :func:`load_suite`."""

graders = Registry("grader", "clawgym.graders", builtins={"reward.sh": "clawgym_env.grading.reward:ScriptGrader"})
"""Graders by the name a task carries in ``Task.grader`` (entry points ``clawgym.graders``)."""

sandboxes = Registry("sandbox", "clawgym.sandboxes",
                     builtins={"bwrap": "clawgym_env.sandbox.bwrap.sandbox:BwrapSandbox",
                               "docker": "clawgym_env.sandbox.docker.sandbox:DockerSandbox"})
"""Sandbox backends (classes implementing :class:`~clawgym_env.sandbox.Sandbox`)."""

policies = Registry("policy", "clawgym.policies", builtins={"scripted": "clawgym_env.policy.factories:scripted",
                                        "transformers": "clawgym_env.policy.factories:transformers",
                                        "tiny": "clawgym_env.policy.factories:tiny",
                                        "passthrough": "clawgym_env.policy.factories:passthrough",
                                        "vllm": "clawgym_env.policy.factories:vllm",
                                        "remote": "clawgym_env.policy.remote:from_spec"})
"""Policy factories by spec scheme: ``SCHEME[:REST]`` calls factory ``(REST, **kwargs) -> PolicyBackend``."""

algorithms = Registry("algorithm", "clawgym.algorithms")
"""Training algorithms (entry points ``clawgym.algorithms``: a module exporting ``Args`` and ``train``)."""

dialects = Registry("dialect", "clawgym.dialects", builtins={
    "openai_chat": "clawgym_env.proxy.dialects.openai_chat.dialect",
    "anthropic_messages": "clawgym_env.proxy.dialects.anthropic.dialect",
    "openai_responses": "clawgym_env.proxy.dialects.responses.dialect",
})
"""Wire-dialect modules of the serving proxy (their routes: :data:`clawgym_env.proxy.dialects.registry.DIALECTS`, which
loads each module from here and checks at import that both name the same dialects)."""

ALL: tuple[Registry, ...] = (harnesses, suites, graders, sandboxes, policies, algorithms, dialects)


def load_suite(spec: Any, data: Any = None, **options: Any) -> Any:
    """A :class:`~clawgym_env.task.Suite` from a registered suite name or a folder of task dirs."""
    from pathlib import Path

    if isinstance(spec, str) and spec in suites and _norm(spec) != "folder":
        return suites.load(spec)(spec, data=data, **options)
    text = str(spec)
    if isinstance(spec, Path) or "/" in text or text.startswith((".", "~")) or Path(text).expanduser().exists():
        return suites.load("folder")(spec, data=data, **options)
    raise suites.unknown(text)


def make_harness(name: str, /, **options: Any) -> Any:
    """A :class:`~clawgym_env.harness.HarnessAdapter` registered as ``name`` (``options`` go to it)."""
    return harnesses.create(name, **options)
