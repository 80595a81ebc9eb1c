"""Experiment trackers: the :class:`Logger` seam and the :data:`loggers` registry.

A training run writes its metrics to ``<out_dir>/metrics.jsonl`` (always: summaries, curves and resuming read it)
and to every tracker named in its config (``log.backends``: ``tensorboard``, ``wandb``, or any registered name).
A tracker is a :class:`Logger`, built by a factory registered under a name: this project's own are entry points of
group ``clawgym.loggers`` in its ``pyproject.toml`` (``jsonl``, ``tensorboard``, ``wandb``, implemented in the
trainers), and a third-party package declares its own the same way::

    [project.entry-points."clawgym.loggers"]
    my-tracker = "my_package.tracker:MyTracker"     # called as MyTracker(context) -> a Logger

or code registers one at runtime (``loggers.register("my-tracker", MyTracker)``).

The seam lives here, in the engine root, and not in the trainers: every registry is listed in
:mod:`clawgym_env.plugins` (which may not import the trainers), and a tracker package then needs only this module.

Invariants a :class:`Logger` may rely on (the trainers' metrics logger keeps them):

* it is opened, called and closed only on the main rank (rank 0) of a run, from one thread;
* :meth:`Logger.log_config` is called at most once, before the first :meth:`Logger.log_metrics`;
* the steps of :meth:`Logger.log_metrics` increase strictly within one process; a resumed run's first step is
  :attr:`LoggerContext.start_step`, which may repeat steps a tracker saw before the interruption;
* metric values are JSON scalars: ``int``, ``float`` (never NaN or infinite: those arrive as ``None``), ``str``,
  ``bool`` or ``None``; a tracker plots the numbers and may leave the rest out;
* :meth:`Logger.close` is called once, at the end of a run that finished.

And what a :class:`Logger` must keep: it never stops training. An exception it raises while logging is reported as
a warning and the tracker is dropped for the rest of the run; only a configuration error
(:class:`~clawgym_env.errors.ConfigError`: a missing package, a bad option) raised by its factory stops the run
before training starts, with its message naming the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, TypeAlias, runtime_checkable

from clawgym_env.jsontypes import JSONObject
from clawgym_env.registry import Registry

__all__ = ["Logger", "LoggerContext", "LoggerFactory", "MetricScalar", "loggers", "open_logger"]

MetricScalar: TypeAlias = int | float | str | bool | None
"""One metric value as a tracker receives it (a JSON scalar; never NaN or infinite)."""


@dataclasses.dataclass(frozen=True)
class LoggerContext:
    """What a tracker's factory is given when a run opens its trackers."""

    out_dir: Path
    """the run's folder: a tracker keeps its local files under it (``tb/``, ``wandb/``, ...)"""
    run_name: str
    """a name for the run in the tracker (the run folder's name unless configured)"""
    start_step: int = 0
    """the first step this process logs: 0 or 1 for a fresh run, ``s`` for a run resumed at step ``s``"""
    options: JSONObject = dataclasses.field(default_factory=dict)
    """this tracker's own options from the run's config (``log.wandb`` for ``wandb``, ``log.options.<name>`` for
    a plugin); the tracker validates them and raises :class:`~clawgym_env.errors.ConfigError` on a bad one"""


@runtime_checkable
class Logger(Protocol):
    """An experiment tracker: receives a run's config once and its metrics at every logged step (see the module
    invariants)."""

    def log_config(self, config: JSONObject) -> None:
        """Record the run's resolved configuration (the ``Args`` of its algorithm, as JSON)."""
        ...

    def log_metrics(self, step: int, metrics: Mapping[str, MetricScalar]) -> None:
        """Record the metrics of ``step`` (keys such as ``reward_mean``, ``mini/pass_rate``, ``eval/pass_rate``)."""
        ...

    def close(self) -> None:
        """Flush and release what the tracker holds (files, a background process)."""
        ...


LoggerFactory: TypeAlias = Callable[[LoggerContext], Logger]
"""What a ``loggers`` entry is: a class or function called with the :class:`LoggerContext`."""

loggers: Registry[Logger] = Registry("logger", "clawgym.loggers")
"""Experiment trackers by name (entry points ``clawgym.loggers``: ``"module:Factory"``, called with a
:class:`LoggerContext`); also :data:`clawgym_env.plugins.loggers`."""


def open_logger(name: str, context: LoggerContext) -> Logger:
    """The tracker registered as ``name``, opened for ``context``; an unknown name is a
    :class:`~clawgym_env.errors.RegistrationError` that lists the registered ones."""
    return loggers.load(name)(context)
