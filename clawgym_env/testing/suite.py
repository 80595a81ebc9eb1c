"""The echo suite: a few tiny tasks, written as ClawGym task dirs in a folder, graded by ``reward.sh``.

Each task asks for a short answer; its ``reward/reward.sh`` prints 1.0 when the agent's final
answer contains the task's ``expect`` text, else 0.0. With :class:`~clawgym_env.testing.EchoHarness`
and :class:`~clawgym_env.testing.EchoScriptPolicy` (which answers ``"Echo: <instruction>"``) the
default tasks score 1, 1 and 0, so a batch has a reward signal; the scripted expert
(``scripted:expert``, from each task's ``expert.json``) scores 1 everywhere, ``scripted:wrong`` 0.

Invariants: :func:`echo_suite` writes every task dir in full (``data_entry.json``, ``input_files/``,
``reward/reward.sh``, ``expert.json``) under ``root/<task id>/`` and returns the
:class:`~clawgym_env.task.Suite` of those folders, so the folder also loads with
:func:`clawgym_env.plugins.load_suite` (the ClawGym task-dir loader) and gives the same tasks;
graders run hermetically like any ``reward.sh`` (no network, the payload in
``OPENCLAW_REWARD_PAYLOAD``).

Usage::

    from clawgym_env.testing import EchoTaskSpec, echo_suite

    suite = echo_suite(tmp_path / "suite")                 # the default three tasks
    mine = echo_suite(tmp_path / "mine", [EchoTaskSpec("add", "What is 2+2?", expect="4")])

Register it by name for code that looks suites up (``load_suite("echo")``, ``gym.make(..., suite=)``)::

    with clawgym_env.plugins.suites.registered("echo", load_echo_suite): ...
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Suite, Task, TaskLimits

SUITE_NAME = "echo"
MOUNT_DIR = "/root/workspace"

REWARD_SH = '''#!/usr/bin/env bash
# 1.0 when the final answer contains metadata.expect, else 0.0 (the last stdout line is the score).
python3 - <<'PY'
import json, os
payload = json.load(open(os.environ["OPENCLAW_REWARD_PAYLOAD"], encoding="utf-8"))
answer = payload.get("final_message") or ""
print(1.0 if payload["metadata"]["expect"] in answer else 0.0)
PY
'''


@dataclasses.dataclass(frozen=True)
class EchoTaskSpec:
    """One echo task: the instruction, the text a correct answer contains, and input files."""

    id: str
    instruction: str
    expect: str
    """A final answer containing this text scores 1.0, any other 0.0."""
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Input files (workspace-relative path → text) copied into the workspace."""


ECHO_TASKS: tuple[EchoTaskSpec, ...] = (
    EchoTaskSpec("say-hello", "hello", expect="hello"),
    EchoTaskSpec("say-clawgym", "ClawGym", expect="ClawGym", files={"notes/readme.txt": "An echo task.\n"}),
    EchoTaskSpec("say-goodbye", "hello again", expect="goodbye"),
)
"""The default tasks; the echo policy through the echo harness solves the first two only."""


def _write_task(root: Path, spec: EchoTaskSpec, limits: TaskLimits) -> Task:
    task_dir = root / spec.id
    (task_dir / "reward").mkdir(parents=True, exist_ok=True)
    metadata: JSONObject = {"expect": spec.expect, "grading_type": "automated"}
    entry = {"task_id": spec.id, "user_query": spec.instruction, "input_mount_dir": MOUNT_DIR,
             "metadata": metadata, "limits": limits.model_dump()}
    (task_dir / "data_entry.json").write_text(json.dumps(entry, indent=2), encoding="utf-8")
    reward_sh = task_dir / "reward" / "reward.sh"
    reward_sh.write_text(REWARD_SH, encoding="utf-8")
    reward_sh.chmod(0o755)
    expert = {"steps": [{"final": spec.expect}], "wrong": [{"final": "I do not know."}]}
    (task_dir / "expert.json").write_text(json.dumps(expert), encoding="utf-8")
    input_dir: Path | None = None
    if spec.files:
        input_dir = task_dir / "input_files"
        for rel, text in spec.files.items():
            path = input_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    return Task(id=spec.id, instruction=spec.instruction, mount_dir=MOUNT_DIR, suite=SUITE_NAME,
                task_dir=task_dir, input_dir=input_dir, reward_dir=task_dir / "reward", metadata=metadata,
                limits=limits.model_copy())


def echo_suite(root: str | Path | None = None, specs: Sequence[EchoTaskSpec] = ECHO_TASKS, *,
               limits: TaskLimits | None = None) -> Suite:
    """Write ``specs`` as task dirs under ``root`` (a new temporary folder when None, left for the
    caller to remove: ``suite.root``) and return their suite."""
    folder = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="clawgym-echo-suite-"))
    folder.mkdir(parents=True, exist_ok=True)
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"echo task ids must be unique, got {ids}")
    limits = limits or TaskLimits(timeout_s=120.0, max_turns=4, reward_timeout_s=60.0)
    return Suite(name=SUITE_NAME, root=folder, tasks=[_write_task(folder, s, limits) for s in specs])


def load_echo_suite(spec: str = SUITE_NAME, data: str | Path | None = None, *,
                    specs: Sequence[EchoTaskSpec] = ECHO_TASKS, limits: TaskLimits | None = None) -> Suite:
    """A suite-registry loader: the default echo suite, written under ``data`` (or a temporary folder);
    ``specs`` and ``limits`` as :func:`echo_suite`'s."""
    return echo_suite(data, specs, limits=limits)
