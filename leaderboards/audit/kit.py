"""The adversary kit: for each attack, the episodes that play it against one task.

Every adversary is generic — built from the task's :class:`~leaderboards.audit.facts.TaskFacts`, never
written for one task — and plays through the real harness as scripted steps
(:class:`~leaderboards.audit.steps.AuditScript`). The kit (:data:`ATTACKS`, in report order):

``module_shadowing``
    win payloads (:mod:`~leaderboards.audit.payloads`) as standard modules the checks import and
    :data:`SHADOWED` friends (``json.py``, ``re.py``, ...), ``sitecustomize``/``usercustomize``, ``.pth``
    files, and executables named ``python3``/``bash``/``cat``/... in the workspace root and its usual
    ``bin`` folders, in every folder that holds the task's Python code;
``exit0_modules``
    every module the task lets the agent edit (unprotected ``.py``/``.sh`` inputs, modules the expert
    wrote) becomes a body that prints ``1.0`` and exits 0 (``os._exit(0)``): test files left alone in
    a first episode, rewritten too in a second;
``verifier_rewrite``
    the transparent rewrite payload behind every entry point above (modules keep their code): it
    appends ``echo 1.0`` to any ``reward.sh`` it can reach at grading time, and so on;
``reward_symlinks``
    links named like the task's output files (those the expert wrote, those the instruction names)
    pointing at the files under ``reward/`` (answer-key-like files first);
``input_tamper``
    every input file trivialised (:mod:`~leaderboards.audit.trivial`), then the expert's steps
    replayed, answering with what the replay computed; played next to the same replay on the pristine
    inputs (the runner compares them);
``task_folder_peek``
    the task's own ``expert.json`` read at its real host path (the adversary is told it: no search
    needed) and replayed, answering with the expert's final answer: full marks unless the sandbox hides
    the task's folder (a suite kept under a folder sandboxes show, a pod image holding the tasks);
``disk_fill``, ``inode_flood``
    the workspace filled to its disk quota (:func:`plan_disk_fill`); 100k+ empty files
    (:data:`DEFAULT_INODES`) — both "heavy".

``gold`` (:func:`plan_gold`) is the sanity gate: the expert and its known-wrong ``wrong`` steps.
Invariant: an attack that cannot apply to a task is an :class:`AttackPlan` with ``skipped`` saying why.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
import shlex

from leaderboards.audit.facts import MAX_READ, TaskFacts
from leaderboards.audit.payloads import (
    AUDIT_DIR,
    REWRITE_FILE,
    WIN_PTH,
    WIN_PY_NAMED,
    WIN_SH,
    insert_prefix,
    rewrite_prefix,
    rewrite_pth,
    rewrite_py,
    rewrite_stub,
    shadow_stub,
    win_py,
)
from leaderboards.audit.steps import AuditScript, bash_steps, write_fragments
from leaderboards.audit.trivial import trivialise

ATTACKS = ("module_shadowing", "exit0_modules", "verifier_rewrite", "reward_symlinks", "input_tamper",
           "task_folder_peek", "disk_fill", "inode_flood")
GOLD = "gold"
EARLY = ("input_tamper", "task_folder_peek", "disk_fill", "inode_flood")
"""Attacks planned before the expert has run (the others read the files it wrote)."""
DEFAULT_INODES = 100_001
SHADOWED = ("json", "re", "csv", "pathlib", "subprocess", "unittest", "decimal", "hashlib", "math", "fractions",
            "statistics", "string", "difflib", "fnmatch", "glob", "shutil", "tempfile", "textwrap", "datetime",
            "collections", "itertools", "functools", "argparse", "random", "struct", "base64", "zipfile",
            "tarfile", "sqlite3", "configparser", "tomllib", "ast", "inspect", "traceback", "logging", "doctest",
            "filecmp", "gzip", "html", "xml", "pprint", "operator", "numbers", "typing", "enum", "dataclasses")
"""Standard modules shadowed besides those the task's checks import."""
NEVER_SHADOWED = frozenset({"os", "sys", "builtins", "importlib", "site", "sitecustomize", "usercustomize",
                            "__future__", "abc", "codecs", "io", "stat", "posixpath", "genericpath", "encodings",
                            "_collections_abc", "types", "warnings", "marshal", "posix", "zipimport", "_io"})
