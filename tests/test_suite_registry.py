"""Suites and graders through the registries, from every place that names them.

A suite registered at runtime (``plugins.suites.registered``, as a plugin's entry point would be) is listed
by ``clawgym tasks list``, runs through ``clawgym run`` / ``clawgym eval`` / ``harness check`` with the
mini harness and the scripted expert (real sandboxes, the real proxy), loads through the trainers'
loader and ``gym.make``; a task dir's ``data_entry.json`` names its grader (a runtime-registered one
grades it, an unknown name is a load issue naming the task, the name and the registered graders); each
shipped suite name resolves to its own loader, as ``pyproject.toml`` declares.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clawgym_cli.main import main
from clawgym_env import plugins
from clawgym_env.errors import RegistrationError, TaskError
from clawgym_env.grading.grader import GradeContext, GradeResult
from clawgym_env.task import Suite
from clawgym_env.testing import EchoTaskSpec, echo_suite
from tasks import load_suite, load_task_dir, resolve_task
from tasks.suite_loaders import LOADERS
from tasks.taskfolder import load_task_folder

ROOT = Path(__file__).resolve().parent.parent
SPECS = (EchoTaskSpec("say-hello", "hello", expect="hello"), EchoTaskSpec("say-bye", "bye", expect="bye"))


@pytest.fixture()
def extra(tmp_path):
    """The suite ``extra``, registered at runtime: two echo tasks in a folder of task dirs."""
    folder = tmp_path / "extra-tasks"
    echo_suite(folder, SPECS)
    calls: list[tuple[str, object]] = []

    def load_extra(spec: str, data: str | Path | None = None) -> Suite:
        calls.append((spec, data))
        return load_task_folder(folder, "extra")

    with plugins.suites.registered("extra", load_extra):
        yield calls


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# ---- the shipped suites ------------------------------------------------------------------------

def test_each_shipped_suite_name_resolves_to_its_own_loader():
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["clawgym.suites"]
    assert declared == {name: f"tasks.suite_loaders:{fn.__name__}" for name, fn in LOADERS.items()}
    assert len({fn for fn in LOADERS.values()}) == len(LOADERS), "one loader per suite"
    for name, fn in LOADERS.items():
        assert plugins.suites.load(name) is fn, name


def test_shipped_loaders_refuse_what_they_do_not_take(tmp_path):
    builtin = load_suite("builtin")
    assert builtin.name == "builtin" and len(builtin) > 10 and not builtin.issues
    assert plugins.load_suite("BUILTIN").name == "builtin"  # named by the registry, not by the spelling typed
    with pytest.raises(TaskError, match="takes no data"):
        load_suite("builtin", data=tmp_path)
    with pytest.raises(RegistrationError, match=r"suite 'builtin' does not take \['split'\].*builtin_suite"):
        plugins.load_suite("builtin", split="main")
    with pytest.raises(TaskError, match="needs the JobBench data"):
        load_suite("jobbench-easy")


def test_a_loader_that_returns_no_suite_is_named():
    with plugins.suites.registered("broken", lambda spec, data=None: [1, 2]):
        with pytest.raises(RegistrationError, match="suite 'broken'.*returned list, not a clawgym_env.task.Suite"):
            plugins.load_suite("broken")


# ---- a suite registered at runtime -------------------------------------------------------------

def test_tasks_list_lists_a_registered_suite_and_names_close_ones(extra, capsys):
    assert main(["tasks", "list", "--suite", "extra"]) == 0
    out = capsys.readouterr().out
    assert [line.split("\t")[0] for line in out.splitlines()] == ["extra/say-bye", "extra/say-hello"]
    assert extra == [("extra", None)]
    assert main(["tasks", "list", "--task", "extra/say-hello"]) == 0
    assert capsys.readouterr().out.startswith("extra/say-hello\t")
    assert main(["tasks", "list", "--suite", "extar"]) == 2
    err = capsys.readouterr().err
    assert "unknown suite 'extar'; did you mean extra" in err and "builtin" in err


def test_run_and_eval_a_registered_suite(extra, tmp_path, capsys):
    rc = main(["run", "--suite", "extra", "--limit", "1", "--harness", "mini", "--policy", "scripted:expert",
               "--json", "--out", str(tmp_path / "eps")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    (row,) = _json_lines(out)
    assert (row["suite"], row["task_id"], row["status"], row["reward"]) == ("extra", "say-bye", "ok", 1.0), row

    results = tmp_path / "results.jsonl"
    rc = main(["eval", "--suite", "extra", "--limit", "1", "--harness", "mini", "--policy", "scripted:expert",
               "--out", str(results), "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    (res,) = _json_lines(results.read_text())
    assert (res["suite"], res["task_id"], res["status"], res["reward"]) == ("extra", "say-bye", "ok", 1.0), res
    assert "extra · mini · scripted:expert: Pass@1 1.000" in out


def test_harness_check_runs_a_task_of_a_registered_suite(extra, capsys):
    rc = main(["harness", "check", "mini", "--task", "extra/say-hello", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    assert (report["harness"], report["status"], report["reward"]) == ("mini", "ok", 1.0), report
    assert extra == [("extra", None)]  # the probe task was found through the registered loader


def test_trainers_and_gym_make_load_a_registered_suite(extra, tmp_path):
    import gymnasium as gym

    from trainers.config_doc import validate
    from trainers.grpo.train import Args

    args = validate(Args, {"suite": "extra", "eval": {"suite": "extra", "every": 1}})
    assert [t.full_id for t in load_suite(args.suite).tasks] == ["extra/say-bye", "extra/say-hello"]
    assert resolve_task("extra/say-hello").full_id == "extra/say-hello"
    env = gym.make("ClawGym/Mini-v0", policy="scripted:expert", suite="extra", out_dir=tmp_path / "env")
    try:
        obs, _ = env.reset(options={"task_id": "say-hello"})
        assert obs["task_id"] == "extra/say-hello"
        _, reward, terminated, truncated, info = env.step(None)
        assert (reward, terminated, truncated) == (1.0, True, False), info
    finally:
        env.close()


# ---- a grader named by data_entry.json ---------------------------------------------------------

class Quarter:
    """Scores every episode 0.25, with a subscore that says it ran."""

    name = "quarter"
    needs_judge = False

    def grade(self, ctx: GradeContext) -> GradeResult:
        return GradeResult(0.25, {"graded_by_quarter": 1.0, "saw_answer": float("hello" in (ctx.final_message or ""))},
                           scorer=self.name)


def _with_grader(tmp_path: Path, grader: object) -> Path:
    """A copy of the echo task ``say-hello`` whose data_entry.json names ``grader``."""
    folder = tmp_path / "graded"
    echo_suite(tmp_path / "src", SPECS[:1])
    shutil.copytree(tmp_path / "src" / "say-hello", folder / "say-hello")
    entry_path = folder / "say-hello" / "data_entry.json"
    entry = json.loads(entry_path.read_text())
    entry["grader"] = grader
    entry_path.write_text(json.dumps(entry))
    return folder / "say-hello"


def test_a_task_dir_names_a_runtime_registered_grader_that_grades_it(tmp_path, capsys):
    task_dir = _with_grader(tmp_path, "quarter")
    with plugins.graders.registered("quarter", Quarter):
        assert load_task_dir(task_dir).grader == "quarter"
        rc = main(["run", "--task", str(task_dir), "--harness", "mini", "--policy", "scripted:expert", "--json",
                   "--out", str(tmp_path / "eps")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    (row,) = _json_lines(out)
    assert row["status"] == "ok" and row["reward"] == 0.25, row
    assert row["subscores"] == {"graded_by_quarter": 1.0, "saw_answer": 1.0}, row
    assert load_task_dir(_with_grader(tmp_path / "b", "reward.sh")).grader == "reward.sh"
    assert load_task_dir(tmp_path / "src" / "say-hello").grader == "reward.sh"  # no key: the default


def test_an_unknown_grader_is_a_load_issue_naming_task_grader_and_registered_ones(tmp_path, capsys):
    task_dir = _with_grader(tmp_path, "quartr")
    with plugins.graders.registered("quarter", Quarter):
        with pytest.raises(TaskError) as ei:
            load_task_dir(task_dir)
        msg = str(ei.value)
        assert str(task_dir / "data_entry.json") in msg and "'quartr'" in msg
        assert "did you mean quarter?" in msg and "reward.sh" in msg and "hybrid" in msg

        suite = load_suite(task_dir.parent)
        assert suite.tasks == [] and [i.path for i in suite.issues] == [str(task_dir)]
        assert main(["tasks", "list", "--suite", str(task_dir.parent)]) == 0
    err = capsys.readouterr().err
    assert f"warning: skipped {task_dir}" in err and "unknown grader 'quartr'" in err


def test_a_grader_that_is_not_a_name_is_refused(tmp_path):
    with pytest.raises(TaskError, match="'grader' must be the name of a registered grader"):
        load_task_dir(_with_grader(tmp_path, 7))
