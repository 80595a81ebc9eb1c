"""Gymnasium ids for every registered harness: ``ClawGym/<Name>-v0`` for the bundled ones, for one declared
by a real entry point (a ``*.dist-info`` folder on ``sys.path``) and for one registered at runtime, which
runs a real episode through ``gym.make`` (echo harness, bubblewrap sandbox)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest

import clawgym_env
from clawgym_env import plugins
from clawgym_env.errors import RegistrationError
from clawgym_env.registration import env_id_for, env_name

ADAPTER = textwrap.dedent("""
    from clawgym_env.harness import HarnessAdapter, HarnessOutput, LaunchSpec
    class GymAgent(HarnessAdapter):
        name = "cgt-gym-agent"
        def launch(self, task, endpoint, *, home): return LaunchSpec(argv=["true"])
        def read_output(self, stdout, stderr): return HarnessOutput(stdout)
""")


def test_the_bundled_harnesses_keep_their_ids():
    ours = {i: gym.spec(i).kwargs["harness"] for i in gym.registry if i.startswith("ClawGym/")}
    assert {"ClawGym/Mini-v0": "mini", "ClawGym/OpenClaw-v0": "openclaw", "ClawGym/ClaudeCode-v0": "claude-code",
            "ClawGym/Codex-v0": "codex", "ClawGym/QwenCode-v0": "qwen-code"}.items() <= ours.items()
    assert set(plugins.harnesses.names()) == set(ours.values())  # one id per registered harness, no other
    assert dict(clawgym_env.ENV_IDS) == ours
    assert env_id_for("claude_code") == "ClawGym/ClaudeCode-v0"
    assert (env_name("opencode"), env_name("my_agent"), env_name("mini-swe-agent")) == ("OpenCode", "MyAgent",
                                                                                        "MiniSweAgent")


@pytest.fixture
def site(tmp_path):
    """A distribution declaring the harness ``cgt-gym-agent`` (entry point), on ``sys.path`` for the test."""
    info = tmp_path / "cgt_gym-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cgt-gym\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[clawgym.harnesses]\ncgt-gym-agent = cgt_gym_agent_mod\n")
    (tmp_path / "cgt_gym_agent_mod.py").write_text(ADAPTER)
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cgt_gym_agent_mod", None)
        importlib.invalidate_caches()
        plugins.harnesses.refresh()


def test_an_entry_point_harness_has_its_id_at_import_and_after_a_refresh(site):
    # a fresh process: `import clawgym_env` alone registers the id (no plugin imported)
    code = ("import json, sys, gymnasium as gym, clawgym_env\n"
            "spec = gym.spec('ClawGym/CgtGymAgent-v0')\n"
            "print(json.dumps([spec.kwargs, 'clawgym_env.plugins' in sys.modules,\n"
            "                  'cgt_gym_agent_mod' in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [{"harness": "cgt-gym-agent"}, False, False]
    # this process: the registry's refresh brings the id in, and the id makes that harness's environment
    assert "ClawGym/CgtGymAgent-v0" not in gym.registry
    plugins.harnesses.refresh()
    assert env_id_for("cgt-gym-agent") == "ClawGym/CgtGymAgent-v0"
    assert gym.spec("ClawGym/CgtGymAgent-v0").kwargs == {"harness": "cgt-gym-agent"}
    sys.path.remove(str(site))
    try:
        plugins.harnesses.refresh()  # uninstalled: its id goes with it
        assert "ClawGym/CgtGymAgent-v0" not in gym.registry
    finally:
        sys.path.insert(0, str(site))


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_runtime_harness_runs_an_episode_through_gym_make(tmp_path):
    from clawgym_env.testing import EchoHarness, EchoScriptPolicy, echo_suite

    suite = echo_suite(tmp_path / "suite")
    with plugins.harnesses.registered("cgt-echo", EchoHarness):
        assert env_id_for("cgt-echo") == "ClawGym/CgtEcho-v0"
        assert clawgym_env.ENV_IDS["ClawGym/CgtEcho-v0"] == "cgt-echo"
        env = gym.make("ClawGym/CgtEcho-v0", policy=EchoScriptPolicy(), suite=suite, out_dir=tmp_path / "eps",
                       harness_options={"client": "http"})
        try:
            env.reset(options={"task_id": "say-hello"})
            _, reward, terminated, truncated, info = env.step(None)
        finally:
            env.close()
        assert (reward, terminated, truncated, info["status"]) == (1.0, True, False, "ok")
    assert "ClawGym/CgtEcho-v0" not in gym.registry
    with pytest.raises(gym.error.NameNotFound):
        gym.make("ClawGym/CgtEcho-v0")


def test_an_unknown_id_or_harness_says_what_there_is():
    with pytest.raises(gym.error.NameNotFound, match="Did you mean: `QwenCode`"):
        gym.make("ClawGym/QwenCod-v0")
    with pytest.raises(RegistrationError) as err:
        env_id_for("qwen-cod")
    msg = str(err.value)
    assert "no environment runs harness 'qwen-cod'; did you mean qwen-code" in msg
    assert "ClawGym/Mini-v0" in msg and "ClawGym/QwenCode-v0" in msg
