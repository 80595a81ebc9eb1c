"""The loaders of the suites this package ships: one small function per registered suite name.

Each is declared as an entry point of group ``clawgym.suites`` (``pyproject.toml``) and called by
:func:`clawgym_env.plugins.load_suite` as ``loader(spec, data=..., **options)``, ``spec`` being the name
the user typed (or, for :func:`folder_suite`, the path). So the CLI, ``clawgym eval``, the trainers and
``gym.make`` find these exactly as they find a third party's suite:

  * ``builtin``: the task dirs under ``tasks/builtin/`` (:func:`builtin_suite`);
  * ``folder``: a path, to a folder of task dirs or to benchmark data (:func:`folder_suite`);
  * ``officeqa``, ``officeqa-pro``: OfficeQA data (``data=`` or ``$CLAWGYM_OFFICEQA_DATA``);
  * ``clawgym-bench``: ClawGym-Bench data (``data=``, ``$CLAWGYM_BENCH_DATA`` or the hub dataset);
  * ``jobbench``, ``jobbench-main``, ``jobbench-easy``: JobBench data (``data=`` or ``$CLAWGYM_JOBBENCH_DATA``).

Invariants: a loader's keywords are its own options, typed (a wrong one is refused by
:func:`~clawgym_env.plugins.load_suite` before the loader runs); the returned suite is named by the
registered name (never by the spelling typed); a shipped suite given ``data`` it does not use is a
:class:`~clawgym_env.errors.TaskError`, never silently ignored.
"""

from __future__ import annotations

from pathlib import Path

from clawgym_env.errors import TaskError
from clawgym_env.task import Suite
from tasks.taskdir import is_task_dir
from tasks.taskfolder import is_candidate, load_task_folder

BUNDLED_ROOT = Path(__file__).resolve().parent
"""The folder suites shipped in this package are subfolders of this package (``builtin/``)."""

PathLike = str | Path


def bundled_folders() -> dict[str, Path]:
    """Name → folder of each suite shipped as task dirs in this package (``{"builtin": .../tasks/builtin}``)."""
    out: dict[str, Path] = {}
    for p in sorted(BUNDLED_ROOT.iterdir()):
        if is_candidate(p) and any(is_task_dir(c) for c in p.iterdir()):
            out[p.name] = p
    return out


def _no_data(name: str, data: PathLike | None) -> None:
    if data is not None:
        raise TaskError(f"suite {name!r} ships with ClawGym and takes no data (got {str(data)!r}); drop --data/data=")


def _loaded(suite: Suite | None, name: str) -> Suite:
    """``suite``; the data loaders return None only for a spec that is not theirs, never for their own names."""
    if suite is None:
        raise TaskError(f"suite {name!r}: its data loader did not recognise its own name; this is a bug in "
                        f"tasks.suite_loaders, please report it")
    return suite


def builtin_suite(spec: str = "builtin", data: PathLike | None = None) -> Suite:
    """The ``builtin`` suite: every task dir under ``tasks/builtin/``."""
    _no_data("builtin", data)
    return load_task_folder(BUNDLED_ROOT / "builtin", "builtin")


