"""Training metrics: one JSON line per step, the run's experiment trackers, PNG curves.

:class:`MetricsLogger` appends ``{"step", "time", ...}`` rows to ``<out_dir>/metrics.jsonl`` (:class:`JsonlLogger`)
and gives every row to the trackers named in the run's ``log:`` section (:class:`~trainers.loggers.args.LogArgs`:
TensorBoard, Weights & Biases, a plugin's; the seam is :class:`clawgym_env.loggers.Logger`).
:func:`plot_curves` draws ``<out_dir>/curves.png``: rollout reward, pass rate per harness, KL between
the rollout policy and the trained one, clip fraction and throughput.

Naming: per-harness keys are ``"<harness>/<metric>"`` (``mini/pass_rate``); evaluation keys start
with ``eval/``. :func:`rollout_metrics` computes the rollout ones from episode records.

Invariants: a logger opened with ``start_step = s`` keeps only the rows with ``step < s`` of an
existing file (a resumed run rewrites what it redoes; a fresh run, ``s = 0``, starts empty); every
value written is a JSON number, string or null (NaN/inf become null), and every tracker receives the same
values; a tracker that raises is warned about and dropped, never stopping training; reward means and pass rates
never include infrastructure failures, which are counted separately.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from clawgym_env.errors import ClawGymError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.loggers import Logger, LoggerContext, open_logger
from trainers.loggers.args import LogArgs

_log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"

MetricValue = int | float | str | bool | None
"""One metric as written (a JSON scalar)."""
MetricsRow = dict[str, MetricValue]
"""One logged row: ``step``, ``time`` and the step's metrics."""


def _clean(v: Any) -> MetricValue:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if hasattr(v, "item"):
        return _clean(v.item())
    return str(v)


def _step(row: MetricsRow) -> int:
    step = row.get("step")
    return step if isinstance(step, int) else 0


class JsonlLogger:
    """The ``jsonl`` tracker: ``<out_dir>/metrics.jsonl``, one ``{"step", "time", ...}`` row per logged step.

    Every run has it (:class:`MetricsLogger` writes the run's record through it; it is also registered as ``jsonl``
    for a plugin that wants the file). Opened with ``start_step = s``, it keeps only the rows with ``step < s`` of an
    existing file; the file is closed after every row, so a reader sees whole rows."""

    def __init__(self, context: LoggerContext) -> None:
        context.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = context.out_dir / METRICS_FILE
        start = context.start_step
        kept = [r for r in read_metrics(self.path) if _step(r) < start] if start > 0 else []
        with self.path.open("w", encoding="utf-8") as fh:
            for r in kept:
                fh.write(json.dumps(r) + "\n")

    def write(self, row: MetricsRow) -> None:
        """Append one whole row."""
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    def log_config(self, config: JSONObject) -> None:
        """Nothing: the run's config is ``<out_dir>/config.json`` (written by ``clawgym train``)."""

    def log_metrics(self, step: int, metrics: Mapping[str, MetricValue]) -> None:
        """Append the row of ``step`` (``time`` is now)."""
        self.write({"step": int(step), "time": time.time(), **{k: _clean(v) for k, v in metrics.items()}})

    def close(self) -> None:
        """Nothing to close: the file is closed after every row."""


