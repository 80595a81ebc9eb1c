"""Judging the input-tampering adversary: did the reward come from the tampering?

The adversary plays the expert's steps twice — on the pristine inputs and on trivialised ones — and
keeps both final workspaces. Two questions decide whether its reward counts (:func:`judge_tamper`):

1. **Do the expert's steps read the inputs?** The outputs (every file the pristine replay added or
   changed, every file the tampered replay added, and the final answer) are compared by content. Equal
   outputs: the steps do not read the inputs, so the attack says nothing about the check — skipped
   with that reason (:func:`same_outputs`).
2. **Does the check follow the inputs?** The tampered workspace is graded again with the task's
   pristine inputs put back (:func:`restore_inputs`; the ``control`` reward), except the inputs the
   expert edits in place (those are its outputs). A reward that does not drop came from outputs that
   are right anyway (the expert's work, or a coincidence of the trivial inputs), not from the tampering.

Invariants: the kept workspaces are only read; the control is graded on a private copy, through the
task's own grader (:func:`clawgym_env.grading.grade.grade_episode`), in the audit's sandbox backend.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from clawgym_env.capture.records import EpisodeRecord
from clawgym_env.files.workspace import copy_tree, private_tempdir, remove_tree, snapshot
from clawgym_env.grading.grade import grade_episode
from clawgym_env.grading.judge import Judge
from leaderboards.audit.facts import TaskFacts

WHY = "the same reward with the pristine inputs put back: the outputs do not follow the trivialised inputs"


def output_paths(pristine: EpisodeRecord, tampered: EpisodeRecord) -> set[str]:
    """What the replays produced: the pristine replay's added/changed paths, the tampered one's added paths."""
    paths = {c.path for c in pristine.workspace_changes if c.change in ("added", "modified")}
    return paths | {c.path for c in tampered.workspace_changes if c.change == "added"}


def same_outputs(pristine: EpisodeRecord, pristine_ws: Path, tampered: EpisodeRecord, tampered_ws: Path) -> bool:
    """Whether both replays produced the same outputs (files by content, and the final answer)."""
    if (pristine.final_message or "") != (tampered.final_message or ""):
        return False
    before, after = snapshot(pristine_ws), snapshot(tampered_ws)
    return all(before.get(p) == after.get(p) for p in output_paths(pristine, tampered))


def _clear(path: Path) -> None:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        remove_tree(path)
    else:
        os.unlink(path)


def restore_inputs(facts: TaskFacts, workspace: Path, *, keep: frozenset[str] = frozenset()) -> list[str]:
    """Put every input file of the task but those in ``keep`` back in ``workspace`` as the task shipped it
    (a link or a file standing where a folder on the way should be is removed first); returns the
    restored paths."""
    restored = []
    for rel in facts.inputs:
        if rel in keep:
            continue
        src = facts.input_path(rel)
        if src is None:
            continue
        cur = workspace
        for part in rel.split("/")[:-1]:
            cur = cur / part
            if os.path.lexists(cur) and not stat.S_ISDIR(os.lstat(cur).st_mode):
                _clear(cur)
            cur.mkdir(mode=0o755, exist_ok=True)
        dest = workspace / rel
        if os.path.lexists(dest):
            _clear(dest)
        shutil.copyfile(src, dest, follow_symlinks=False)
        restored.append(rel)
    return restored


def control_reward(facts: TaskFacts, pristine: EpisodeRecord, tampered: EpisodeRecord, tampered_ws: Path, *,
                   sandbox: str, judge: Judge | None = None) -> tuple[float | None, str | None]:
    """(reward, None) of the tampered outputs graded with the pristine inputs put back, or (None, why).

    Inputs the expert itself changes (its in-place outputs, as the pristine replay shows) are outputs:
    they stay as the tampered replay left them."""
    outputs = frozenset(c.path for c in pristine.workspace_changes if c.change == "modified")
    with private_tempdir("clawgym-audit-control-") as tmp:
        ws = tmp / "workspace"
        copy_tree(tampered_ws, ws)
        restore_inputs(facts, ws, keep=outputs)
        result = grade_episode(facts.task, ws, final_message=tampered.final_message, sandbox=sandbox, judge=judge)
    if not result.valid:
        return None, f"the control grading gave no valid reward: {result.reason}"
    return result.reward, None


def judge_tamper(facts: TaskFacts, pristine: EpisodeRecord, pristine_ws: Path | None, tampered: EpisodeRecord,
                 tampered_ws: Path | None, baseline: float | None, *, sandbox: str,
                 judge: Judge | None = None) -> tuple[str | None, float | None, str | None]:
    """``(skipped, control, note)`` for the tampered run (see the module doc).

    ``skipped`` is set when the steps do not read the inputs; ``control`` only when the tampered run beat
    the baseline (otherwise there is nothing to attribute); ``note`` says what could not be compared."""
    if not pristine.is_task_outcome:
        return None, None, f"the pristine replay got no valid reward ({pristine.status}); outputs not compared"
    if pristine_ws is None or tampered_ws is None or not pristine_ws.is_dir() or not tampered_ws.is_dir():
        return None, None, "a replay's workspace was not kept; outputs not compared"
    if same_outputs(pristine, pristine_ws, tampered, tampered_ws):
        return ("the expert's outputs are the same on trivialised inputs (its steps do not read them)",
                None, None)
    if baseline is None or not tampered.is_task_outcome or tampered.reward <= baseline:
        return None, None, None
    control, why = control_reward(facts, pristine, tampered, tampered_ws, sandbox=sandbox, judge=judge)
    return None, control, why
