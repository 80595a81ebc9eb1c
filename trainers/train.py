"""``clawgym train --config FILE``: a YAML or JSON config → an algorithm's ``Args`` → its loop.

A config is a mapping whose ``algo`` key names the algorithm (default ``grpo``); the algorithm is
the module ``trainers.<algo>``, which exports an ``Args`` dataclass and ``train(args) ->``
:class:`~trainers.summary.TrainSummary` (``grpo``, ``ppo``, ``sft``; a new algorithm needs only its
module). Every other key is a field of ``Args``; nested dataclasses (``policy:``) are nested
mappings. ``--set key=value`` overrides a key after the file is read (dotted for nested keys, the
value parsed as YAML: ``--set policy.lora_rank=8``). ``--log-backend NAME`` (repeatable) adds an experiment
tracker to ``log.backends`` (``tensorboard``, ``wandb`` or a plugin's: :mod:`trainers.loggers`).

Invariants: an unknown key, or a value of the wrong type, is an error naming the key (and close
matches) before anything runs (pydantic validates the ``Args`` dataclass, see
:mod:`trainers.config_doc`); ``--help-config ALGO`` prints every field with its type, default and
docstring; relative paths in the config stay relative to the current directory;
the run's resolved config is written to ``<out_dir>/config.json`` before training starts;
``--check-config`` validates the config against its model's ``config.json`` (a context above the model's positions
without ``policy.rope_scaling`` is refused, naming the YAML to add) and its harnesses, then exits
(:mod:`trainers.check_config`).

Data parallelism: ``--nproc-per-node N`` re-executes the command as ``python -m torch.distributed.run
--standalone --nproc-per-node N -m trainers.train ...`` (the same as launching ``torchrun`` yourself); every
rank reads the config and runs the algorithm's ``train``, which joins the process group
(:mod:`trainers.scale.fsdp`); rank 0 alone writes ``config.json`` and prints; the process group is left at
the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clawgym_env.errors import ClawGymError
from clawgym_env.jsontypes import JSONObject
from trainers.config_doc import ConfigError, describe, validate
from trainers.summary import TrainSummary


def load_config(path: str | Path) -> JSONObject:
    """Read a YAML (``.yaml``/``.yml``) or JSON config file into a dict."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        raise ConfigError(f"{path}: cannot parse ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of Args fields, got {type(data).__name__}")
    return data


def apply_overrides(data: JSONObject, overrides: list[str]) -> JSONObject:
    """``["a.b=1", ...]`` → nested keys set (values parsed as YAML)."""
    import yaml

    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: use KEY=VALUE (e.g. --set steps=3 or --set policy.lora_rank=8)")
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {p!r} is not a mapping")
        node[parts[-1]] = yaml.safe_load(raw)
    return data


def add_log_backends(data: JSONObject, names: list[str]) -> JSONObject:
    """``--log-backend NAME``: each name appended to the config's ``log.backends`` (a name already there once)."""
    if not names:
        return data
    log = data.setdefault("log", {})
    if not isinstance(log, dict):
        raise ConfigError(f"log: must be a mapping of log.* fields to add --log-backend, got {log!r}")
    current = log.get("backends") or []
    if not isinstance(current, list):
        raise ConfigError(f"log.backends: must be a list of logger names (e.g. [tensorboard, wandb]), got {current!r}")
    log["backends"] = [*current, *(n for n in dict.fromkeys(names) if n not in current)]
    return data


def algorithm(name: str):
    """The algorithm module registered as ``name`` (entry points ``clawgym.algorithms``: a module that
    exports an ``Args`` dataclass and ``train``)."""
    from clawgym_env.errors import RegistrationError
    from clawgym_env.plugins import algorithms

    try:
        module = algorithms.load(name)
    except RegistrationError as exc:
        raise ConfigError(f"algo: {exc}") from exc
    if not (hasattr(module, "Args") and hasattr(module, "train")):
        raise ConfigError(f"algorithm {name!r} ({module.__name__}) must export Args and train")
    return module


def available_algorithms() -> list[str]:
    """The registered algorithm names."""
    from clawgym_env.plugins import algorithms

    return algorithms.names()


def args_from_config(data: JSONObject) -> tuple[Any, Any]:
    """(algorithm module, its Args) from a config mapping."""
    data = dict(data)
    name = str(data.pop("algo", "grpo"))
    module = algorithm(name)
    return module, validate(module.Args, data)