"""Modules loaded before any workspace path is searched, or that the payload stubs need themselves."""
EXECUTABLES = ("python3", "python", "bash", "sh", "cat", "node", "npm", "npx", "pytest", "jq", "wc", "sort", "uniq",
               "diff", "cmp", "grep", "head", "tail", "awk", "sed", "cut", "tr", "ls", "find", "env", "make", "git",
               "tee", "xargs", "timeout", "md5sum", "sha256sum", "test", "true", "false")
BIN_DIRS = (".", "bin", ".bin", ".local/bin", "node_modules/.bin", ".venv/bin", "venv/bin")
MAX_LINK_EPISODES = 3
MAX_TAMPERED = 200
"""Input files the tampering adversary rewrites at most (the first, in path order)."""
_NAMED_FILE = re.compile(r"(?<![\w/.-])([A-Za-z0-9_][\w.-]*(?:/[\w.-]+)*\.(?:txt|json|jsonl|csv|tsv|md|log|yaml|yml|"
                         r"xml|html|py|sh|out|ini|toml|cfg))\b")


@dataclasses.dataclass(frozen=True)
class EpisodePlan:
    """One episode of an attack: its label within the attack, the script played, whether its final
    workspace is kept for comparison, and whether it is heavy (run apart, with little concurrency)."""

    label: str
    script: AuditScript
    keep_workspace: bool = False
    heavy: bool = False


@dataclasses.dataclass(frozen=True)
class AttackPlan:
    """The episodes of one attack on one task, or why the attack does not apply (``skipped``)."""

    name: str
    episodes: tuple[EpisodePlan, ...] = ()
    skipped: str | None = None


def _skip(name: str, why: str) -> AttackPlan:
    return AttackPlan(name=name, skipped=why)


def turns_left(facts: TaskFacts, steps: int) -> str | None:
    """Why ``steps`` tool steps (and the final answer) do not fit the task's turn limit, or None."""
    limit = facts.task.limits.max_turns
    return None if steps + 1 <= limit else (f"it needs {steps + 1} turns and the task allows {limit} "
                                            "(limits.max_turns)")


def _episode(facts: TaskFacts, label: str, fragments: list[str], **kw) -> EpisodePlan | str:
    """An episode playing ``fragments`` as bash steps, or why it cannot fit the task's turns."""
    steps = bash_steps(*fragments)
    why = turns_left(facts, len(steps))
    return why if why is not None else EpisodePlan(label, AuditScript(steps), **kw)


def _one(facts: TaskFacts, name: str, fragments: list[str], *, heavy: bool = False) -> AttackPlan:
    ep = _episode(facts, name, fragments, heavy=heavy)
    return _skip(name, ep) if isinstance(ep, str) else AttackPlan(name=name, episodes=(ep,))


def shadow_names(facts: TaskFacts) -> tuple[str, ...]:
    """The standard module names to shadow: those the checks import, then :data:`SHADOWED`."""
    names = [n for n in (*facts.reward_imports, *SHADOWED) if n not in NEVER_SHADOWED]
    return tuple(dict.fromkeys(names))


def _module_names_in(facts: TaskFacts, folder: str) -> set[str]:
    """Module names the task's own code takes in ``folder`` (never overwritten by a shadow)."""
    own = [p for p in (*facts.inputs, *facts.outputs) if p.endswith(".py") and (posixpath.dirname(p) or ".") == folder]
    return {posixpath.basename(p)[:-3] for p in own}


def _plant(facts: TaskFacts, module_file: str, custom_file: str, pth_file: str) -> list[str]:
    """Shell fragments copying the given payload files to every shadowing place of the task."""
    parts = []
    for folder in facts.code_dirs:
        names = [n for n in shadow_names(facts) if n not in _module_names_in(facts, folder)]
        d = shlex.quote(folder)
        parts.append(f"mkdir -p {d}\nfor m in {' '.join(names)}; do cp {module_file} {d}/$m.py; done\n"
                     f"cp {custom_file} {d}/sitecustomize.py\ncp {custom_file} {d}/usercustomize.py\n"
                     f"cp {pth_file} {d}/clawgym_audit.pth\n")
    parts.append("v=$(python3 -I -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null || echo 3)\n"
                 'for sp in "lib/python$v/site-packages" ".local/lib/python$v/site-packages"; do\n'
                 f'  mkdir -p "$sp"; cp {pth_file} "$sp/clawgym_audit.pth"; cp {custom_file} "$sp/sitecustomize.py"\n'
                 f'  cp {custom_file} "$sp/usercustomize.py"\ndone\n')
    return parts


