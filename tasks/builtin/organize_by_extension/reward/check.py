"""organize_by_extension: every file of inbox/ moved into inbox/<lowercase extension>/ (or inbox/other/).

The expected layout is a constant, taken once from the pristine task: MOVES maps each input file to where the
task puts it, and the moved files must hold the pristine bytes (sha256 below). An input file that is present,
at its own path or its destination, with other bytes than the pristine ones means the inputs were rewritten:
every sub-score is then 0.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

PRISTINE_SHA256 = {
    "inbox/README": "578c05eae46cb1dfaf27d47f7a5ccb7876c2eb5aa6fa93671ea2724f00349f95",
    "inbox/archive.tar.gz": "db54a0dc0e228817bfd5fe0b45b84e7bf15e9459baca4c358a981c2b9cdfdc8a",
    "inbox/data.csv": "492d5ea496056f1a6a6592241032fab764c321596317930b4fa0e1e8bc3b7470",
    "inbox/notes.txt": "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03",
    "inbox/photo.png": "33d8344a7135c42aa3876706b908f95b702d83ff53e05e4aaff17c07bf67a98e",
    "inbox/report.PDF": "0e9579f87f259a122d7c46ef4468c9b97a2eaa25572602a7510774395f2ed4f0",
    "inbox/summary.pdf": "ab2d93eef0916ab3b522a6cd42be5f8fd530ecc18432cc009a8d462c3bb18c59",
    "inbox/table.csv": "8fa6664e632ccd0c2e9e9c63df506bfc5e897cb0c7c0d9a327ab9cd6edeec941",
}
MOVES = {
    "inbox/README": "inbox/other/README",
    "inbox/archive.tar.gz": "inbox/gz/archive.tar.gz",
    "inbox/data.csv": "inbox/csv/data.csv",
    "inbox/notes.txt": "inbox/txt/notes.txt",
    "inbox/photo.png": "inbox/png/photo.png",
    "inbox/report.PDF": "inbox/pdf/report.PDF",
    "inbox/summary.pdf": "inbox/pdf/summary.pdf",
    "inbox/table.csv": "inbox/csv/table.csv",
}


MAX_INPUT_BYTES = 1 << 20  # every pristine input is far smaller: a file this large there was rewritten


def _altered(path, digest):
    """True when ``path`` exists but is not a regular file holding the pristine bytes (sha256 ``digest``)."""
    if not os.path.lexists(path):
        return False
    try:
        if not path.is_file() or path.stat().st_size > MAX_INPUT_BYTES:
            return True
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest() != digest
    except OSError:
        return True


def inputs_tampered(ws):
    """True when an input file the task gave, at its own path or where the task moves it, holds other bytes than
    the pristine task's."""
    return any(_altered(ws / p, PRISTINE_SHA256[src]) for src, dst in MOVES.items() for p in (src, dst))


def grade(transcript, workspace_path):
    inbox = Path(workspace_path) / "inbox"
    scores = {"all_moved": 0.0, "contents_kept": 0.0, "no_loose_files": 0.0, "no_strays": 0.0}
    if inputs_tampered(Path(workspace_path)):
        return scores
    expected = {dst.split("/", 1)[1]: src for src, dst in MOVES.items()}  # inbox-relative destination -> input
    try:
        found = {p.relative_to(inbox).as_posix(): p for p in inbox.rglob("*") if p.is_file()}
    except Exception:
        return scores
    if all(k in found for k in expected):
        scores["all_moved"] = 1.0
        try:
            if all(hashlib.sha256(found[k].read_bytes()).hexdigest() == PRISTINE_SHA256[src]
                   for k, src in expected.items()):
                scores["contents_kept"] = 1.0
        except Exception:
            pass
    if found and not any("/" not in k for k in found):
        scores["no_loose_files"] = 1.0
    if set(found) == set(expected):
        scores["no_strays"] = 1.0
    return scores


def main():
    workspace = sys.argv[1] if len(sys.argv) > 1 else "."
    try:
        result = grade([], workspace)
    except Exception:
        result = {}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
