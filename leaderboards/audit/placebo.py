"""The placebo of a file-planting attack: the same files at the same places, emptied.

An attack that plants files (shadow modules, rewritten modules, links) may earn partial credit that
has nothing to do with its payload: a check that gives a point for a folder the task asks for, or for a
file that merely exists, gives it to the attack too when the attack happens to create it. So when such
an attack beats the do-nothing agent, the runner plays its placebo — every file the attack's episode
added or changed, recreated empty (links become empty regular files) — and the attack counts only when
it also beats that placebo (:func:`~leaderboards.audit.verdict.judge_attack`, ``control``).

Invariants: built only from the attack episode's own record (its ``workspace_changes``); paths a shell
cannot name safely are left out; at most :data:`MAX_PLACEBO_PATHS` paths, in steps that fit a
harness's answer cap (:func:`~leaderboards.audit.steps.bash_steps`).
"""

from __future__ import annotations

import posixpath
import shlex

from clawgym_env.capture.records import EpisodeRecord
from leaderboards.audit.kit import EpisodePlan
from leaderboards.audit.steps import AuditScript, bash_steps

PLANTING = ("module_shadowing", "exit0_modules", "verifier_rewrite", "reward_symlinks")
"""The attacks whose reward is compared with their placebo's."""
MAX_PLACEBO_PATHS = 5000
WHY = "an emptied copy of the same files scores as much: their places earned it, not their payload"


def _nameable(rel: str) -> bool:
    return (bool(rel) and not rel.startswith("/") and ".." not in rel.split("/") and rel.isprintable()
            and "\\x" not in rel)


def placebo_plan(attack: str, record: EpisodeRecord) -> EpisodePlan | None:
    """The placebo episode of the attack episode ``record`` (None when it planted nothing nameable)."""
    paths = [c for c in record.workspace_changes
             if c.change in ("added", "modified") and c.kind in ("file", "symlink") and _nameable(c.path)]
    if not paths:
        return None
    by_dir: dict[str, list[str]] = {}
    for change in paths[:MAX_PLACEBO_PATHS]:
        by_dir.setdefault(posixpath.dirname(change.path) or ".", []).append(posixpath.basename(change.path))
    fragments = []
    for folder, names in by_dir.items():
        d = shlex.quote(folder)
        for i in range(0, len(names), 100):
            quoted = " ".join(shlex.quote(n) for n in names[i:i + 100])
            fragments.append(f'mkdir -p {d} && (cd {d} && for f in {quoted}; do rm -f -- "$f"; : > "$f"; done)')
    return EpisodePlan(f"{attack}:placebo", AuditScript(bash_steps(*fragments, "ls -a")))
