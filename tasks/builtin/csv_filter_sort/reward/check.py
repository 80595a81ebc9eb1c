import csv
import json
import sys
from pathlib import Path


def _read(p):
    try:
        with p.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        return rows if rows else None
    except Exception:
        return None


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"header": 0.0, "right_rows": 0.0, "order": 0.0}
    src = _read(ws / "employees.csv")
    out = _read(ws / "output" / "engineering.csv")
    if src is None or out is None:
        return scores
    header, body = src[0], src[1:]
    expected = [r for r in body if r[1] == "Engineering"]
    expected.sort(key=lambda r: (-int(r[2]), r[0]))
    if out[0] == header:
        scores["header"] = 1.0
    got = [r for r in out[1:] if r]
    if sorted(got) == sorted(expected):
        scores["right_rows"] = 1.0
        if got == expected:
            scores["order"] = 1.0
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