def folder_root(spec: PathLike) -> Path:
    """The resolved folder of a suite path, or a :class:`TaskError` saying what the path is instead."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path.resolve()
        if is_task_dir(path):
            raise TaskError(f"{path}: is a single task dir, not a suite; resolve it as a task "
                            f"(resolve_task) or pass the folder that holds it")
        return path
    if path.exists():
        raise TaskError(f"{path}: not a folder; a suite is a folder of task dirs")
    raise TaskError(f"no suite folder {str(spec)!r}; pass the path to a folder of task dirs, or a registered suite "
                    f"name (`clawgym tasks list --suite builtin`)")


def folder_suite(spec: PathLike, data: PathLike | None = None, *, corpus_dir: PathLike | None = None,
                 cache_dir: PathLike | None = None) -> Suite:
    """A suite from a path: a folder of ClawGym task dirs (named by the folder), or benchmark data — an
    OfficeQA CSV or folder, a ClawGym-Bench table or folder, JobBench data. ``corpus_dir`` / ``cache_dir``
    apply to OfficeQA / ClawGym-Bench data only."""
    from tasks.benchdata import data_suite_for
    from tasks.jobbench import jobbench_suite_for

    _no_data(f"folder {spec}", data)
    options = {k: v for k, v in (("corpus_dir", corpus_dir), ("cache_dir", cache_dir)) if v is not None}
    bench = data_suite_for(spec, None, options)
    if bench is not None:
        return bench
    if options:
        raise TaskError(f"options {sorted(options)} apply only to OfficeQA and ClawGym-Bench data; {str(spec)!r} "
                        f"is neither")
    jobbench = jobbench_suite_for(spec)
    if jobbench is not None:
        return jobbench
    root = folder_root(spec)
    return load_task_folder(root, root.name)


def _officeqa(name: str, subset: str, data: PathLike | None, corpus_dir: PathLike | None,
              cache_dir: PathLike | None, tolerance: float | None, skip_incomplete: bool) -> Suite:
    from tasks.benchdata import data_suite_for

    options: dict[str, object] = {"subset": subset, "skip_incomplete": skip_incomplete}
    options.update({k: v for k, v in (("corpus_dir", corpus_dir), ("cache_dir", cache_dir),
                                      ("tolerance", tolerance)) if v is not None})
    return _loaded(data_suite_for(name, data, options), name)


def officeqa_suite(spec: str = "officeqa", data: PathLike | None = None, *, subset: str = "full",
                   corpus_dir: PathLike | None = None, cache_dir: PathLike | None = None,
                   tolerance: float | None = None, skip_incomplete: bool = False) -> Suite:
    """OfficeQA (every question, or ``subset="pro"``) from ``data`` or ``$CLAWGYM_OFFICEQA_DATA``
    (see :func:`tasks.officeqa.load_officeqa` for the options)."""
    return _officeqa("officeqa", subset, data, corpus_dir, cache_dir, tolerance, skip_incomplete)


def officeqa_pro_suite(spec: str = "officeqa-pro", data: PathLike | None = None, *,
                       corpus_dir: PathLike | None = None, cache_dir: PathLike | None = None,
                       tolerance: float | None = None, skip_incomplete: bool = False) -> Suite:
    """OfficeQA Pro (the ``hard`` questions) from ``data`` or ``$CLAWGYM_OFFICEQA_DATA``."""
    return _officeqa("officeqa-pro", "pro", data, corpus_dir, cache_dir, tolerance, skip_incomplete)


def clawgym_bench_suite(spec: str = "clawgym-bench", data: PathLike | None = None, *, split: str | None = None,
                        cache_dir: PathLike | None = None) -> Suite:
    """ClawGym-Bench from ``data`` (task dirs, parquet/JSONL), else ``$CLAWGYM_BENCH_DATA``, else the hub
    dataset (see :func:`tasks.clawgym_bench.load_clawgym_bench`)."""
    from tasks.benchdata import data_suite_for

    options = {k: v for k, v in (("split", split), ("cache_dir", cache_dir)) if v is not None}
    return _loaded(data_suite_for("clawgym-bench", data, options), "clawgym-bench")


def _jobbench(name: str, data: PathLike | None) -> Suite:
    from tasks.jobbench import jobbench_suite_for

    return _loaded(jobbench_suite_for(name, data), name)


def jobbench_suite(spec: str = "jobbench", data: PathLike | None = None) -> Suite:
    """JobBench, split ``main``, from ``data`` or ``$CLAWGYM_JOBBENCH_DATA`` (see :mod:`tasks.jobbench`)."""
    return _jobbench("jobbench", data)


def jobbench_main_suite(spec: str = "jobbench-main", data: PathLike | None = None) -> Suite:
    """JobBench, split ``main`` (the same tasks as ``jobbench``, named ``jobbench-main``)."""
    return _jobbench("jobbench-main", data)


def jobbench_easy_suite(spec: str = "jobbench-easy", data: PathLike | None = None) -> Suite:
    """JobBench, split ``easy``, from ``data`` or ``$CLAWGYM_JOBBENCH_DATA``."""
    return _jobbench("jobbench-easy", data)


LOADERS = {"builtin": builtin_suite, "folder": folder_suite, "officeqa": officeqa_suite,
           "officeqa-pro": officeqa_pro_suite, "clawgym-bench": clawgym_bench_suite, "jobbench": jobbench_suite,
           "jobbench-main": jobbench_main_suite, "jobbench-easy": jobbench_easy_suite}
"""The shipped suite names and their loaders, as ``pyproject.toml`` declares them (a test keeps the two equal)."""
