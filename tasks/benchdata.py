"""Suite specs that name benchmark *data* (OfficeQA, ClawGym-Bench) for :func:`tasks.load_suite`.

Spec forms (the bundled suites keep priority over these names):
  * ``officeqa`` / ``officeqa-pro`` with ``data=`` a question CSV or a folder holding
    ``officeqa_full.csv`` (else ``$CLAWGYM_OFFICEQA_DATA``); the corpus is searched under the CSV's
    folder unless ``corpus_dir=`` says otherwise;
  * ``clawgym-bench`` with ``data=`` task dirs, parquet/JSONL files or a folder of them (else
    ``$CLAWGYM_BENCH_DATA``, else the hub dataset ``RUC-AIBOX/ClawGym-Bench``);
  * a path to such data: an OfficeQA CSV (its header has ``uid, question, answer,
    source_files``), a folder holding ``officeqa_full.csv``/``officeqa_pro.csv``/``officeqa.csv``,
    or a parquet/JSONL/JSON table whose rows have ``prompt`` and ``input_files`` (a folder of them);
  * for :func:`tasks.resolve_task`: ``<one of the above>/<task_id>``.

Invariant: a spec that names none of these returns None, so the caller's other loaders run; a
ClawGym-Bench table is recognised by its columns, never by its file extension alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from clawgym_env.errors import TaskError
from clawgym_env.task import Suite, Task

SUITES = {"officeqa": ("officeqa", "full"), "officeqa-pro": ("officeqa", "pro"),
          "clawgym-bench": ("clawgym-bench", None)}
DATA_ENV = {"officeqa": "CLAWGYM_OFFICEQA_DATA", "clawgym-bench": "CLAWGYM_BENCH_DATA"}
OFFICEQA_CSVS = ("officeqa_full.csv", "officeqa_pro.csv", "officeqa.csv")
BENCH_COLUMNS = {"prompt", "input_files"}


def _table_columns(f: Path) -> set[str]:
    """Column names of a parquet file, or keys of the first row of a JSONL/JSON file."""
    try:
        if f.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return set(pq.read_schema(f).names)
        with f.open(encoding="utf-8") as fh:
            if f.suffix.lower() == ".jsonl":
                first = next((ln for ln in fh if ln.strip()), "")
                row = json.loads(first) if first else {}
            else:
                data = json.load(fh)
                row = data[0] if isinstance(data, list) and data else data
        return set(row) if isinstance(row, dict) else set()
    except Exception:  # noqa: BLE001 - unreadable or not a table: not ours
        return set()


def kind_of_path(path: str | Path) -> str | None:
    """``"officeqa"``, ``"clawgym-bench"`` or None for a path (see module doc)."""
    from tasks.clawgym_bench import _table_files
    from tasks.officeqa import looks_like_officeqa_csv
    from tasks.taskdir import is_task_dir

    p = Path(path).expanduser()
    if p.is_file():
        if looks_like_officeqa_csv(p):
            return "officeqa"
        return "clawgym-bench" if BENCH_COLUMNS <= _table_columns(p) else None
    if not p.is_dir():
        return None
    if any((p / n).is_file() and looks_like_officeqa_csv(p / n) for n in OFFICEQA_CSVS):
        return "officeqa"
    if any(is_task_dir(c) for c in p.iterdir()):
        return None  # a folder of task dirs: the plain loader's
    tables = _table_files(p)
    return "clawgym-bench" if tables and BENCH_COLUMNS <= _table_columns(tables[0]) else None


def data_suite_for(spec: str | Path, data: str | Path | None = None,
                   options: dict[str, Any] | None = None,  # passed on to the loader; each checks its own
                   ) -> Suite | None:
    """The suite ``spec`` names when it is OfficeQA or ClawGym-Bench data, else None."""
    from tasks.clawgym_bench import HUB_ID, load_clawgym_bench
    from tasks.officeqa import load_officeqa

    opts = dict(options or {})
    if isinstance(spec, str) and spec in SUITES:
        kind, subset = SUITES[spec]
        path = data or os.environ.get(DATA_ENV[kind]) or None
        if kind == "officeqa":
            if not path:
                raise TaskError(f"suite {spec!r} needs the OfficeQA data: load_suite({spec!r}, data=PATH) or "
                                f"set {DATA_ENV[kind]} (the question CSV, or the folder holding "
                                f"officeqa_full.csv and the treasury_bulletin_* documents)")
            opts.setdefault("subset", subset)
            return load_officeqa(path, name=opts.pop("name", spec), **opts)
        return load_clawgym_bench(path or HUB_ID, name=opts.pop("name", spec), **opts)
    if data is not None:
        return None
    path_kind = kind_of_path(spec)
    if path_kind == "officeqa":
        return load_officeqa(spec, **opts)
    if path_kind == "clawgym-bench":
        return load_clawgym_bench(Path(spec).expanduser(), **opts)
    return None


def data_task_for(spec: str | Path) -> Task | None:
    """The task ``<data suite spec>/<task_id>`` names, else None."""
    text = str(spec).rstrip("/")
    if "/" not in text:
        return None
    head, task_id = text.rsplit("/", 1)
    if head not in SUITES and kind_of_path(head) is None:
        return None
    suite = data_suite_for(head)
    return suite.get(task_id) if suite is not None else None
