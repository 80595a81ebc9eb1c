"""Every builtin task is solvable, its wrong attempt is not, and its verifier never crashes.

Runs each task's scripted expert on the host (see ``tests/helpers_expert.py``); the sandboxed,
hermetic grading path is tested elsewhere.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tasks import load_expert, load_suite

try:  # tests/ is on sys.path under pytest's default import mode; a package layout also works
    from helpers_expert import (
        apply_steps,
        grade_on_host,
        run_check,
        run_reward_sh_on_host,
        stage_workspace,
        write_payload,
    )
except ImportError:  # pragma: no cover
    from tests.helpers_expert import (
        apply_steps,
        grade_on_host,
        run_check,
        run_reward_sh_on_host,
        stage_workspace,
        write_payload,
    )

TASKS = {t.id: t for t in load_suite("builtin")}
IDS = sorted(TASKS)


def _explain(g) -> str:
    return f"score={g.score} subscores={g.subscores} rc={g.returncode}\nstdout={g.stdout}\nstderr={g.stderr}"


def _assert_well_formed(g) -> None:
    assert g.returncode == 0, _explain(g)
    assert g.subscores, "check.py must print a non-empty JSON dict of sub-scores\n" + _explain(g)
    assert all(0.0 <= v <= 1.0 for v in g.subscores.values()), _explain(g)


@pytest.mark.parametrize("task_id", IDS)
def test_expert_steps_earn_full_reward(task_id, tmp_path):
    task = TASKS[task_id]
    ws = stage_workspace(task, tmp_path / "ws")
    run = apply_steps(load_expert(task).steps, ws)
    g = grade_on_host(task, ws, run.final, run.transcript)
    _assert_well_formed(g)
    assert g.score == 1.0, _explain(g)
    # The task's own reward.sh (reward/ laid into the workspace as in the sandbox) agrees.
    score, out = run_reward_sh_on_host(task, ws, tmp_path / f"{task.id}.payload.json")
    assert score == 1.0, out


@pytest.mark.parametrize("task_id", IDS)
def test_wrong_attempt_earns_less(task_id, tmp_path):
    task = TASKS[task_id]
    ws = stage_workspace(task, tmp_path / "ws")
    run = apply_steps(load_expert(task).wrong, ws)
    g = grade_on_host(task, ws, run.final, run.transcript)
    _assert_well_formed(g)
    assert g.score < 1.0, _explain(g)


@pytest.mark.parametrize("task_id", IDS)
def test_doing_nothing_earns_less_and_missing_payload_is_not_a_crash(task_id, tmp_path):
    task = TASKS[task_id]
    ws = stage_workspace(task, tmp_path / "ws")
    g = run_check(task, ws, None)  # no OPENCLAW_REWARD_PAYLOAD at all
    _assert_well_formed(g)
    assert g.score < 1.0, _explain(g)
    g = run_check(task, ws, tmp_path / "missing.json")  # the env var names no file
    _assert_well_formed(g)
    assert g.score < 1.0, _explain(g)


@pytest.mark.parametrize("task_id", IDS)
def test_empty_workspace_is_not_a_crash(task_id, tmp_path):
    task = TASKS[task_id]
    ws = tmp_path / "ws"
    ws.mkdir()
    g = grade_on_host(task, ws, None)
    _assert_well_formed(g)
    assert g.score < 1.0, _explain(g)


@pytest.mark.parametrize("task_id", IDS)
def test_garbage_outputs_are_not_a_crash(task_id, tmp_path):
    task = TASKS[task_id]
    ws = stage_workspace(task, tmp_path / "ws")
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    apply_steps(load_expert(task).steps, ws)
    for p in ws.rglob("*"):  # every file the expert created or changed becomes garbage
        if p.is_file() and before.get(p) != p.read_bytes():
            p.write_bytes(b"\xff\xfe\x00garbage {[ \n")
    payload = tmp_path / "garbage.json"
    payload.write_text("{not json")
    g = run_check(task, ws, payload)
    _assert_well_formed(g)
    assert g.score < 1.0, _explain(g)
    # A payload whose final_message has the wrong type is not a crash either.
    write_payload(task, payload, None)
    data = json.loads(payload.read_text())
    data["final_message"] = {"oops": 1}
    payload.write_text(json.dumps(data))
    _assert_well_formed(run_check(task, ws, payload))


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS)
def test_hermetic_grade_agrees_exactly_with_the_official_reward_sh(task_id, tmp_path):
    """The sandboxed, hermetic grader gives an honest workspace exactly what the task's own reward.sh
    gives it run as is on the host (the official pipeline): expert, wrong attempt and untouched."""
    from clawgym_env.grading.reward import grade_workspace

    task = TASKS[task_id]
    expert = load_expert(task)
    for name, steps in (("expert", expert.steps), ("wrong", expert.wrong), ("nothing", [])):
        ws = stage_workspace(task, tmp_path / name / "ws")
        run = apply_steps(steps, ws)
        final = run.final or ""
        official = tmp_path / name / "official"
        shutil.copytree(ws, official, symlinks=True)
        write_payload(task, tmp_path / name / "payload.json", final, run.transcript)
        score, out = run_reward_sh_on_host(task, official, tmp_path / name / "payload.json")
        rr = grade_workspace(task, ws, final_message=final, transcript=run.transcript)
        assert rr.ok and rr.reward == score, (name, rr.reward, score, rr.reason, rr.stderr, out)


def test_helper_refuses_paths_outside_the_workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(ValueError):
        apply_steps([{"tool": "write_file", "path": "../x", "content": ""}], ws)
    assert not (tmp_path / "x").exists()
