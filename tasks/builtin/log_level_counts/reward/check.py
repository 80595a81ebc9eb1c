import json
import sys
from pathlib import Path


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"levels": 0.0, "errors": 0.0}
    try:
        lines = [ln.split(" ", 3) for ln in (ws / "app.log").read_text(encoding="utf-8").splitlines() if ln.strip()]
    except Exception:
        return scores
    counts = {}
    for parts in lines:
        counts[parts[2]] = counts.get(parts[2], 0) + 1
    errors = [p[3] for p in lines if p[2] == "ERROR"]
    try:
        if json.loads((ws / "levels.json").read_text(encoding="utf-8")) == counts:
            scores["levels"] = 1.0
    except Exception:
        pass
    try:
        got = [ln.rstrip() for ln in (ws / "errors.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
        if got == errors:
            scores["errors"] = 1.0
    except Exception:
        pass
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
