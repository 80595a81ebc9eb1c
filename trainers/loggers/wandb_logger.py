"""The ``wandb`` tracker: a Weights & Biases run per training run (its options: :class:`WandbArgs`, ``log.wandb``).

Online, the run shows up in the W&B project; offline (``log.wandb.mode: offline`` or ``WANDB_MODE=offline``) it needs
no network and no account: the run is written to ``<out_dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb`` and
``wandb sync <that folder>`` uploads it later.

Invariants: each numeric metric of a step is logged at that step (``bool``, ``str`` and ``None`` values are left
out); the config is the W&B run's config; the W&B run id is kept in ``<out_dir>/wandb/run_id``, and a run resumed
at step ``s > 1`` continues that W&B run (W&B ignores the steps at or below the last one it holds, so the steps a
resumed run redoes keep their first values there, while ``metrics.jsonl`` and TensorBoard hold the redone ones).
The ``wandb`` package is imported only when the tracker is opened; without it, opening is a
:class:`~clawgym_env.errors.ConfigError` naming ``pip install clawgym[trackers]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

import pydantic

from clawgym_env.errors import ConfigError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.loggers import LoggerContext, MetricScalar

__all__ = ["RUN_ID_FILE", "WandbArgs", "WandbLogger"]

RUN_ID_FILE = "run_id"
"""The file under ``<out_dir>/wandb`` that keeps the W&B run id for a resumed run."""


@dataclasses.dataclass
class WandbArgs:
    """Weights & Biases options (``log.wandb.*``), used when ``wandb`` is one of ``log.backends``."""

    project: str = "clawgym"
    """the W&B project the run is logged to"""
    entity: str | None = None
    """the W&B team or user owning the project (``None``: the account's default entity)"""
    name: str | None = None
    """the run's display name (``None``: the name of ``out_dir``)"""
    group: str | None = None
    """a W&B group gathering related runs (e.g. the seeds of one experiment)"""
    tags: list[str] = dataclasses.field(default_factory=list)
    """W&B tags of the run"""
    mode: Literal["online", "offline", "disabled"] | None = None
    """``online``; ``offline`` (no network: the run stays in ``<out_dir>/wandb`` until ``wandb sync``);
    ``disabled``; ``None``: the ``WANDB_MODE`` environment variable, else online"""


WandbArgs.__pydantic_config__ = pydantic.ConfigDict(extra="forbid")  # type: ignore[attr-defined]


def wandb_args(options: JSONObject) -> WandbArgs:
    """:class:`WandbArgs` from the tracker's options; a :class:`ConfigError` naming each bad key otherwise."""
    try:
        return pydantic.TypeAdapter(WandbArgs).validate_python(options, strict=False)
    except pydantic.ValidationError as exc:
        bad = "; ".join(f"log.wandb.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{bad} (fields: {', '.join(f.name for f in dataclasses.fields(WandbArgs))})") from None


class WandbLogger:
    """A :class:`~clawgym_env.loggers.Logger` logging to a Weights & Biases run (see the module invariants)."""

    def __init__(self, context: LoggerContext) -> None:
        args = wandb_args(context.options)
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError(f"the wandb logger needs the wandb package ({exc}): pip install clawgym[trackers]") \
                from exc
        folder = context.out_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / RUN_ID_FILE
        resuming = context.start_step > 1 and id_file.is_file()
        run_id = id_file.read_text(encoding="utf-8").strip() if resuming else None
        self._run = wandb.init(project=args.project, entity=args.entity, name=args.name or context.run_name,
                               group=args.group, tags=list(args.tags) or None, mode=args.mode,
                               dir=str(context.out_dir), id=run_id, resume="allow" if resuming else None)
        id_file.write_text(self._run.id + "\n", encoding="utf-8")
        self.run_dir = self._run.dir
        """the W&B run's local ``files`` folder (its parent holds the ``.wandb`` history file)"""

    def log_config(self, config: JSONObject) -> None:
        """The config as the W&B run's config."""
        self._run.config.update(config, allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, MetricScalar]) -> None:
        """The numeric metrics of ``step`` as one W&B history row at that step."""
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self._run.log(numbers, step=step)

    def close(self) -> None:
        """Finish the W&B run (offline: its folder is complete, ready for ``wandb sync``)."""
        self._run.finish()
