"""Suites: named or on-disk folders of task dirs, and resolution of one task from a spec.

Spec forms:
  * suite: a bundled suite name (``builtin`` → the folder ``tasks/builtin/`` shipped in this
    package; :func:`list_suites` names them all) or a path to a folder of task dirs;
  * task: ``<suite>/<task_id>`` (e.g. ``builtin/write_greeting``), a path to one task dir, or
    ``<path to a suite>/<task_id>`` when the folder name differs from the task_id.

A task resolved through a path to its own folder has ``suite`` None (unless that folder lies in a
bundled suite); one found by searching a suite has ``suite`` = the suite's name.

Invariants:
  * a bundled name wins over a same-named folder in the current directory;
  * :func:`load_suite` never fails because of one bad task: every non-hidden subfolder is a task
    candidate and each one that cannot be loaded becomes a :class:`TaskLoadIssue`; it fails only
    when the suite itself is missing or holds neither tasks nor issues;
  * tasks of a suite are ordered by folder name and carry ``suite`` = the suite's name; task ids
    are unique within a suite (a later duplicate becomes an issue);
  * every failure is a :class:`TaskError` naming close matches where a name was mistyped.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from clawgym_env.errors import TaskError
from clawgym_env.task import Suite, Task
from tasks.taskdir import is_task_dir, load_task_dir
from tasks.taskfolder import is_candidate, load_task_folder

BUNDLED_ROOT = Path(__file__).resolve().parent
"""Bundled suites are the subfolders of this package that hold task dirs."""


def _bundled() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in sorted(BUNDLED_ROOT.iterdir()):
        if is_candidate(p) and any(is_task_dir(c) for c in p.iterdir()):
            out[p.name] = p
    return out


def list_suites() -> list[str]:
    """Names of the suites shipped in this package (sorted)."""
    return list(_bundled())


def _hint(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    return f"did you mean {', '.join(close)}?" if close else ""


def _suite_root(spec: str | Path) -> tuple[str, Path]:
    """(name, folder) of a suite spec, or TaskError naming close bundled names."""
    bundled = _bundled()
    if isinstance(spec, str) and spec in bundled:
        return spec, bundled[spec]
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path.resolve()
        if is_task_dir(path):
            raise TaskError(f"{path}: is a single task dir, not a suite; resolve it as a task "
                            f"(resolve_task) or pass the folder that holds it")
        return path.name, path
    if path.exists():
        raise TaskError(f"{path}: not a folder; a suite is a folder of task dirs")
    hint = _hint(str(spec), list(bundled))
    looks_like_path = isinstance(spec, Path) or "/" in str(spec) or str(spec).startswith((".", "~"))
    what = f"no suite folder {str(spec)!r}" if looks_like_path else f"unknown suite {str(spec)!r}"
    raise TaskError(f"{what}; {hint + ' ' if hint else ''}bundled suites: {', '.join(bundled) or 'none'}; "
                    f"or pass the path to a folder of task dirs")


def load_suite(spec: str | Path, data: str | Path | None = None, **options: object) -> Suite:
    """Load every task dir of a suite; bad ones become ``suite.issues``, the others load.

    JobBench: ``load_suite("jobbench", data=PATH)`` (also ``jobbench-easy``) or a path to JobBench
    data (see :mod:`tasks.jobbench`).
    OfficeQA / ClawGym-Bench: ``load_suite("officeqa", data=PATH)`` (also ``officeqa-pro``),
    ``load_suite("clawgym-bench", data=PATH)`` or a path to such data; ``options`` (e.g.
    ``corpus_dir=``, ``cache_dir=``) go to their loaders (see :mod:`tasks.benchdata`)."""
    from tasks.benchdata import data_suite_for

    bench = None if isinstance(spec, str) and spec in _bundled() else data_suite_for(spec, data, options)
    if bench is not None:
        return bench
    if options:
        raise TaskError(f"options {sorted(options)} apply only to the officeqa and clawgym-bench suites")
    from tasks.jobbench import jobbench_suite_for

    jobbench = None if isinstance(spec, str) and spec in _bundled() else jobbench_suite_for(spec, data)
    if jobbench is not None:
        return jobbench
    name, root = _suite_root(spec)
    return load_task_folder(root, name)


def resolve_task(spec: str | Path) -> Task:
    """One task from ``suite/id``, a task dir path, or ``<suite path>/id`` (see module doc)."""
    path = Path(spec).expanduser()
    if is_task_dir(path):
        parent = path.resolve().parent
        bundled = [n for n, root in _bundled().items() if root == parent]
        return load_task_dir(path, suite=bundled[0] if bundled else None)
    from tasks.benchdata import data_task_for

    bench = data_task_for(spec)
    if bench is not None:
        return bench
    from tasks.jobbench import jobbench_task_for

    jobbench = jobbench_task_for(spec)
    if jobbench is not None:
        return jobbench
    text = str(spec).rstrip("/")
    if "/" not in text:
        raise TaskError(f"task spec {text!r} must be <suite>/<task_id> or a path to a task dir"
                        f"{_bare_id_hint(text)}")
    head, task_id = text.rsplit("/", 1)
    name, root = _suite_root(head)
    direct = root / task_id
    if is_candidate(direct):  # fast path (and a bad task dir's own error): folder name == task id
        return load_task_dir(direct, suite=name)
    suite = load_suite(root)
    try:
        return suite.get(task_id)
    except TaskError as e:
        raise TaskError(f"{e} (suite folder {root})") from None


def _bare_id_hint(task_id: str) -> str:
    """'; did you mean builtin/x?' for a bare id that names (or nearly names) bundled tasks."""
    specs: list[str] = []
    for name, root in _bundled().items():
        ids = [c.name for c in root.iterdir() if is_task_dir(c)]
        specs += [f"{name}/{i}" for i in difflib.get_close_matches(task_id, ids, n=3, cutoff=0.6)]
    return f"; did you mean {', '.join(specs[:3])}?" if specs else ""