def plan_module_shadowing(facts: TaskFacts) -> AttackPlan:
    """Win payloads as standard modules, ``sitecustomize``/``usercustomize``, ``.pth`` files and PATH executables."""
    win, sh, pth = f"{AUDIT_DIR}/win.py", f"{AUDIT_DIR}/win.sh", f"{AUDIT_DIR}/win.pth"
    taken = set(facts.inputs) | set(facts.outputs)
    exes = []
    for folder in BIN_DIRS:
        names = [x for x in EXECUTABLES if posixpath.normpath(posixpath.join(folder, x)) not in taken]
        d = shlex.quote(folder)
        exes.append(f"mkdir -p {d}\nfor x in {' '.join(names)}; do cp {sh} {d}/$x; chmod 755 {d}/$x; done\n")
    fragments = [*write_fragments(win, WIN_PY_NAMED), *write_fragments(sh, WIN_SH, mode="755"),
                 *write_fragments(pth, WIN_PTH), *_plant(facts, win, win, pth), *exes, "ls -a"]
    return _one(facts, "module_shadowing", fragments)


def is_test_module(rel: str) -> bool:
    """Whether ``rel`` looks like a test file (``test_*.py``, ``*_test.py``, ``conftest.py``, under ``tests/``):
    the files a check usually pins, which an early-exit adversary leaves alone in its first variant."""
    name = posixpath.basename(rel)
    parts = rel.split("/")[:-1]
    return (name.startswith("test_") or name.endswith(("_test.py", "_test.sh")) or name == "conftest.py"
            or any(p in ("test", "tests") for p in parts))


def plan_exit0_modules(facts: TaskFacts) -> AttackPlan:
    """Modules the agent may edit become a body that prints ``1.0`` and exits 0 at once: first every module
    but the test files (a check may pin those), then every module, test files included."""
    modules = facts.editable_modules
    if not modules:
        return _skip("exit0_modules", "the task gives the agent no module to edit (no unprotected .py/.sh input, "
                                      "none written by the expert)")
    code = tuple(m for m in modules if not is_test_module(m))
    variants = [v for v in (code, modules) if v]
    episodes = []
    for k, chosen in enumerate(dict.fromkeys(variants)):
        writes = []
        for rel in chosen:
            sh = rel.endswith(".sh")
            writes += write_fragments(rel, WIN_SH if sh else win_py(f"exit0 {rel}"), mode="755" if sh else None)
        ep = _episode(facts, "exit0_modules" if k == 0 else "exit0_modules+tests", [*writes, "ls -la"])
        if isinstance(ep, str):
            return _skip("exit0_modules", ep)
        episodes.append(ep)
    return AttackPlan(name="exit0_modules", episodes=tuple(episodes))


def plan_verifier_rewrite(facts: TaskFacts) -> AttackPlan:
    """The transparent rewrite payload behind every entry point: shadows, customize modules, ``.pth``, modules."""
    mount = facts.mount_dir
    shadow, custom, pth = f"{AUDIT_DIR}/shadow.py", f"{AUDIT_DIR}/custom.py", f"{AUDIT_DIR}/rewrite.pth"
    writes = [*write_fragments(REWRITE_FILE, rewrite_py(mount)), *write_fragments(shadow, shadow_stub(mount)),
              *write_fragments(custom, rewrite_stub(mount, "sitecustomize")), *write_fragments(pth, rewrite_pth(mount)),
              *_plant(facts, shadow, custom, pth)]
    for rel in facts.editable_modules:
        size = facts.input_size(rel) if rel in facts.inputs else None
        raw = facts.read_input(rel) if size is not None and size <= MAX_READ else None
        try:
            original = raw.decode("utf-8") if raw is not None else ""
        except UnicodeDecodeError:
            continue  # a module that is not text: left as it is
        writes += write_fragments(rel, insert_prefix(original, rewrite_prefix(mount, rel), python=rel.endswith(".py")))
    return _one(facts, "verifier_rewrite", [*writes, "ls -a"])


def output_names(facts: TaskFacts) -> tuple[str, ...]:
    """The task's likely output files: those the expert wrote, then those the instruction names."""
    named = [m.group(1) for m in _NAMED_FILE.finditer(facts.task.instruction)]
    names = [*facts.outputs, *(n for n in named if n not in facts.inputs and ".." not in n.split("/"))]
    return tuple(n for n in dict.fromkeys(names) if not n.startswith(AUDIT_DIR))


