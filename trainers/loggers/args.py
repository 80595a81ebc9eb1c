"""The ``log:`` section of every algorithm's config: what a run shows and where its metrics go.

``<out_dir>/metrics.jsonl`` is always written (summaries, curves and resuming read it); ``backends`` adds
experiment trackers by registered name (:data:`clawgym_env.loggers.loggers`): ``tensorboard``, ``wandb`` (options in
``log.wandb``) or a plugin's (options in ``log.options.<name>``). ``clawgym train --log-backend NAME`` adds one
from the command line.

Invariants: an unknown backend name is a :class:`~clawgym_env.errors.ConfigError` when the config is read, naming
the registered ones; :meth:`LogArgs.trackers` lists each tracker once (names normalised as the registry does), never
``jsonl`` (always on), and ``tensorboard`` when ``log.tensorboard`` is set.
"""

from __future__ import annotations

import dataclasses

from clawgym_env.errors import ConfigError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.loggers import loggers
from trainers.loggers.wandb_logger import WandbArgs

__all__ = ["ALWAYS_ON", "LogArgs"]

ALWAYS_ON = "jsonl"
"""The tracker every run has: ``<out_dir>/metrics.jsonl``; naming it in ``backends`` changes nothing."""


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


@dataclasses.dataclass
class LogArgs:
    """What a run shows and draws, and the experiment trackers its metrics go to besides ``metrics.jsonl``
    (``log.*``)."""

    backends: list[str] = dataclasses.field(default_factory=list)
    """experiment trackers the metrics also go to, by registered name: ``tensorboard`` (``<out_dir>/tb``),
    ``wandb`` (Weights & Biases, see ``log.wandb``), or a plugin's (entry points ``clawgym.loggers``);
    ``metrics.jsonl`` is always written"""
    tensorboard: bool = False
    """also write TensorBoard event files into ``<out_dir>/tb`` (the same as ``tensorboard`` in ``backends``)"""
    wandb: WandbArgs = dataclasses.field(default_factory=WandbArgs)
    """Weights & Biases project, run name, mode (see the ``log.wandb.*`` fields), used when ``backends`` has
    ``wandb``"""
    options: dict[str, JSONObject] = dataclasses.field(default_factory=dict)
    """a plugin tracker's own options, by its name: ``{my-tracker: {key: value}}`` (the tracker checks them)"""
    plot: bool = True
    """draw ``curves.png`` from the metrics at the end"""
    progress: bool = True
    """show the run's progress: a bar (GRPO, SFT) or one line per step (PPO)"""

    def __post_init__(self) -> None:
        for name in self.backends:
            if name not in loggers:
                raise ConfigError(f"log.backends: {loggers.unknown(name, 'logger backend')}")

    def trackers(self) -> list[str]:
        """The trackers to open, in order, each once: ``backends`` (+ ``tensorboard`` when set) without ``jsonl``."""
        names = [*self.backends, *(["tensorboard"] if self.tensorboard else [])]
        out: list[str] = []
        for name in map(_norm, names):
            if name != ALWAYS_ON and name not in out:
                out.append(name)
        return out

    def options_for(self, name: str) -> JSONObject:
        """The options given to the tracker ``name``: ``log.wandb`` for ``wandb``, else ``log.options.<name>``."""
        if _norm(name) == "wandb":
            return dataclasses.asdict(self.wandb)
        return next((dict(v) for k, v in self.options.items() if _norm(k) == _norm(name)), {})
