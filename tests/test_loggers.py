"""Experiment trackers behind one seam (:mod:`clawgym_env.loggers`): TensorBoard, Weights & Biases, plugins.

A real two-step GRPO run of the tiny policy through the mini harness (``clawgym train``, bwrap sandbox) with the
backends ``tensorboard``, ``wandb`` (offline: no network) and runtime-registered plugins: the TensorBoard event file
(read with TensorBoard's own reader) and the W&B offline run (its ``.wandb`` history, records of W&B's own protobuf
schema) hold every numeric metric of ``metrics.jsonl`` at its step; a plugin receives the same values and the
config; a plugin that fails to open or to log is a warning and the run finishes. Then the errors: an unknown
backend names the registered ones, a missing ``wandb`` package names the extra to install, a bad option its key.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from clawgym_env.errors import ConfigError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.loggers import Logger, LoggerContext, MetricScalar, loggers
from trainers.loggers.args import LogArgs
from trainers.loggers.wandb_logger import WandbArgs, WandbLogger
from trainers.metrics import MetricsLogger, read_metrics

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/install.sh)")


class Recorder:
    """A plugin tracker keeping everything it is given."""

    opened: list[Recorder] = []

    def __init__(self, context: LoggerContext) -> None:
        self.context = context
        self.configs: list[JSONObject] = []
        self.rows: list[tuple[int, dict[str, MetricScalar]]] = []
        self.closed = 0
        Recorder.opened.append(self)

    def log_config(self, config: JSONObject) -> None:
        self.configs.append(config)

    def log_metrics(self, step: int, metrics: Mapping[str, MetricScalar]) -> None:
        self.rows.append((step, dict(metrics)))

    def close(self) -> None:
        self.closed += 1


class FailsToLog(Recorder):
    """A plugin tracker whose every log call raises (a tracker's service gone)."""

    def log_metrics(self, step: int, metrics: Mapping[str, MetricScalar]) -> None:
        super().log_metrics(step, metrics)
        raise ConnectionError("tracker service unreachable")


def fails_to_open(context: LoggerContext) -> Logger:
    """A plugin tracker whose factory raises something other than a configuration error."""
    raise TimeoutError("tracker login timed out")


@pytest.fixture
def plugins(monkeypatch):
    """The three plugin trackers, registered at runtime for the test only."""
    Recorder.opened = []
    with loggers.registered("recorder", Recorder), loggers.registered("fails-to-log", FailsToLog), \
            loggers.registered("fails-to-open", fails_to_open):
        yield


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    """W&B with no network and no account: offline, its settings and caches under the test's folder."""
    pytest.importorskip("wandb")
    for var, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": tmp_path / "wb-config",
                       "WANDB_CACHE_DIR": tmp_path / "wb-cache", "WANDB_DATA_DIR": tmp_path / "wb-data"}.items():
        monkeypatch.setenv(var, str(value))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def numbers(row: Mapping[str, MetricScalar]) -> dict[str, float]:
    """The numeric metrics of a row (what a tracker plots), without ``step`` and ``time``."""
    return {k: float(v) for k, v in row.items()
            if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)}


def wandb_records(path: Path) -> Iterator[object]:
    """The records of a ``.wandb`` file: a 7-byte header (``:W&B``, magic, version), then records in 32 KiB blocks,
    each chunk a 7-byte header (crc32, length, type: full, first, middle, last), parsed as W&B's ``Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _, size, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + size], pos + 7 + size
        if kind == 0:  # zero padding up to the next block
            pos += left - 7 - size
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def wandb_run(out: Path) -> tuple[dict[int, dict[str, float]], JSONObject]:
    """(history by step, config) of the one W&B offline run under ``out/wandb``."""
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    history: dict[int, dict[str, float]] = {}
    config: JSONObject = {}
    for record in wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in record.history.item}
            history[int(row.pop("_step"))] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind in ("config", "run"):
            items = record.config.update if kind == "config" else record.run.config.update
            config.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items})
    return history, config


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """tag → {step: value} of the event files in ``folder``, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


