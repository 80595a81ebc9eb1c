import json
import sys
from pathlib import Path

EXPECTED = {
    "pdf/report.PDF": "pdf one\n",
    "pdf/summary.pdf": "pdf two\n",
    "csv/data.csv": "a,b\n1,2\n",
    "csv/table.csv": "x\n9\n",
    "png/photo.png": "png\n",
    "txt/notes.txt": "hello\n",
    "other/README": "no extension\n",
    "gz/archive.tar.gz": "tarball\n",
}


def grade(transcript, workspace_path):
    inbox = Path(workspace_path) / "inbox"
    scores = {"all_moved": 0.0, "contents_kept": 0.0, "no_loose_files": 0.0, "no_strays": 0.0}
    try:
        found = {p.relative_to(inbox).as_posix(): p for p in inbox.rglob("*") if p.is_file()}
    except Exception:
        return scores
    if all(k in found for k in EXPECTED):
        scores["all_moved"] = 1.0
        try:
            if all(found[k].read_text(encoding="utf-8") == v for k, v in EXPECTED.items()):
                scores["contents_kept"] = 1.0
        except Exception:
            pass
    if found and not any("/" not in k for k in found):
        scores["no_loose_files"] = 1.0
    if set(found) == set(EXPECTED):
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
