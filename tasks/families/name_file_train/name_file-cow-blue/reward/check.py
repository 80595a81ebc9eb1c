import json
import sys
from pathlib import Path

NAME = 'cow'
WORD = 'blue'


def grade(workspace):
    path = Path(workspace) / (NAME + ".txt")
    scores = {"file_exists": 0.0, "content_exact": 0.0}
    if path.is_file():
        scores["file_exists"] = 1.0
        try:
            text = path.read_text(encoding="utf-8")
        except Exception:
            text = None
        if text is not None and text.strip() == WORD:
            scores["content_exact"] = 1.0
    return scores


if __name__ == "__main__":
    print(json.dumps(grade(sys.argv[1] if len(sys.argv) > 1 else ".")))
