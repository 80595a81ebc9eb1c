"""The fakes of :mod:`clawgym_env.testing` from a virtual environment, as a user's project runs them.

A real venv (``python -m venv --system-site-packages``, so it sees this install of ClawGym) is made in a
folder reached through a symlink, the layout that hid ``sys.executable`` from the sandbox: the sandbox
binds the interpreter's prefix by its real path. That venv's Python runs a whole EchoHarness episode
(real proxy, real bubblewrap sandbox, real tokenizer, real ``reward.sh``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clawgym_env.testing import sandbox_python

EPISODE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from clawgym_env import Runtime
    from clawgym_env.testing import EchoHarness, EchoScriptPolicy, echo_suite, sandbox_python
    out = Path(sys.argv[1])
    suite = echo_suite(out / "suite")
    rewards = {}
    with Runtime(EchoScriptPolicy(), out_dir=out / "episodes") as rt:
        for client in ("openai", "http"):
            result = rt.run(suite.get("say-hello"), EchoHarness(client=client))
            rewards[client] = [result.record.reward, result.record.status, len(result.calls), result.record.error]
    print(json.dumps({"prefix": sys.prefix, "base_prefix": sys.base_prefix, "executable": sys.executable,
                      "inside": sandbox_python(), "rewards": rewards}))
""")


def test_sandbox_python_is_this_interpreter_under_its_real_prefix():
    inside = Path(sandbox_python())
    assert inside.exists() and os.path.samefile(inside, sys.executable)
    assert str(inside).startswith(os.path.realpath(sys.prefix) + os.sep)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_echo_harness_episode_from_a_venv_reached_through_a_symlink(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    venv = link / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    script = tmp_path / "episode.py"
    script.write_text(EPISODE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    proc = subprocess.run([str(python), str(script), str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # it really ran from the venv, through the symlinked folder
    assert report["executable"] == str(python) and report["prefix"] == str(venv)
    assert report["prefix"] != report["base_prefix"]
    assert report["inside"] == str(real / "venv" / "bin" / "python")
    for client in ("openai", "http"):
        assert report["rewards"][client] == [1.0, "ok", 1, None], client
