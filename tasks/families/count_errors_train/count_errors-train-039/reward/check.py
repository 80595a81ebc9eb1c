import json
import sys
from pathlib import Path

EXPECTED = 5


def grade(workspace):
    path = Path(workspace) / "errors.txt"
    scores = {"file_exists": 0.0, "count_exact": 0.0}
    if path.is_file():
        scores["file_exists"] = 1.0
        try:
            text = path.read_text(encoding="utf-8").strip()
        except Exception:
            text = None
        if text == str(EXPECTED):
            scores["count_exact"] = 1.0
    return scores


if __name__ == "__main__":
    print(json.dumps(grade(sys.argv[1] if len(sys.argv) > 1 else ".")))
