"""Trivial versions of a task's input files, for the input-tampering adversary.

A check that recomputes its expected answer from files the agent may rewrite can be beaten by
shrinking those files to something trivial and answering for the trivial version. :func:`trivialise`
gives the trivial version of one input file, by its name and content:

* ``.csv``/``.tsv``: the header and the first data row;
* ``.json``: every list cut to its first item, at every depth (a file that does not parse: its first line);
* ``.jsonl``/``.ndjson`` and any other text: the first non-empty line;
* binary content (a NUL byte, or not UTF-8): empty.

Invariants: pure (bytes in, bytes out; no file is touched); the result is never longer than
:data:`MAX_TRIVIAL` bytes plus a newline; ``None`` means "leave this file as it is" (empty already, or
the trivial version equals it).
"""

from __future__ import annotations

import json
from typing import Any

MAX_TRIVIAL = 4096
"""Bytes of a trivial version at most (a first line of a one-line 10 MB file is cut here)."""


def _cut_lists(value: Any) -> Any:
    if isinstance(value, list):
        return [_cut_lists(v) for v in value[:1]]
    if isinstance(value, dict):
        return {k: _cut_lists(v) for k, v in value.items()}
    return value


def _lines(text: str, n: int) -> str:
    kept = [ln for ln in text.splitlines() if ln.strip()][:n]
    out = "\n".join(kept)
    return (out[:MAX_TRIVIAL] + "\n") if out else ""


def trivialise(name: str, data: bytes, *, complete: bool = True) -> bytes | None:
    """The trivial version of the input file ``name`` holding ``data`` (None: leave it unchanged).

    ``complete`` says whether ``data`` is the whole file (a prefix is never parsed as JSON)."""
    if not data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        return b""
    lower = name.lower()
    out: str | None = None
    if lower.endswith((".csv", ".tsv")):
        out = _lines(text, 2)
    elif lower.endswith(".json") and complete:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if value is not None:
            dumped = json.dumps(_cut_lists(value), indent=2, ensure_ascii=False) + "\n"
            out = dumped if len(dumped) <= MAX_TRIVIAL else _lines(text, 1)
    if out is None:
        out = _lines(text, 1)
    result = out.encode("utf-8")
    return None if result == data else result
