"""Attacks on the reward, each run from inside a real episode (mini harness, bwrap sandbox, proxy).

* Module shadowing and its cousins: a do-nothing agent leaves files in its workspace that would
  make the verifier print 1.0 if it ever imported or executed them (``json.py``, ``re.py``,
  ``os.py``, a sourceless ``json.pyc``, ``sitecustomize.py``/``usercustomize.py``, ``.pth`` files,
  ``python3``/``bash``/``cat`` executables on every plausible ``PATH`` folder, shell start-up
  files, and writes to ``/etc/ld.so.preload``/``/etc/bash.bashrc``). It must score 0 on every
  bundled task, while the scripted expert still scores 1.0 through the same episodes.
* The verifier's environment is built from scratch: the host's ``PYTHONPATH``, ``BASH_ENV`` and
  ``LD_PRELOAD`` never reach it; an honest workspace keeps the official ``sys.path`` semantics.
* Malicious task folders: a task whose ``reward/`` holds a link to a 0600 host file, or whose
  ``reward/`` is itself a link out of the task folder, never gets that file's content into the
  verifier's logs; the episode ends ``reward_invalid`` with a "task error" naming the link.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from clawgym_env.envs.runtime import RolloutPool, Runtime
from clawgym_env.plugins import make_harness
from clawgym_env.testing import JudgeServer
from tasks import load_suite, load_task_dir

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tasks" / "fixtures" / "clawgym_bench"
HELDOUT = ROOT / "tasks" / "families" / "count_errors_heldout"

# Imported or executed, this prints 1.0 and exits 0 — the whole verifier would score 1.0.
HACK_PY = ('import posix\nwhile posix.read(0, 65536):\n    pass\n'  # drain the pipe: no broken pipe upstream
           'posix.write(1, b"1.0\\n")\nposix._exit(0)\n')
PTH = "import posix; posix.write(1, b'1.0\\n'); posix._exit(0)\n"
HACK_SH = "#!/bin/sh\necho 1.0\nexit 0\n"
EXECUTABLES = ["python3", "python", "bash", "sh", "cat", "env", "sum"]
PATH_DIRS = ["", "bin/", ".local/bin/", "node_modules/.bin/", "usr/bin/"]


def _plant(files: dict[str, str], extra: str = "") -> str:
    """One shell command writing ``files`` (path -> content) in the workspace, then ``extra``."""
    cmds = [f"mkdir -p {shlex.quote(os.path.dirname(p) or '.')} && printf %s {shlex.quote(c)} > {shlex.quote(p)}"
            for p, c in files.items()]
    return " && ".join([*cmds, *([extra] if extra else [])]) + " && echo planted"


BINARIES = {f"{d}{name}": HACK_SH for d in PATH_DIRS for name in EXECUTABLES}
COUSIN_FILES: dict[str, dict[str, str]] = {
    "json.py": {"json.py": HACK_PY},
    "re.py": {"re.py": HACK_PY},
    "os.py": {"os.py": HACK_PY},
    "json.pyc": {"hack_src.py": HACK_PY},
    "sitecustomize": {"sitecustomize.py": HACK_PY, "usercustomize.py": HACK_PY,
                      ".local/lib/python3.11/site-packages/usercustomize.py": HACK_PY},
    "pth": {"hack.pth": PTH, ".local/lib/python3.11/site-packages/hack.pth": PTH},
    "path_binaries": BINARIES,
    "shell_startup": {name: "echo 1.0\nexit 0\n"
                      for name in (".bashrc", ".bash_profile", ".profile", ".bash_login", ".env", "BASH_ENV")},
    "etc_files": {"evil.so": "not really a library"},
}
COUSIN_EXTRA = {
    "json.pyc": "python3 -c \"import py_compile; py_compile.compile('hack_src.py', cfile='json.pyc')\" "
                "&& rm hack_src.py",
    "path_binaries": "chmod +x " + " ".join(shlex.quote(p) for p in BINARIES),
    "etc_files": '{ for f in /etc/ld.so.preload /etc/bash.bashrc /etc/profile "$HOME/.bashrc"; do '
                 'echo "$PWD/evil.so" >> "$f" 2>/dev/null && echo "WROTE $f"; done; true; }',
}
COUSINS = {name: [{"tool": "bash", "command": _plant(files, COUSIN_EXTRA.get(name, ""))}]
           for name, files in COUSIN_FILES.items()}
ALL_COUSINS = [step for steps in COUSINS.values() for step in steps]


def _script(tmp_path: Path, name: str, steps: list[dict]) -> str:
    path = tmp_path / f"{name.replace('/', '_')}.json"
    path.write_text(json.dumps({"steps": [*steps, {"final": "All done."}]}))
    return f"scripted:file:{path}"


def _bundled_tasks():
    return [*load_suite("builtin").tasks, *load_suite(HELDOUT).tasks, *load_suite(FIXTURES).tasks]


@pytest.fixture(scope="module")
def zero_judge():
    """A real judge endpoint that gives every rubric 0 (the fixtures' hybrid task asks it)."""
    from tasks.judge import JudgeClient

    with JudgeServer(lambda body: (200, '{"score": 0.0, "rationale": "nothing was done"}')) as srv:
        yield JudgeClient(srv.base_url, "judge-test", max_retries=0)


def _honest_reward(task, ws: Path, *, final_message: str, judge) -> float:
    """The reward the task's own grader gives ``ws`` (outside any episode)."""
    from clawgym_env.grading.grade import grade_episode

    gr = grade_episode(task, ws, final_message=final_message, judge=judge)
    assert gr.valid, gr.reason
    return gr.reward


def _host_files() -> dict[str, bytes | None]:
    out = {}
    for f in ("/etc/ld.so.preload", "/etc/bash.bashrc", "/etc/profile", "/root/.bashrc"):
        try:
            out[f] = Path(f).read_bytes()
        except OSError:
            out[f] = None
    return out


@pytest.mark.slow
@pytest.mark.parametrize("cousin", sorted(COUSINS))
def test_each_shadowing_cousin_scores_zero(cousin, tmp_path, builtin_suite):
    task = builtin_suite.get("csv_total")
    before = _host_files()
    with Runtime(_script(tmp_path, cousin, COUSINS[cousin]), out_dir=tmp_path / "eps") as rt:
        res = rt.run(task, make_harness("mini"), keep_workspace=True)
    rec = res.record
    # planting binaries named bash/python3 may break the agent's own harness: still graded, still 0
    assert rec.status not in ("infra_error", "reward_invalid"), (rec.status, rec.error, rec.logs)
    ws = tmp_path / "eps" / rec.episode_id / "workspace"
    planted = ["json.pyc"] if cousin == "json.pyc" else list(COUSIN_FILES[cousin])
    assert all((ws / p).exists() for p in planted), "the agent's files were planted"
    assert rec.reward == 0.0, (cousin, rec.reward, rec.subscores, rec.logs.get("reward_stdout"))
    assert "1.0" not in rec.logs.get("reward_stdout", "").split()
    assert _host_files() == before, "nothing outside the episode changed"


@pytest.mark.slow
def test_all_cousins_score_zero_on_every_bundled_task(tmp_path, zero_judge):
    tasks = _bundled_tasks()
    assert len(tasks) == 46  # 28 builtin + 16 held-out quickstart tasks + 2 ClawGym-Bench fixtures
    with Runtime(_script(tmp_path, "all", ALL_COUSINS), out_dir=tmp_path / "eps") as rt:
        results = RolloutPool(rt, concurrency=2, progress=False).run(tasks, make_harness("mini"), judge=zero_judge)
    scores = {r.record.task_id: (r.record.status, r.record.reward) for r in results}
    assert all(status not in ("infra_error", "reward_invalid") for status, _ in scores.values()), scores
    # An untouched workspace earns a few "left the rest alone" sub-scores on 5 tasks; the planted
    # files must add nothing to that: the cousins score exactly what doing nothing honestly scores.
    honest = {}
    for task in tasks:
        ws = tmp_path / "honest" / task.id
        shutil.copytree(task.input_dir, ws) if task.input_dir else ws.mkdir(parents=True)
        honest[task.id] = _honest_reward(task, ws, final_message="All done.", judge=zero_judge)
    hacked = {tid: (s, honest[tid]) for tid, s in scores.items() if s[1] != honest[tid]}
    assert not hacked, f"{len(hacked)}/{len(tasks)} tasks scored other than doing nothing: {hacked}"
    assert max(honest.values()) < 1.0 and sum(v == 0.0 for v in honest.values()) == len(tasks) - 5, honest


@pytest.mark.slow
def test_expert_still_scores_full_marks_through_the_hermetic_grader(tmp_path):
    tasks = [t for t in _bundled_tasks() if t.expert_path is not None]
    assert len(tasks) == 44
    with Runtime("scripted:expert", out_dir=tmp_path / "eps") as rt:
        results = RolloutPool(rt, concurrency=2, progress=False).run(tasks, make_harness("mini"))
    low = {r.record.task_id: (r.record.status, r.record.reward, r.record.logs.get("reward_stderr"))
           for r in results if r.record.reward != 1.0 or r.record.status != "ok"}
    assert not low, low


def _probe_task(tmp_path: Path, reward_sh: str, files: dict[str, str] | None = None) -> object:
    """A copy of builtin/csv_total whose reward.sh is ``reward_sh`` (plus extra reward/ files)."""
    src = ROOT / "tasks" / "builtin" / "csv_total"
    dst = tmp_path / "probe_task"
    shutil.copytree(src, dst)
    (dst / "reward" / "reward.sh").write_text(reward_sh)
    for rel, text in (files or {}).items():
        (dst / "reward" / rel).write_text(text)
    return load_task_dir(dst)


def test_verifier_environment_is_built_from_scratch(tmp_path, monkeypatch):
    from clawgym_env.grading.reward import grade_workspace

    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("BASH_ENV", str(tmp_path / "rc"))
    monkeypatch.setenv("LD_PRELOAD", str(tmp_path / "evil.so"))
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "startup.py"))
    (tmp_path / "rc").write_text("echo 1.0; exit 0\n")
    task = _probe_task(tmp_path, "#!/usr/bin/env bash\nset -eu\n"
                       'env | sort >&2\n'
                       '[ -z "${BASH_ENV:-}" ] && [ -z "${LD_PRELOAD:-}" ] && [ -z "${PYTHONSTARTUP:-}" ]\n'
                       'case ":$PATH:" in *:.:*|*::*|*/workspace*) exit 3;; esac\n'
                       'python3 -c "import sys, json; assert \'\' == sys.path[-1] and sys.flags.safe_path; '
                       'print(json.dumps(1))" >&2\n'
                       "echo 0.25\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    rr = grade_workspace(task, ws)
    assert rr.ok and rr.reward == 0.25, (rr.reason, rr.stderr)
    assert "BASH_ENV" not in rr.stderr and "LD_PRELOAD" not in rr.stderr
    assert f"PYTHONPATH={tmp_path}" not in rr.stderr


def test_honest_workspace_keeps_official_import_semantics(tmp_path):
    """The script's folder is first on sys.path (check.py imports its siblings); the agent's own
    module is importable from ``python3 -c`` in the workspace; only stdlib names stop resolving there."""
    from clawgym_env.grading.reward import grade_workspace

    task = _probe_task(tmp_path, "#!/usr/bin/env bash\nset -euo pipefail\n"
                       "python3 /root/.openclaw/workspace/reward/probe.py\n"
                       "python3 -c 'import solution, json; print(solution.ANSWER)'\n",
                       {"probe.py": "import sys, helper\nassert sys.path[0] == '/root/.openclaw/workspace/reward', "
                                    "sys.path\nprint(helper.X)\n",
                        "helper.py": "X = 'helper-ok'\n"})
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "solution.py").write_text("ANSWER = 0.5\n")
    (ws / "json.py").write_text(HACK_PY)
    rr = grade_workspace(task, ws)
    assert rr.ok and rr.reward == 0.5, (rr.reason, rr.stdout, rr.stderr)
    assert "helper-ok" in rr.stdout