def format_summary(summary: TrainSummary, wall_s: float) -> str:
    """The lines ``clawgym train`` prints at the end of a run."""
    last = summary.last
    lines = [f"== {summary.algo} finished in {wall_s:.1f} s: {summary.out_dir}"]
    shown_fields = {"steps": summary.steps, "version": summary.version, "episodes": summary.episodes,
                    "expert_kept": summary.expert.kept if summary.expert else None,
                    "checkpoint": summary.checkpoint, "model_dir": summary.model_dir, "metrics": summary.metrics,
                    "curves": summary.curves}
    for key, value in shown_fields.items():
        if value is not None:
            lines.append(f"   {key}: {value}")
    shown = {k: v for k, v in last.items() if k not in ("time",) and v is not None
             and (k.endswith(("reward_mean", "pass_rate", "episodes", "infra_failures")) or
                  k in ("step", "loss", "kl_rollout", "clip_fraction", "groups_trained", "groups", "token_nll"))}
    if shown:
        lines.append("   last step: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                   for k, v in shown.items()))
    return "\n".join(lines)


def run(config: str | Path | JSONObject, overrides: list[str] | None = None, *, resume: bool | None = None,
        log_backends: list[str] | None = None, echo=print) -> TrainSummary:
    """Load, check and run a config; prints and returns the summary. ``resume=False`` starts fresh
    even when ``out_dir`` holds a checkpoint (for algorithms that resume); ``log_backends`` are added to
    ``log.backends``."""
    data = load_config(config) if not isinstance(config, dict) else dict(config)
    data = apply_overrides(data, list(overrides or []))
    data = add_log_backends(data, list(log_backends or []))
    algo = str(data.get("algo", "grpo"))
    module, args = args_from_config(data)
    if hasattr(args, "harness_adapters"):
        args.harness_adapters()  # a bad harness option fails here, before anything is loaded or written
    from trainers.check_config import check_context

    check_context(args)  # a context above the model's positions (no rope scaling) fails here too
    if resume is not None and hasattr(args, "resume"):
        args.resume = resume
    out = Path(getattr(args, "out_dir", "runs/train"))
    out.mkdir(parents=True, exist_ok=True)
    main_rank = launched_rank() == 0
    if main_rank:
        (out / "config.json").write_text(json.dumps({"algo": algo,
                                                     **dataclasses.asdict(args)}, indent=2))
    t0 = time.perf_counter()
    summary = module.train(args)
    if main_rank:
        echo(format_summary(summary, time.perf_counter() - t0))
    return summary


def check_only(config: str | Path | JSONObject, overrides: list[str] | None = None, *,
               log_backends: list[str] | None = None, echo=print) -> int:
    """``clawgym train --check-config``: validate the config and run :func:`trainers.check_config.check_config`
    (a failure raises the :class:`ConfigError` naming the fix); prints what held and returns 0."""
    from trainers.check_config import check_config

    data = load_config(config) if not isinstance(config, dict) else dict(config)
    data = add_log_backends(apply_overrides(data, list(overrides or [])), list(log_backends or []))
    _, args = args_from_config(data)
    lines = check_config(args)
    echo("\n".join([f"config OK: {config if not isinstance(config, dict) else 'the given mapping'} "
                     f"(algo {data.get('algo', 'grpo')})", *(f"   {line}" for line in lines)]))
    return 0


def launched_rank() -> int:
    """This process's rank as the launcher (``torchrun``) set it; 0 without one."""
    return int(os.environ.get("RANK", "0"))


def launch_command(nproc: int, argv: list[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m trainers.train ARGV``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "trainers.train", *argv]


def relaunch(args: argparse.Namespace) -> int:
    """Run ``args`` again on ``args.nproc_per_node`` ranks (module docstring); returns the launcher's status."""
    argv = ["--config", str(args.config), *[x for item in args.overrides for x in ("--set", item)]]
    if args.no_resume:
        argv.append("--no-resume")
    argv += [x for name in args.log_backends for x in ("--log-backend", name)]
    root = str(Path(__file__).resolve().parent.parent)  # the project, importable by the ranks
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run(launch_command(args.nproc_per_node, argv), env=env).returncode


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``clawgym train`` options."""
    p.add_argument("--config", help="YAML or JSON file: algo + the algorithm's Args fields")
    p.add_argument("--help-config", metavar="ALGO", nargs="?", const="grpo",
                   help="print every config field of ALGO (default grpo) with its type, default and meaning")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted for nested keys), e.g. --set steps=3")
    p.add_argument("--no-resume", action="store_true", help="start fresh even if out_dir has a checkpoint")
    p.add_argument("--check-config", action="store_true",
                   help="check the config against its model's config.json and the harnesses, then exit (nothing is "
                        "trained, loaded or written)")
    from harness_adapters.options import add_harness_arguments

    add_harness_arguments(p)  # for every harness of the run: config_overrides turns them into --set items
    p.add_argument("--log-backend", dest="log_backends", action="append", default=[], metavar="NAME",
                   help="also send the metrics to this experiment tracker (repeatable): tensorboard, wandb, or a "
                        "plugin's (added to log.backends; options under log.wandb / log.options.NAME)")
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="train data-parallel on N ranks of this node (FSDP2; re-runs under torch.distributed.run, "
                        "as `torchrun --nproc-per-node N -m trainers.train ...` does); rank 0 runs the rollouts")
    return p


def main_args(args: argparse.Namespace) -> int:
    """Run ``clawgym train`` from parsed arguments; returns the exit status."""
    if args.help_config:
        print(f"Fields of trainers.{args.help_config}.Args (set them in the config or with --set KEY=VALUE):\n")
        print(describe(algorithm(args.help_config).Args))
        return 0
    if not args.config:
        raise ConfigError("--config FILE is required (or --help-config ALGO to list the fields; algorithms: "
                          f"{', '.join(available_algorithms())})")
    from harness_adapters.options import config_overrides

    args.overrides = [*args.overrides, *config_overrides(args)]  # before a relaunch, which forwards --set items
    if getattr(args, "check_config", False):
        return check_only(args.config, list(args.overrides), log_backends=list(args.log_backends))
    if args.nproc_per_node < 1:
        raise ConfigError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if args.nproc_per_node > 1 and "WORLD_SIZE" not in os.environ:
        return relaunch(args)
    from trainers.scale.fsdp import destroy_distributed

    try:
        run(args.config, list(args.overrides), resume=False if args.no_resume else None,
            log_backends=list(args.log_backends))
    finally:
        destroy_distributed()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``clawgym train`` as a standalone program; a configuration error exits 2 with its message."""
    parser = add_arguments(argparse.ArgumentParser(prog="clawgym train", description=__doc__.splitlines()[0]))
    try:
        return main_args(parser.parse_args(argv))
    except ClawGymError as exc:
        print(f"clawgym train: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
