"""Adapter options and the harness cache from the command line and config files (``--harness-opt KEY=VALUE``,
``--harness-cache-dir PATH``, ``harness_options:`` / ``harness_cache_dir:``): they reach the adapter's constructor,
and a bad key or value is a clear error (exit 2) naming what the adapter accepts."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from clawgym_cli.main import main
from clawgym_env.errors import ConfigError
from clawgym_env.plugins import harnesses
from clawgym_env.testing import EchoHarness
from harness_adapters.claude_code import ClaudeCodeAdapter
from harness_adapters.install import prefix_for
from harness_adapters.npm import NpmHarnessAdapter
from harness_adapters.options import build_harness, config_overrides, parse_harness_opts


def _episodes(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def _streams(episode: dict) -> set[bool]:
    calls = [json.loads(line) for line in Path(episode["calls_path"]).read_text().splitlines()]
    assert calls
    return {c["stream"] for c in calls}


def test_values_are_json_when_they_parse_else_strings():
    opts = parse_harness_opts(["stream=true", "n=3", "t=2.5", "none=null", "args=[\"-v\"]", "env={\"A\": \"1\"}",
                               "api=openai-responses", "quoted=\"3\"", "empty=", "eq=a=b", "n=4"])
    assert opts == {"stream": True, "n": 4, "t": 2.5, "none": None, "args": ["-v"], "env": {"A": "1"},
                    "api": "openai-responses", "quoted": "3", "empty": "", "eq": "a=b"}
    for bad in ("stream", "=1", "two words=1"):
        with pytest.raises(ConfigError, match="use KEY=VALUE"):
            parse_harness_opts([bad])


def test_run_option_reaches_the_adapter(tmp_path, capsys):
    """mini's own ``stream`` option changes what the harness sends: every captured call streams."""
    base = ["run", "--harness", "mini", "--task", "builtin/csv_total", "--json", "--out", str(tmp_path / "eps")]
    assert main([*base, "--harness-opt", "stream=true"]) == 0
    (streamed,) = _episodes(capsys)
    assert streamed["reward"] == 1.0 and _streams(streamed) == {True}
    assert main(base) == 0
    (plain,) = _episodes(capsys)
    assert plain["reward"] == 1.0 and _streams(plain) == {False}