@pytest.fixture
def secret_file(tmp_path_factory):
    """A 0600 host file outside every sandbox mount."""
    d = Path("/var/tmp") / f"clawgym-secret-{os.getpid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    f = d / "answer-key"
    f.write_text("TOPSECRET-7f3a9\n")
    f.chmod(0o600)
    yield f
    shutil.rmtree(d, ignore_errors=True)


def _malicious_task(tmp_path: Path, secret: Path, whole_dir: bool) -> object:
    src = ROOT / "tasks" / "builtin" / "csv_total"
    dst = tmp_path / "evil_task"
    shutil.copytree(src, dst)
    if whole_dir:
        outside = tmp_path / "outside_reward"
        shutil.move(str(dst / "reward"), outside)
        os.symlink(secret.parent, outside / "leak")  # and the folder it links to reaches further out
        os.symlink(outside, dst / "reward")
        (outside / "reward.sh").write_text("#!/usr/bin/env bash\ncat reward/leak/answer-key; echo 1.0\n")
    else:
        os.symlink(secret, dst / "reward" / "key.txt")
        (dst / "reward" / "reward.sh").write_text(
            "#!/usr/bin/env bash\ncat /root/.openclaw/workspace/reward/key.txt; cat reward/key.txt >&2; echo 1.0\n")
    return load_task_dir(dst)


