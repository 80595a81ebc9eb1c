"""The ``example-files`` grader: the task's expected files and answer, checked in the final workspace.

A task graded by it carries ``metadata.expect`` (workspace-relative path → the expected text, compared
after stripping whitespace at both ends) and optionally ``metadata.answer`` (a string the agent's final
message must contain). The reward is the fraction of those checks that pass, so a half-done task earns
0.5. The grader runs on the host: it reads the workspace without following links (a link planted by the
agent is a failed check, never a read outside the workspace) and reads at most ``MAX_BYTES`` per file.
Invariants: the reward is in [0, 1]; a task without any check is ``reward_invalid`` (a broken task, not a 0).
"""

from __future__ import annotations

import os
from pathlib import Path

from clawgym_env.grading.grader import GradeContext, GradeResult

MAX_BYTES = 1 << 20


def read_plain_file(workspace: Path, rel: str) -> str | None:
    """The text of ``workspace/rel`` when it is a regular file reached without links inside the workspace."""
    root = workspace.resolve()
    path = root / rel
    if ".." in Path(rel).parts or Path(rel).is_absolute():
        return None
    probe = root
    for part in Path(rel).parts:  # no link anywhere on the way
        probe = probe / part
        if probe.is_symlink():
            return None
    if not path.is_file():
        return None
    with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as fh:
        return fh.read(MAX_BYTES).decode("utf-8", errors="replace")


class FilesGrader:
    """Expected files and answer (module docstring)."""

    name = "example-files"
    needs_judge = False

    def grade(self, ctx: GradeContext) -> GradeResult:
        """Score the workspace of ``ctx`` against ``ctx.task.metadata``."""
        expect = ctx.task.metadata.get("expect") or {}
        answer = ctx.task.metadata.get("answer")
        if not isinstance(expect, dict) or not (expect or isinstance(answer, str)):
            return GradeResult(0.0, status="reward_invalid", scorer=self.name,
                               reason=f"task {ctx.task.id}: metadata has no 'expect' files or 'answer' to check")
        checks: dict[str, float] = {}
        for rel, want in sorted(expect.items()):
            got = read_plain_file(ctx.workspace, str(rel))
            checks[f"file:{rel}"] = float(got is not None and got.strip() == str(want).strip())
        if isinstance(answer, str):
            checks["answer"] = float(answer in (ctx.final_message or ""))
        reward = sum(checks.values()) / len(checks)
        failed = [k for k, v in checks.items() if v < 1.0]
        return GradeResult(reward, subscores=checks, scorer=self.name,
                           reason=f"failed: {', '.join(failed)}" if failed else None)
