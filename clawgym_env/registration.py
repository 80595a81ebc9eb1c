"""ClawGym's Gymnasium environment ids: one per registered harness, ``ClawGym/<Name>-v0``.

``<Name>`` is the harness name's preferred spelling (:data:`PREFERRED_NAMES`, for names whose CamelCase is not
how the project writes them: ``openclaw`` → ``OpenClaw``), else its CamelCase (``claude-code`` →
``ClaudeCode``, ``my_agent`` → ``MyAgent``). Every id runs :class:`~clawgym_env.envs.env.ClawGymEnv` (a lazy
``module:Class`` entry point) with ``harness=<name>``.

Invariants: ``import clawgym_env`` registers an id for every harness of the ``clawgym.harnesses`` entry points
(read from the installed distributions' metadata, no plugin imported; before :mod:`clawgym_env.plugins` is
imported no runtime registration can exist and the harness registry has no built-ins, so these are all its
names); from then on the harness registry calls :func:`sync` after every runtime (un)registration and refresh,
so an id exists exactly while its harness is registered (ids of other code are never touched). Two names with
one id: the first name (sorted) keeps it and :func:`env_id_for` of the other says so. Episodes are not
reproducible bit for bit (process timing, ids in harness prompts), so every id is registered
``nondeterministic=True``; ``reset(seed=...)`` still picks the same task for a seed.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from importlib import metadata

import gymnasium as gym

ENTRY_POINT = "clawgym_env.envs.env:ClawGymEnv"
HARNESS_GROUP = "clawgym.harnesses"
"""The entry-point group of harness adapters (the ``harnesses`` registry's group)."""

PREFERRED_NAMES: dict[str, str] = {
    "openclaw": "OpenClaw",
    "opencode": "OpenCode",
}
"""Harness name → the ``<Name>`` of its id, where plain CamelCase would not spell it the project's way."""


def env_name(harness: str) -> str:
    """The ``<Name>`` of ``ClawGym/<Name>-v0`` for a harness name (see the module doc)."""
    key = harness.strip().lower().replace("_", "-")
    if key in PREFERRED_NAMES:
        return PREFERRED_NAMES[key]
    parts = [p for p in re.split(r"[^0-9A-Za-z]+", harness.strip()) if p]
    return "".join(p[:1].upper() + p[1:] for p in parts)


def _env_id(harness: str) -> str:
    return f"ClawGym/{env_name(harness)}-v0"


def _ours(env_id: str) -> str | None:
    """The harness the registered ``env_id`` runs if it is one of ours, else None."""
    spec = gym.registry.get(env_id)
    if spec is None or spec.entry_point != ENTRY_POINT or not env_id.startswith("ClawGym/"):
        return None
    harness = spec.kwargs.get("harness")
    return harness if isinstance(harness, str) else None


def harness_names() -> list[str]:
    """Every registered harness name: the ``harnesses`` registry's, or, before it is imported, the entry points
    of :data:`HARNESS_GROUP` (the same names then; see the module doc)."""
    plugins = sys.modules.get("clawgym_env.plugins")
    if plugins is not None and hasattr(plugins, "harnesses"):
        return list(plugins.harnesses.names())
    return sorted({ep.name.strip().lower().replace("_", "-") for ep in metadata.entry_points(group=HARNESS_GROUP)})


def sync(names: Iterable[str] | None = None) -> None:
    """Make the ClawGym ids those of ``names`` (default :func:`harness_names`): register the missing ones and
    remove ours whose harness is gone (idempotent; ids registered by other code are kept)."""
    wanted: dict[str, str] = {}
    for name in sorted(harness_names() if names is None else names):
        wanted.setdefault(_env_id(name), name)
    for env_id in [i for i in gym.registry if i.startswith("ClawGym/")]:
        harness = _ours(env_id)
        if harness is not None and wanted.get(env_id) != harness:
            del gym.registry[env_id]
    for env_id, harness in wanted.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"harness": harness},
                         nondeterministic=True, disable_env_checker=False)


def register_all() -> None:
    """Register an id for every registered harness with Gymnasium (idempotent; see :func:`sync`)."""
    sync()


class EnvIds(Mapping[str, str]):
    """env id → the harness it runs, for every registered harness, read live (a harness registered later has
    its id here too)."""

    def _table(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name in harness_names():
            out.setdefault(_env_id(name), name)
        return out

    def __getitem__(self, env_id: str) -> str:
        return self._table()[env_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return f"EnvIds({self._table()!r})"


ENV_IDS: Mapping[str, str] = EnvIds()
"""env id → harness, for every registered harness (live; see :class:`EnvIds`)."""


def env_id_for(harness: str) -> str:
    """The env id of a registered harness name; an unknown name (or one whose id another name holds) is a
    :class:`~clawgym_env.errors.RegistrationError` listing close names and the ids there are."""
    from clawgym_env.errors import RegistrationError

    key = harness.strip().lower().replace("_", "-")
    table = EnvIds()._table()
    env_id = _env_id(key)
    if table.get(env_id) == key:
        return env_id
    if key in harness_names() and env_id in table:
        raise RegistrationError(f"harness {harness!r} would have the env id {env_id}, which harness "
                                f"{table[env_id]!r} holds; use gym.make({env_id!r}, harness={key!r}) or rename one")
    close = difflib.get_close_matches(key, list(table.values()), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise RegistrationError(f"no environment runs harness {harness!r}{hint} (the ids: {', '.join(sorted(table))})")
