"""What a training run returns: :class:`TrainSummary` (also written to ``<out_dir>/summary.json``).

Every algorithm's ``train(args)`` (:mod:`trainers.grpo.train`, :mod:`trainers.ppo.train`, :mod:`trainers.sft.train`)
returns one, and :func:`trainers.train.run` prints and returns it.

Invariants:
  * ``last`` is the last metrics row the run logged (``{}`` when it logged none, e.g. a resumed run
    that had nothing left to do); its values are JSON scalars (:data:`trainers.metrics.MetricsRow`);
  * ``eval_metrics`` is the ``eval/...`` part of ``last`` (the in-loop evaluation runs at the last step
    whenever it runs at all);
  * ``summary.json`` is :meth:`TrainSummary.to_dict` as JSON, and :meth:`TrainSummary.from_dict`
    reads it back equal;
  * paths are strings (as written to JSON); a path field is None when the run made no such file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

from trainers.metrics import MetricsRow, MetricValue

SUMMARY_FILE = "summary.json"


@dataclasses.dataclass(frozen=True)
class ExpertCounts:
    """The expert episodes an SFT run collected: all of them, kept ones, infrastructure failures."""

    episodes: int
    kept: int
    infra_failures: int
    reward_mean: float | None

    def as_metrics(self) -> MetricsRow:
        """The ``expert_*`` metrics an SFT run logs with every row."""
        return {"expert_episodes": self.episodes, "expert_kept": self.kept,
                "expert_infra_failures": self.infra_failures, "expert_reward_mean": self.reward_mean}


@dataclasses.dataclass(frozen=True)
class TrainSummary:
    """One finished training run (see the module invariants)."""

    algo: str
    """``grpo``, ``ppo`` or ``sft``"""
    out_dir: str
    steps: int
    """the configured number of steps (iterations for GRPO/PPO, optimiser steps for SFT)"""
    metrics: str
    """the metrics JSONL file"""
    last: MetricsRow = dataclasses.field(default_factory=dict)
    """the last logged metrics row"""
    version: int = 0
    """the policy version at the end (optimiser updates pushed to the serving policy; 0 for SFT)"""
    checkpoint: str | None = None
    """the latest checkpoint directory"""
    curves: str | None = None
    """``curves.png`` when plotted"""
    model_dir: str | None = None
    """SFT: the saved model directory (``save_model``)"""
    episodes: int | None = None
    """SFT: expert episodes trained on"""
    expert: ExpertCounts | None = None
    """SFT: the expert episodes collected (None when the episodes were given)"""
    train_s: float | None = None
    """SFT: seconds of training"""
    train_tokens: int | None = None
    """SFT: packed tokens processed"""

    @property
    def eval_metrics(self) -> dict[str, MetricValue]:
        """The in-loop evaluation of the last step (``eval/...`` keys of ``last``; empty without one)."""
        return {k: v for k, v in self.last.items() if k.startswith("eval/")}

    @property
    def final_loss(self) -> float | None:
        """The last logged loss, or None when none was logged."""
        value = self.last.get("loss")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def to_dict(self) -> dict[str, object]:
        """The summary as a JSON-ready mapping (what ``summary.json`` holds)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TrainSummary:
        """The summary of a :meth:`to_dict` mapping (unknown keys ignored)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in fields}
        expert = kw.get("expert")
        if isinstance(expert, Mapping):
            kw["expert"] = ExpertCounts(**expert)
        return cls(**kw)  # type: ignore[arg-type]

    def write(self, out_dir: str | Path | None = None) -> Path:
        """Write ``summary.json`` into ``out_dir`` (default: the run's own)."""
        path = Path(out_dir or self.out_dir) / SUMMARY_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str))
        return path


def read_summary(path: str | Path) -> TrainSummary:
    """A run's summary from its ``summary.json`` (or the run folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_FILE
    return TrainSummary.from_dict(json.loads(path.read_text(encoding="utf-8")))