@needs_bwrap
def test_a_training_run_reaches_tensorboard_wandb_and_plugins(tmp_path, plugins, wandb_offline, capsys, caplog):
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    from test_train_cli import make_suite, write_config

    from clawgym_cli.main import main

    out = tmp_path / "run"
    cfg = write_config(tmp_path / "grpo.yaml", out, make_suite(tmp_path), steps=2)
    caplog.set_level(logging.WARNING, logger="trainers.metrics")
    argv = ["train", "--config", str(cfg), "--set", "log.wandb.project=clawgym-test"]
    for name in ("tensorboard", "wandb", "recorder", "fails-to-log", "fails-to-open"):
        argv += ["--log-backend", name]
    assert main(argv) == 0
    assert "grpo finished" in capsys.readouterr().out
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    want = {int(r["step"]): numbers(r) for r in rows}  # type: ignore[arg-type]
    assert all({"version", "step_s", "episodes"} <= set(w) for w in want.values())

    # TensorBoard: every numeric metric at its step (event values are float32)
    scalars = tensorboard_scalars(out / "tb")
    for step, metrics in want.items():
        for key, value in metrics.items():
            assert scalars[key][step] == pytest.approx(value, rel=1e-6, abs=1e-30), key
    assert set(scalars) == {k for m in want.values() for k in m}

    # W&B offline run: the same history, and the run's config
    history, config = wandb_run(out)
    assert set(history) == {1, 2}
    for step, metrics in want.items():
        assert history[step] == pytest.approx(metrics, rel=1e-12), step
    assert config["steps"] == 2 and config["log"]["backends"][:2] == ["tensorboard", "wandb"]
    assert (out / "wandb" / "run_id").read_text().strip() in str(next((out / "wandb").glob("offline-run-*")))

    # the plugins: the same values (not only the numbers), the config once, closed once
    recorder, failing = Recorder.opened
    assert [type(r) for r in Recorder.opened] == [Recorder, FailsToLog]
    assert recorder.rows == [(int(r["step"]), {k: v for k, v in r.items() if k not in ("step", "time")})  # type: ignore
                             for r in rows]
    assert len(recorder.configs) == 1 and recorder.configs[0]["steps"] == 2 and recorder.closed == 1
    assert recorder.context.out_dir == out and recorder.context.start_step == 1 and recorder.context.run_name == "run"
    assert len(failing.rows) == 1 and failing.closed == 0  # dropped after its first failure, never called again
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'fails-to-open' could not be opened" in w and "TimeoutError" in w for w in warned), warned
    assert any("'fails-to-log' failed in log_metrics" in w and "unreachable" in w for w in warned), warned


def test_trackers_get_the_same_clean_values_and_a_failing_one_is_dropped(tmp_path, plugins, caplog):
    log = LogArgs(backends=["recorder", "fails_to_log", "Recorder", "jsonl"], options={"recorder": {"level": 3}})
    assert log.trackers() == ["recorder", "fails-to-log"]  # normalised, each once, the always-on jsonl left out
    metrics = MetricsLogger(tmp_path, start_step=1, log=log, config={"seed": 7})
    for step in (1, 2, 3):
        metrics.log(step, {"loss": 1.0 / step, "kl": float("nan"), "note": "ok", "flag": True, "none": None})
    metrics.close()
    metrics.close()
    recorder, failing = Recorder.opened
    assert recorder.context.options == {"level": 3} and failing.context.options == {}
    assert recorder.configs == [{"seed": 7}] and recorder.closed == 1
    assert [r for r in recorder.rows] == [(s, {"loss": 1.0 / s, "kl": None, "note": "ok", "flag": True, "none": None})
                                          for s in (1, 2, 3)]
    assert [(r["step"], r["loss"], r["kl"]) for r in read_metrics(tmp_path)] == [(s, 1.0 / s, None) for s in (1, 2, 3)]
    assert len(failing.rows) == 1 and set(metrics.failures) == {"fails-to-log"}
    assert sum("fails-to-log" in r.getMessage() for r in caplog.records) == 1