class MetricsLogger:
    """A run's metrics: the ``metrics.jsonl`` record plus every tracker of ``log`` (see the module invariants).

    Opened on the main rank only. The trackers are opened here, by name, from
    :data:`clawgym_env.loggers.loggers`, and receive the config once and every row; a tracker whose factory raises
    a :class:`~clawgym_env.errors.ClawGymError` (unknown name, missing package, bad option) stops the run here,
    before training; one that raises anything else, then or later, is reported as a warning and dropped (its
    name and error kept in :attr:`failures`): a tracker never stops training."""

    def __init__(self, out_dir: str | Path, *, start_step: int = 0, log: LogArgs | None = None,
                 config: JSONObject | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.record = JsonlLogger(LoggerContext(self.out_dir, self.out_dir.resolve().name, start_step))
        self.path = self.record.path
        self.failures: dict[str, str] = {}
        """tracker name → the error that dropped it"""
        self.trackers: dict[str, Logger] = {}
        """the open trackers by name (without the ``metrics.jsonl`` record)"""
        log = log or LogArgs()
        for name in log.trackers():
            context = LoggerContext(self.out_dir, self.out_dir.resolve().name, start_step, log.options_for(name))
            try:
                self.trackers[name] = open_logger(name, context)
            except ClawGymError:
                self.close()
                raise
            except Exception as exc:  # noqa: BLE001 - a tracker never stops training
                self._drop(name, "could not be opened", exc)
        if config is not None:
            for name, tracker in list(self.trackers.items()):
                self._call(name, "log_config", functools.partial(tracker.log_config, config))

    def _drop(self, name: str, what: str, exc: BaseException) -> None:
        self.trackers.pop(name, None)
        self.failures[name] = f"{type(exc).__name__}: {exc}"
        _log.warning("logger %r %s (%s); training goes on without it", name, what, self.failures[name])

    def _call(self, name: str, what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - a tracker never stops training
            self._drop(name, f"failed in {what}", exc)

    def log(self, step: int, metrics: Mapping[str, Any]) -> MetricsRow:
        """Append one row (``step``, ``time`` and ``metrics`` made JSON-safe) to ``metrics.jsonl``, give the
        metrics to every tracker, and return the row."""
        clean = {k: _clean(v) for k, v in metrics.items() if k not in ("step", "time")}
        row: MetricsRow = {"step": int(step), "time": time.time(), **clean}
        self.record.write(row)
        for name, tracker in list(self.trackers.items()):
            self._call(name, "log_metrics", functools.partial(tracker.log_metrics, int(step), clean))
        return row

    def close(self) -> None:
        """Close every tracker (the JSONL file is closed after every row); a second call does nothing."""
        for name, tracker in list(self.trackers.items()):
            self._call(name, "close", tracker.close)
        self.trackers.clear()


def read_metrics(path: str | Path) -> list[MetricsRow]:
    """Rows of a metrics JSONL file ([] when absent); a torn last line is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def rollout_metrics(results: Iterable[Any], pass_threshold: float = 1.0, prefix: str = "") -> MetricsRow:
    """Reward mean, pass rate, episode and infra-failure counts, overall and per harness.

    Only task outcomes count as episodes; the others (``infra_error``, ``reward_invalid``) are
    ``infra_failures``, and per harness also ``<h>/not_scored/<status>/<boundary>``.

    ``results``: ``EpisodeResult`` s, ``EpisodeRecord`` s or ``(record, calls)`` pairs.
    """
    per: dict[str, list[float]] = defaultdict(list)
    infra: dict[str, int] = defaultdict(int)
    where: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    tokens = 0
    for item in results:
        rec = item[0] if isinstance(item, tuple) else getattr(item, "record", item)
        calls = item[1] if isinstance(item, tuple) else getattr(item, "calls", [])
        tokens += sum(len(c.output_token_ids) for c in calls)
        if not _is_outcome(rec):
            infra[rec.harness] += 1
            where[rec.harness][f"{rec.status}/{getattr(rec, 'failure_boundary', None) or '?'}"] += 1
            per.setdefault(rec.harness, [])
        else:
            per[rec.harness].append(float(rec.reward))
    out: MetricsRow = {}
    every = [r for rs in per.values() for r in rs]

    def fill(p: str, rewards: list[float], n_infra: int) -> None:
        out[f"{p}episodes"] = len(rewards)
        out[f"{p}infra_failures"] = n_infra
        out[f"{p}reward_mean"] = sum(rewards) / len(rewards) if rewards else None
        passed = sum(r >= pass_threshold for r in rewards)
        out[f"{p}passed"] = passed
        out[f"{p}pass_rate"] = passed / len(rewards) if rewards else None

    fill(prefix, every, sum(infra.values()))
    out[f"{prefix}sampled_tokens"] = tokens
    for h in sorted(per):
        fill(f"{prefix}{h}/", per[h], infra[h])
        for key, n in sorted(where[h].items()):  # e.g. mini/not_scored/infra_error/policy
            out[f"{prefix}{h}/not_scored/{key}"] = n
    return out


def _is_outcome(rec: Any) -> bool:
    """The reward is the agent's own outcome (not infra_error, not reward_invalid)."""
    outcome = getattr(rec, "is_task_outcome", None)
    return bool(outcome) if outcome is not None else not rec.is_infra_failure


def plot_curves(rows: list[MetricsRow] | str | Path, out: str | Path) -> Path | None:
    """Draw the training curves into ``out`` (a PNG path, or a folder → ``curves.png``); None without
    matplotlib or rows."""
    if not isinstance(rows, list):
        rows = read_metrics(rows)
    if not rows:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    out = Path(out)
    if out.suffix != ".png":
        out = out / CURVES_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r})
    harnesses = sorted({k.split("/")[0] for k in keys if k.endswith("/pass_rate") and not k.startswith("eval/")})
    panels = [
        ("rollout reward (mean)", ["reward_mean"] + [f"{h}/reward_mean" for h in harnesses]),
        ("pass rate", [f"{h}/pass_rate" for h in harnesses] + sorted(k for k in keys if k.startswith("eval/")
                                                                     and k.endswith("pass_rate"))),
        ("KL(rollout || trained), k3", ["kl_rollout"]),
        ("clip fraction", ["clip_fraction"]),
        ("tokens / s", ["train_tokens_per_s", "rollout_tokens_per_s"]),
        ("loss", ["loss", "kl_ref"]),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    for ax, (title, series) in zip(axes.flat, panels):
        drawn = False
        for key in series:
            pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", markersize=3, label=key)
                drawn = True
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
