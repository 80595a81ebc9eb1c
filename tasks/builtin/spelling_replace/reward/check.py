import json
import re
import sys
from pathlib import Path

PAIRS = [("colour", "color"), ("favourite", "favorite"), ("organis", "organiz")]


def _americanise(text):
    for gb, us in PAIRS:
        text = text.replace(gb, us).replace(gb.capitalize(), us.capitalize()).replace(gb.upper(), us.upper())
    return text


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"no_british_left": 0.0, "exact_copy": 0.0}
    try:
        src = (ws / "notes.md").read_text(encoding="utf-8")
        got = (ws / "notes_us.md").read_text(encoding="utf-8")
    except Exception:
        return scores
    if not re.search(r"colour|favourite|organis", got, re.I):
        scores["no_british_left"] = 1.0
    if got.rstrip("\n") == _americanise(src).rstrip("\n"):
        scores["exact_copy"] = 1.0
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
