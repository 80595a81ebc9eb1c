"""What the fleet's scheduler needs of Ray itself: the lazy import, its error, and how each actor call's
arguments travel.

Invariants: Ray is imported only when called (:func:`import_ray`, an optional dependency); an adapter
travels by value with each episode unless its pickle is large (a reference in the object store costs
every call a fetch; see :data:`INLINE_MAX_BYTES`); cancelling an abandoned call never raises.
"""

from __future__ import annotations

import logging
from typing import Any

from clawgym_env.errors import ClawGymError
from clawgym_env.harness import HarnessAdapter

log = logging.getLogger("clawgym_env.fleet.scheduler")


class FleetError(ClawGymError):
    """The fleet could not start (Ray missing, no node with room, no worker came up)."""


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`FleetError` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise FleetError("the ray rollout backend needs Ray: pip install 'clawgym[ray]'") from exc
    return ray


INLINE_MAX_BYTES = 100 * 1024
"""An adapter whose pickle is at most this large travels by value with each episode (a reference in the
object store costs every call a fetch); a larger one is put in the object store once per batch."""


def by_value_or_ref(ray: Any, adapter: HarnessAdapter) -> Any:
    """``adapter`` itself when it is small (see :data:`INLINE_MAX_BYTES`), else its object-store reference."""
    try:
        small = len(ray.cloudpickle.dumps(adapter)) <= INLINE_MAX_BYTES
    except Exception:  # noqa: BLE001 - let ray.put report what cannot be pickled
        small = False
    return adapter if small else ray.put(adapter)


def cancel(ray: Any, ref: Any) -> None:
    """Cancel an abandoned episode's call, best effort (its late result is ignored anyway)."""
    try:
        ray.cancel(ref)
    except Exception as exc:  # noqa: BLE001 - best effort: the result is ignored anyway
        log.debug("fleet: cancelling an abandoned episode: %s", exc)