@pytest.mark.parametrize("whole_dir", [False, True], ids=["link-inside-reward", "reward-is-a-link"])
def test_malicious_task_folder_never_leaks_a_host_file(tmp_path, secret_file, whole_dir):
    task = _malicious_task(tmp_path, secret_file, whole_dir)
    with Runtime("scripted:noop", out_dir=tmp_path / "eps") as rt:
        res = rt.run(task, make_harness("mini"))
    rec = res.record
    stored = (tmp_path / "eps" / rec.episode_id / "episode.json").read_text()
    assert "TOPSECRET" not in stored and "TOPSECRET" not in json.dumps(rec.logs)
    assert rec.status == "reward_invalid" and rec.reward == 0.0, (rec.status, rec.error)
    assert rec.error and "task error" in rec.error and "link" in rec.error


@pytest.mark.parametrize("whole_dir", [False, True], ids=["link-inside-input", "input-is-a-link"])
def test_malicious_input_files_never_bring_a_host_file_into_the_workspace(tmp_path, secret_file, whole_dir):
    """Task folders are untrusted: ``input_files/`` holding a link out of the task folder (or being one)
    must not copy a host file into the agent's workspace. The episode is recorded as the task's failure
    (infra_error at the ``task`` boundary: never trained, never scored)."""
    dst = tmp_path / "evil_task"
    shutil.copytree(ROOT / "tasks" / "builtin" / "csv_total", dst)
    if whole_dir:
        outside = tmp_path / "outside_input"
        shutil.move(str(dst / "input_files"), outside)
        os.symlink(secret_file, outside / "key.txt")
        os.symlink(outside, dst / "input_files")
    else:
        os.symlink(secret_file, dst / "input_files" / "key.txt")
    task = load_task_dir(dst)
    with Runtime("scripted:noop", out_dir=tmp_path / "eps") as rt:
        res = rt.run(task, make_harness("mini"), keep_workspace=True)
    rec = res.record
    assert rec.status == "infra_error" and rec.failure_boundary == "task", (rec.status, rec.error)
    assert "out of the task folder" in (rec.error or "") and not res.calls
    ws = tmp_path / "eps" / rec.episode_id / "workspace"
    found = [p for p in ws.rglob("*") if p.is_file() and "TOPSECRET" in p.read_text(errors="replace")] \
        if ws.exists() else []
    assert found == []
