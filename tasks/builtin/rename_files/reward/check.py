"""rename_files: photos/IMG_<n>.JPG renamed to photos/holiday_<n>.jpg; every other file of photos/ left alone.

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
    "photos/IMG_0003.JPG": "647cb381df18b2b4d717d25a92181b45c6287fe4d7645d1e97f169207b8f6392",
    "photos/IMG_0017.JPG": "1c0f3f8220111a3525933806beba6b39bce114c93de5ce8eaeb9f81e4e57fb68",
    "photos/IMG_0042.JPG": "367a1bb746855a527c2ae8a8ebf056724fb8d3ed74f778220bc1a646a4bddf63",
    "photos/IMG_0108.JPG": "b28bd9700a0712dc511dd1e43b70ed9b4db4ddf95fb4010a97ee3922afd0f59c",
    "photos/IMG_0256.JPG": "1ae1782252ab64781f6d54f8c0f0c8a9890377d4b02e20911c89f8c68bb21c14",
    "photos/IMG_0999.png": "9fe3b338be7af126b01f0743c1677c48b6ed8a9575c77a01400c0652c86b21e4",
    "photos/notes.txt": "afc3a146e2c84865df4e9651cf07ca0ea308dcf0a774b71b4bcb6f1a6cf68b13",
}
MOVES = {
    "photos/IMG_0003.JPG": "photos/holiday_0003.jpg",
    "photos/IMG_0017.JPG": "photos/holiday_0017.jpg",
    "photos/IMG_0042.JPG": "photos/holiday_0042.jpg",
    "photos/IMG_0108.JPG": "photos/holiday_0108.jpg",
    "photos/IMG_0256.JPG": "photos/holiday_0256.jpg",
    "photos/IMG_0999.png": "photos/IMG_0999.png",  # not a JPG: stays
    "photos/notes.txt": "photos/notes.txt",  # stays
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


def _holds(files, name, digest):
    """True when photos/<name> is a file holding the bytes of sha256 ``digest``."""
    try:
        return name in files and hashlib.sha256(files[name].read_bytes()).hexdigest() == digest
    except Exception:
        return False


def grade(transcript, workspace_path):
    d = Path(workspace_path) / "photos"
    scores = {"renamed": 0.0, "contents_kept": 0.0, "others_untouched": 0.0, "nothing_else": 0.0}
    if inputs_tampered(Path(workspace_path)):
        return scores
    try:
        files = {p.name: p for p in d.iterdir() if p.is_file()}
    except Exception:
        return scores
    renamed = {dst.rsplit("/", 1)[1]: src for src, dst in MOVES.items() if src != dst}
    kept = {dst.rsplit("/", 1)[1]: src for src, dst in MOVES.items() if src == dst}
    if all(n in files for n in renamed):
        scores["renamed"] = 1.0
        if all(_holds(files, n, PRISTINE_SHA256[src]) for n, src in renamed.items()):
            scores["contents_kept"] = 1.0
    if all(_holds(files, n, PRISTINE_SHA256[src]) for n, src in kept.items()):
        scores["others_untouched"] = 1.0
    if set(files) == set(renamed) | set(kept):
        scores["nothing_else"] = 1.0
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
