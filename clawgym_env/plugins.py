"""One registry for every kind of plugin: harnesses, suites, graders, sandboxes, policies, algorithms, loggers.

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

A :class:`~clawgym_env.registry.Registry` is generic over the kind it builds (``Registry[Sandbox]``:
``load() -> Callable[..., Sandbox]``, ``create() -> Sandbox``); a
:class:`~clawgym_env.registry.ModuleRegistry` names modules. The registries of graders, sandboxes, policies
and dialects live with their kind (the engine's packages look them up without importing this module), the
loggers' with their seam (:mod:`clawgym_env.loggers`), and are re-exported here; harnesses, suites and
algorithms are declared here.

A target is ``"module:attr"`` or, by convention, a bare ``"module"`` that defines exactly one
implementation of the registry's base type (e.g. one :class:`~clawgym_env.harness.HarnessAdapter`
subclass). Invariants: names are case-insensitive and ``_`` equals ``-``; a runtime registration
wins over an entry point, which wins over a built-in of the same name; every failure is a
:class:`~clawgym_env.errors.RegistrationError` that names the kind, the close names ("did you
mean") and the available ones.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING

from clawgym_env.errors import RegistrationError
from clawgym_env.grading.grade import graders
from clawgym_env.loggers import loggers
from clawgym_env.policy import policies
from clawgym_env.proxy.dialects import dialects
from clawgym_env.registration import sync as _sync_env_ids
from clawgym_env.registry import ModuleRegistry, Registry, RegistryBase, _norm
from clawgym_env.sandbox import sandboxes

if TYPE_CHECKING:
    from clawgym_env.harness import HarnessAdapter
    from clawgym_env.task import Suite

__all__ = ["ALL", "ModuleRegistry", "Registry", "RegistryBase", "algorithms", "dialects", "graders", "harnesses",
           "load_suite", "loggers", "make_harness", "policies", "sandboxes", "suites"]

def _harness_base() -> type:
    from clawgym_env.harness import HarnessAdapter

    return HarnessAdapter


harnesses: Registry[HarnessAdapter] = Registry("harness", "clawgym.harnesses", base=_harness_base())
"""Harness adapters (entry points ``clawgym.harnesses``: a module defining one ``HarnessAdapter``). Each has a
Gymnasium id ``ClawGym/<Name>-v0``, kept in step with the registry (:mod:`clawgym_env.registration`)."""
harnesses.on_change(_sync_env_ids)

suites: Registry[Suite] = Registry("suite", "clawgym.suites")
"""Suite loaders ``(spec, data=None, **options) -> Suite`` (entry points ``clawgym.suites``; the name
``folder`` loads a folder of task dirs). Use :func:`load_suite`."""

algorithms = ModuleRegistry("algorithm", "clawgym.algorithms")
"""Training algorithms (entry points ``clawgym.algorithms``: a module exporting ``Args`` and ``train``)."""

ALL: tuple[RegistryBase, ...] = (harnesses, suites, graders, sandboxes, policies, algorithms, dialects, loggers)


def load_suite(spec: str | Path, data: str | Path | None = None, **options: object) -> Suite:
    """A :class:`~clawgym_env.task.Suite` from a registered suite name or a folder of task dirs.

    ``options`` are the suite loader's own keywords (each suite declares its own, e.g. a split or a
    limit); they are passed through unchanged, so they cannot be typed here."""
    if isinstance(spec, str) and spec in suites and _norm(spec) != "folder":
        return _call_suite_loader(spec, spec, data, options)
    text = str(spec)
    if isinstance(spec, Path) or "/" in text or text.startswith((".", "~")) or Path(text).expanduser().exists():
        return _call_suite_loader("folder", spec, data, options)
    raise suites.unknown(text)


def _call_suite_loader(name: str, spec: str | Path, data: str | Path | None, options: dict[str, object]) -> Suite:
    """``loader(spec, data=data, **options)`` of the suite registered as ``name`` (``data`` passed only when
    given); options the loader does not take, or a result that is not a Suite, are a RegistrationError."""
    from clawgym_env.task import Suite

    loader = suites.load(name)
    kwargs = {**options, **({"data": data} if data is not None else {})}
    try:
        signature = inspect.signature(loader)
    except (TypeError, ValueError):  # no introspectable signature: call it as is
        signature = None
    if signature is not None:
        try:
            signature.bind(spec, **kwargs)
        except TypeError as exc:
            raise RegistrationError(f"suite {name!r} does not take {sorted(kwargs)} ({exc}); its loader is "
                                    f"{getattr(loader, '__qualname__', loader)}{signature}") from None
    suite = loader(spec, **kwargs)
    if not isinstance(suite, Suite):
        raise RegistrationError(f"suite {name!r}: its loader {getattr(loader, '__qualname__', loader)} returned "
                                f"{type(suite).__name__}, not a clawgym_env.task.Suite; return a Suite")
    return suite


def make_harness(name: str, /, **options: object) -> HarnessAdapter:
    """A :class:`~clawgym_env.harness.HarnessAdapter` registered as ``name``; ``options`` are that adapter's
    own constructor keywords (each harness declares its own), passed through unchanged."""
    return harnesses.create(name, **options)