def test_the_default_opens_no_tracker_and_the_tensorboard_flag_is_a_backend(tmp_path):
    assert LogArgs().trackers() == []
    metrics = MetricsLogger(tmp_path)
    metrics.log(1, {"loss": 0.5})
    metrics.close()
    assert metrics.trackers == {} and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert LogArgs(tensorboard=True).trackers() == ["tensorboard"]
    assert LogArgs(backends=["tensorboard"], tensorboard=True).trackers() == ["tensorboard"]


def test_tensorboard_of_a_resumed_run_drops_the_steps_it_redoes(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    log = LogArgs(backends=["tensorboard"])
    first = MetricsLogger(tmp_path, start_step=1, log=log)
    for step in (1, 2, 3):
        first.log(step, {"loss": float(step)})
    first.close()
    resumed = MetricsLogger(tmp_path, start_step=3, log=log)  # the checkpoint of step 2: step 3 is redone
    resumed.log(3, {"loss": 30.0})
    resumed.close()
    assert tensorboard_scalars(tmp_path / "tb")["loss"] == {1: 1.0, 2: 2.0, 3: 30.0}
    assert [r["loss"] for r in read_metrics(tmp_path)] == [1.0, 2.0, 30.0]


def test_a_resumed_run_continues_its_wandb_run(tmp_path, wandb_offline):
    log = LogArgs(backends=["wandb"], wandb=WandbArgs(project="clawgym-test", tags=["unit"]))
    first = MetricsLogger(tmp_path, start_step=1, log=log)
    first.log(1, {"loss": 1.0})
    first.close()
    run_id = (tmp_path / "wandb" / "run_id").read_text().strip()
    resumed = MetricsLogger(tmp_path, start_step=2, log=log)
    resumed.log(2, {"loss": 0.5})
    resumed.close()
    folders = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all((f / f"run-{run_id}.wandb").is_file() for f in folders)
    assert (tmp_path / "wandb" / "run_id").read_text().strip() == run_id and not first.failures | resumed.failures


def test_an_unknown_backend_names_the_registered_ones(tmp_path, capsys):
    from test_train_cli import write_config

    from clawgym_cli.main import main

    cfg = write_config(tmp_path / "grpo.yaml", tmp_path / "run", tmp_path, steps=1)
    assert main(["train", "--config", str(cfg), "--log-backend", "tensorbord"]) == 2
    err = capsys.readouterr().err
    assert "log.backends" in err and "unknown logger backend 'tensorbord'" in err and "did you mean tensorboard" in err
    assert "available: jsonl, tensorboard, wandb" in err
    assert not (tmp_path / "run").exists()  # refused before anything ran
    with pytest.raises(ConfigError, match="unknown logger backend 'mlflow'.*available: jsonl, tensorboard, wandb"):
        LogArgs(backends=["mlflow"])


def test_bad_wandb_options_name_the_key(tmp_path, capsys):
    from test_train_cli import write_config

    from clawgym_cli.main import main

    cfg = write_config(tmp_path / "grpo.yaml", tmp_path / "run", tmp_path, steps=1)
    assert main(["train", "--config", str(cfg), "--set", "log.wandb.mode=sometimes"]) == 2
    assert "log.wandb.mode" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"log.wandb.projekt: .*\(fields: project, entity"):
        WandbLogger(LoggerContext(tmp_path, "run", options={"projekt": "x"}))


def test_a_missing_wandb_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, as when not installed
    with pytest.raises(ConfigError, match=r"pip install clawgym\[trackers\]"):
        WandbLogger(LoggerContext(tmp_path, "run"))
    with pytest.raises(ConfigError, match=r"wandb package .*pip install clawgym\[trackers\]"):  # stops the run
        MetricsLogger(tmp_path, log=LogArgs(backends=["wandb"]))


def test_loggers_is_a_registry_kind_like_the_others():
    from clawgym_env import plugins

    assert plugins.loggers is loggers and loggers in plugins.ALL and loggers.group == "clawgym.loggers"
    assert {"jsonl", "tensorboard", "wandb"} <= set(loggers.names())