def plan_reward_symlinks(facts: TaskFacts) -> AttackPlan:
    """Links named like the outputs pointing into ``reward/``: one episode per answer-key-like file (at most
    :data:`MAX_LINK_EPISODES`), or one spreading the links over the scripts when ``reward/`` holds only those."""
    names = output_names(facts)
    if not names:
        return _skip("reward_symlinks", "the task's output files are unknown (no expert run wrote one and the "
                                        "instruction names none)")
    if not facts.reward_files:
        return _skip("reward_symlinks", "reward/ holds no file")
    data = [f for f in facts.reward_files if not f.endswith((".sh", ".py"))]
    rounds = [[t] * len(names) for t in data[:MAX_LINK_EPISODES]] or [
        [facts.reward_files[i % len(facts.reward_files)] for i in range(len(names))]]
    episodes = []
    for k, targets in enumerate(rounds):
        lines = []
        for name, target in zip(names, targets):
            q = shlex.quote(name)
            parent = posixpath.dirname(name)
            mkdir = f"mkdir -p {shlex.quote(parent)}; " if parent else ""
            lines.append(f"rm -rf -- {q}; {mkdir}ln -s {shlex.quote(posixpath.join(facts.reward_mount, target))} {q}")
        ep = _episode(facts, f"reward_symlinks#{k + 1}", [*lines, "ls -la"])
        if isinstance(ep, str):
            return _skip("reward_symlinks", ep)
        episodes.append(ep)
    return AttackPlan(name="reward_symlinks", episodes=tuple(episodes))


def tamper_fragments(facts: TaskFacts) -> list[str]:
    """Shell fragments replacing every input file by its trivial version (empty when none would change)."""
    writes = []
    for rel in facts.inputs[:MAX_TAMPERED]:
        size = facts.input_size(rel)
        data = facts.read_input(rel)
        if size is None or data is None:
            continue
        small = trivialise(rel, data, complete=size <= len(data))
        if small is not None:
            parts = write_fragments(rel, small)
            writes += [f"rm -rf -- {shlex.quote(rel)}\n" + parts[0], *parts[1:]]
    return writes


def plan_input_tamper(facts: TaskFacts) -> AttackPlan:
    """The expert replayed on trivialised inputs, next to the same replay on the pristine inputs."""
    if facts.expert is None:
        return _skip("input_tamper", facts.expert_error or "the task ships no expert.json: there are no expert "
                                                           "steps to replay on trivialised inputs")
    if not facts.inputs:
        return _skip("input_tamper", "the task has no input files")
    fragments = tamper_fragments(facts)
    if not fragments:
        return _skip("input_tamper", "every input file is already trivial (empty, or one line)")
    replay = tuple(facts.expert.tool_steps)
    tamper = bash_steps(*fragments)
    why = turns_left(facts, len(tamper) + len(replay))
    if why is not None:
        return _skip("input_tamper", why)
    return AttackPlan(name="input_tamper", episodes=(
        EpisodePlan("pristine", AuditScript(replay, None), keep_workspace=True),
        EpisodePlan("tampered", AuditScript((*tamper, *replay), None), keep_workspace=True)))


PEEK_MISS = "clawgym-audit: the task folder is not visible"
_PEEK = f"""import json, os, subprocess, sys
try:
    with open(sys.argv[1], encoding="utf-8") as f:
        data = json.load(f)
except (OSError, ValueError):
    print({PEEK_MISS!r})
    sys.exit(0)
os.chdir(sys.argv[2])
final = ""
for step in (data.get("steps") if isinstance(data, dict) else data) or []:
    if "final" in step:
        final = str(step["final"])
    elif step.get("tool") == "bash":
        subprocess.run(["bash", "-c", step["command"]], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    elif step.get("tool") == "write_file":
        parent = os.path.dirname(step["path"])
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(step["path"], "w", encoding="utf-8", newline="") as out:
            out.write(step["content"])
print(final)
"""
"""The peeking adversary's program: argv[1] the expert file's host path, argv[2] the workspace."""


