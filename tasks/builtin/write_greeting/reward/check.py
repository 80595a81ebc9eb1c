import json
import sys
from pathlib import Path


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"file_exists": 0.0, "content_exact": 0.0}
    p = ws / "greeting.txt"
    if p.is_file():
        scores["file_exists"] = 1.0
        try:
            text = p.read_text(encoding="utf-8")
        except Exception:
            text = None
        if text is not None and text.rstrip("\n") == "Hello, ClawGym!" and text.count("\n") <= 1:
            scores["content_exact"] = 1.0
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