def test_eval_and_harness_check_take_the_options(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    assert main(["eval", "--suite", "builtin", "--limit", "1", "--harness", "mini", "--harness-opt", "stream=true",
                 "--out", str(out), "--no-progress"]) == 0
    row = json.loads(out.read_text().splitlines()[0])
    episode_dir = Path(row["episode_dir"])
    assert row["reward"] == 1.0 and _streams({"calls_path": str(episode_dir / "calls.jsonl")}) == {True}
    capsys.readouterr()
    assert main(["harness", "check", "mini", "--harness-opt", "stream=true", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["streaming"] is True and report["reward"] == 1.0


@pytest.mark.parametrize("command", [["run", "--task", "builtin/csv_total"], ["eval", "--suite", "builtin"],
                                     ["harness", "check"], ["train"]])
def test_unknown_key_is_a_clear_error(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a train run would write runs/ here
    if command == ["train"]:
        config = tmp_path / "sft.yaml"
        config.write_text("algo: sft\nharness: mini\nsteps: 1\n")
        argv = ["train", "--config", str(config), "--harness-opt", "colour=1"]
    elif command[0] == "harness":
        argv = [*command, "mini", "--harness-opt", "colour=1"]
    else:
        argv = [*command, "--harness", "mini", "--harness-opt", "colour=1", "--out", str(tmp_path / "out.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "harness option colour unknown" in err and "'mini' accepts stream, command_timeout" in err
    assert "Traceback" not in err


def test_bad_form_and_bad_value_are_clear_errors(tmp_path, capsys):
    assert main(["run", "--harness", "mini", "--task", "builtin/csv_total", "--harness-opt", "stream"]) == 2
    assert "--harness-opt 'stream': use KEY=VALUE" in capsys.readouterr().err
    with harnesses.registered("echo", EchoHarness):
        assert main(["harness", "check", "echo", "--harness-opt", "client=carrier-pigeon"]) == 2
    err = capsys.readouterr().err
    assert "harness 'echo' refused its options (client='carrier-pigeon')" in err and "'openai' or 'http'" in err
    # an adapter that installs nothing has no cache: the flag is refused, saying why
    assert main(["run", "--harness", "mini", "--task", "builtin/csv_total", "--harness-cache-dir", str(tmp_path)]) == 2
    assert "'mini' has no harness cache" in capsys.readouterr().err


def test_the_cache_dir_is_where_the_adapter_looks(tmp_path, capsys):
    """Codex from an empty cache cannot launch; from a cache holding its pinned install it solves the task."""
    adapter = build_harness("codex", cache_dir=tmp_path / "empty")
    assert isinstance(adapter, NpmHarnessAdapter)
    assert str(adapter.prefix()).startswith(str(tmp_path / "empty"))
    assert "is not installed" in (adapter.missing() or "")
    base = ["run", "--harness", "codex", "--task", "builtin/csv_total", "--json", "--out", str(tmp_path / "eps")]
    assert main([*base, "--harness-cache-dir", str(tmp_path / "empty")]) == 0
    (failed,) = _episodes(capsys)
    assert failed["status"] == "infra_error" and "is not installed" in failed["error"]

    installed = prefix_for(adapter.package)
    if not (installed / ".clawgym-installed").exists():
        pytest.skip("codex is not installed in the project cache (`clawgym harness install codex`)")
    cache = tmp_path / "cache"
    cache.mkdir()
    copy = subprocess.run(["cp", "-al", str(installed), str(cache / installed.name)], capture_output=True)
    if copy.returncode != 0:  # another filesystem: hard links are impossible, copy the files
        shutil.copytree(installed, cache / installed.name, symlinks=True)
    assert build_harness("codex", cache_dir=cache).missing() is None
    assert main([*base, "--harness-cache-dir", str(cache)]) == 0
    (solved,) = _episodes(capsys)
    assert solved["status"] == "ok" and solved["reward"] == 1.0, solved


def test_config_file_options_reach_the_adapters(tmp_path):
    from trainers.train import apply_overrides, args_from_config, load_config

    config = tmp_path / "grpo.yaml"
    config.write_text("algo: grpo\nharnesses: {mini: 1.0, claude-code: 1.0}\n"
                      "harness_options: {mini: {stream: true, command_timeout: 30}, claude-code: {bare: true}}\n"
                      f"harness_cache_dir: {tmp_path / 'hcache'}\n")
    _, args = args_from_config(load_config(config))
    adapters = args.harness_adapters()
    assert adapters["mini"].stream is True and adapters["mini"].command_timeout == 30
    claude = adapters["claude-code"]
    assert isinstance(claude, ClaudeCodeAdapter) and claude.bare is True
    assert str(claude.prefix()).startswith(str(tmp_path / "hcache"))

    # the train command's flags: every harness of the run, its own entry winning
    flags = argparse.Namespace(harness_opts=["stream=false"], harness_cache_dir=str(tmp_path / "other"))

    config.write_text("algo: grpo\nharnesses: {mini: 1.0}\nharness_options: {mini: {stream: true}}\n")
    data = apply_overrides(load_config(config), config_overrides(flags))
    assert data["harness_options"]["*"] == {"stream": False}
    _, args = args_from_config(data)
    assert args.harness_cache_dir == str(tmp_path / "other")
    assert args.harness_adapters()["mini"].stream is True  # mini's own entry wins over "*"
    data = apply_overrides(load_config(config), config_overrides(flags) + ["harness_options.mini.stream=false"])
    mini = args_from_config(data)[1].harness_adapters()["mini"]
    assert mini.stream is False

    for bad, match in [("{mini: {colour: 1}}", "accepts stream, command_timeout"),
                       ("{codex: {model: x}}", "names codex, not a harness of this run")]:
        config.write_text(f"algo: sft\nharness: mini\nharness_options: {bad}\n")
        _, args = args_from_config(load_config(config))
        with pytest.raises(ConfigError, match=match):
            args.harness_adapters()
