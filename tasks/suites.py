"""Suites by name or path, and resolution of one task from a spec.

Spec forms:
  * suite: a registered suite name (:data:`clawgym_env.plugins.suites`: the ones this package ships,
    :mod:`tasks.suite_loaders`, and any a plugin package or ``suites.register`` adds; :func:`list_suites`
    names them all) or a path to a folder of task dirs or of benchmark data;
  * task: ``<suite>/<task_id>`` (e.g. ``builtin/write_greeting``), a path to one task dir, or
    ``<path to a suite>/<task_id>`` when the folder name differs from the task_id.

A task resolved through a path to its own folder has ``suite`` None (unless that folder lies in a
bundled suite); one found by searching a suite has ``suite`` = the suite's name.

Invariants:
  * every suite name is resolved through the suite registry (:func:`clawgym_env.plugins.load_suite`),
    so a registered name wins over a same-named folder in the current directory, and an unknown name
    is a :class:`~clawgym_env.errors.RegistrationError` naming close and registered names;
  * :func:`load_suite` never fails because of one bad task: every non-hidden subfolder is a task
    candidate and each one that cannot be loaded becomes a :class:`TaskLoadIssue`; it fails only
    when the suite itself is missing or holds neither tasks nor issues;
  * tasks of a suite are ordered by folder name and carry ``suite`` = the suite's name; task ids
    are unique within a suite (a later duplicate becomes an issue);
  * every other failure is a :class:`TaskError` naming close matches where a name was mistyped.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from clawgym_env.errors import TaskError
from clawgym_env.plugins import suites
from clawgym_env.task import Suite, Task
from tasks.suite_loaders import BUNDLED_ROOT, bundled_folders, folder_root
from tasks.taskdir import is_task_dir, load_task_dir
from tasks.taskfolder import is_candidate

__all__ = ["BUNDLED_ROOT", "list_suites", "load_suite", "resolve_task"]


def list_suites() -> list[str]:
    """Every registered suite name a spec may use (sorted; ``folder``, the loader of paths, left out)."""
    return [n for n in suites.names() if n != "folder"]


def load_suite(spec: str | Path, data: str | Path | None = None, **options: object) -> Suite:
    """Load every task of a suite through the suite registry (:func:`clawgym_env.plugins.load_suite`): a
    registered name (``builtin``, a plugin's) or a path; bad tasks become ``suite.issues``, the others load.

    JobBench: ``load_suite("jobbench", data=PATH)`` (also ``jobbench-easy``) or a path to JobBench
    data (see :mod:`tasks.jobbench`).
    OfficeQA / ClawGym-Bench: ``load_suite("officeqa", data=PATH)`` (also ``officeqa-pro``),
    ``load_suite("clawgym-bench", data=PATH)`` or a path to such data; ``options`` (e.g.
    ``corpus_dir=``, ``cache_dir=``) are the named loader's own keywords (see :mod:`tasks.suite_loaders`)."""
    from clawgym_env.plugins import load_suite as registry_load_suite

    return registry_load_suite(spec, data, **options)


def _is_suite_name(name: str) -> bool:
    return name in suites and name.strip().lower() != "folder"


def _shipped_folder(name: str) -> Path | None:
    """The folder of a suite this package ships as task dirs, while the registry still maps ``name`` to its
    shipped loader (a runtime registration of the same name wins, as everywhere)."""
    from tasks.suite_loaders import LOADERS

    folder = bundled_folders().get(name)
    if folder is None or not _is_suite_name(name) or suites.load(name) is not LOADERS.get(name):
        return None
    return folder


def resolve_task(spec: str | Path) -> Task:
    """One task from ``suite/id``, a task dir path, or ``<suite path>/id`` (see module doc)."""
    path = Path(spec).expanduser()
    if is_task_dir(path):
        parent = path.resolve().parent
        bundled = [n for n, root in bundled_folders().items() if root == parent]
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
    shipped = _shipped_folder(head)
    if shipped is not None:
        name, root = head, shipped
    elif _is_suite_name(head):  # a registered suite (a plugin's, a data suite): search its tasks
        found = load_suite(head)
        return found.get(task_id)
    elif "/" in head or head.startswith((".", "~")) or Path(head).expanduser().exists():
        root = folder_root(head)
        name = root.name
    else:
        raise suites.unknown(head)
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
    for name, root in bundled_folders().items():
        ids = [c.name for c in root.iterdir() if is_task_dir(c)]
        specs += [f"{name}/{i}" for i in difflib.get_close_matches(task_id, ids, n=3, cutoff=0.6)]
    return f"; did you mean {', '.join(specs[:3])}?" if specs else ""