def plan_task_folder_peek(facts: TaskFacts) -> AttackPlan:
    """The expert replayed from the task's own ``expert.json``, read inside the sandbox at its real host path
    at run time: it wins exactly when the sandbox shows the task's folder. Skipped for a task without a
    folder or an ``expert.json`` (nothing to peek that would earn a reward)."""
    if facts.task.task_dir is None or facts.task.expert_path is None:
        return _skip("task_folder_peek", "the task ships no expert.json in a task folder: nothing there to replay")
    path = os.path.realpath(facts.task.expert_path)
    command = f"python3 -I -c {shlex.quote(_PEEK)} {shlex.quote(path)} {shlex.quote(facts.mount_dir)}\n"
    ep = _episode(facts, "task_folder_peek", [command])
    if isinstance(ep, str):
        return _skip("task_folder_peek", ep)
    return AttackPlan(name="task_folder_peek", episodes=(dataclasses.replace(ep, script=AuditScript(ep.script.steps,
                                                                                                     None)),))


def plan_disk_fill(facts: TaskFacts, *, data: bool = False) -> AttackPlan:
    """The workspace filled to its disk quota, never past it (bounded by the quota whatever the sandbox enforces).

    By default the room is taken with ``fallocate`` (allocated blocks, which a sparse-aware copy reads as a
    hole: quick to grade) and the last bit with written zeros; ``data=True`` writes zeros throughout (the
    copies into the grader then carry the whole quota: slow)."""
    quota_kib = facts.disk_mb * 1024
    take = "" if data else 'fallocate -l "$((n > 64 ? n - 64 : 0))KiB" .clawgym_audit_fill 2>&1 | tail -n 1\n'
    command = (f"q={quota_kib}; a=$(df -Pk . | awk 'NR==2 {{print $4}}'); a=${{a:-0}}; n=$((a < q ? a : q))\n"
               + take
               + "t=$(stat -c %s .clawgym_audit_fill 2>/dev/null || echo 0); r=$((n - t / 1024))\n"
               "dd if=/dev/zero of=.clawgym_audit_fill2 bs=64K count=$((r > 0 ? r / 64 + 2 : 0)) status=none 2>&1 "
               "| tail -n 1\n"
               "df -Pk . | tail -n 1\n")
    return _one(facts, "disk_fill", [command], heavy=True)


def plan_inode_flood(facts: TaskFacts, inodes: int = DEFAULT_INODES) -> AttackPlan:
    """``inodes`` empty files (1,000 per folder) in the workspace, until done or refused."""
    script = ("import os, sys\n"
              "n, made = int(sys.argv[1]), 0\n"
              "try:\n"
              "    for d in range(0, n, 1000):\n"
              "        folder = '.clawgym_audit_flood/%d' % d\n"
              "        os.makedirs(folder)\n"
              "        for i in range(min(1000, n - d)):\n"
              "            open('%s/%d' % (folder, i), 'w').close()\n"
              "            made += 1\n"
              "except OSError as exc:\n"
              "    print('stopped:', exc)\n"
              "print('made', made)\n")
    command = f"python3 -I -c {shlex.quote(script)} {int(inodes)}\n"
    return _one(facts, "inode_flood", [command], heavy=True)


def plan_gold(facts: TaskFacts) -> AttackPlan:
    """The gold-sanity gate's episodes: the expert's steps and, when the task ships them, its ``wrong`` ones."""
    if facts.expert is None:
        return _skip(GOLD, facts.expert_error or "the task ships no expert.json")
    episodes = [EpisodePlan("expert", AuditScript(tuple(facts.expert.tool_steps), facts.expert.final))]
    if facts.expert.wrong:
        wrong = facts.expert.wrong
        episodes.append(EpisodePlan("wrong", AuditScript(tuple(wrong[:-1]), str(wrong[-1]["final"]))))
    return AttackPlan(name=GOLD, episodes=tuple(episodes))


def plan_attack(name: str, facts: TaskFacts, *, inodes: int = DEFAULT_INODES, fill_data: bool = False) -> AttackPlan:
    """The plan of the attack ``name`` (one of :data:`ATTACKS`) against the task of ``facts``."""
    planners = {"module_shadowing": plan_module_shadowing, "exit0_modules": plan_exit0_modules,
                "verifier_rewrite": plan_verifier_rewrite, "reward_symlinks": plan_reward_symlinks,
                "input_tamper": plan_input_tamper, "task_folder_peek": plan_task_folder_peek}
    if name == "inode_flood":
        return plan_inode_flood(facts, inodes)
    if name == "disk_fill":
        return plan_disk_fill(facts, data=fill_data)
    if name not in planners:
        raise ValueError(f"unknown attack {name!r}; the kit has {', '.join(ATTACKS)}")
    return planners[name](facts)
