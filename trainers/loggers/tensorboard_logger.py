"""The ``tensorboard`` tracker: TensorBoard event files under ``<out_dir>/tb`` (``tensorboard --logdir OUT/tb``).

Invariants: each numeric metric of a step is one scalar of that tag at that step (``bool``, ``str`` and ``None``
values are left out); the event file is flushed after every step, so a live TensorBoard shows it at once; a run
resumed at step ``s`` purges the events of steps ``>= s`` a previous process wrote (the steps it redoes); the
config is one text entry, ``config``, as indented JSON. It takes no options.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from clawgym_env.errors import ConfigError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.loggers import LoggerContext, MetricScalar

__all__ = ["TB_DIR", "TensorBoardLogger"]

TB_DIR = "tb"
"""The folder under the run's ``out_dir`` that holds the event files."""


class TensorBoardLogger:
    """A :class:`~clawgym_env.loggers.Logger` writing TensorBoard event files (see the module invariants)."""

    def __init__(self, context: LoggerContext) -> None:
        if context.options:
            raise ConfigError(f"the tensorboard logger takes no options, got {sorted(context.options)}")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError(f"the tensorboard logger needs the tensorboard package ({exc}): "
                              "pip install clawgym[trackers]") from exc
        self.log_dir = context.out_dir / TB_DIR
        self._start = context.start_step
        self._writer = SummaryWriter(str(self.log_dir), purge_step=context.start_step or None)

    def log_config(self, config: JSONObject) -> None:
        """The config as one text entry (a Markdown code block, so TensorBoard keeps its indentation)."""
        text = "\n".join("    " + line for line in json.dumps(config, indent=2, default=str).splitlines())
        self._writer.add_text("config", text, global_step=self._start)
        self._writer.flush()

    def log_metrics(self, step: int, metrics: Mapping[str, MetricScalar]) -> None:
        """One scalar per numeric metric at ``step``, then a flush."""
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()
