import json
import sys
from pathlib import Path


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"right_names": 0.0, "no_duplicates": 0.0, "order": 0.0}
    try:
        src = (ws / "names.txt").read_text(encoding="utf-8").splitlines()
        got = (ws / "sorted_names.txt").read_text(encoding="utf-8").splitlines()
    except Exception:
        return scores
    names = {s.strip() for s in src if s.strip()}
    expected = sorted(names, key=lambda s: (s.lower(), s))
    got = [g for g in got if g.strip()]
    if set(got) == names:
        scores["right_names"] = 1.0
    if got and len(got) == len(set(got)):
        scores["no_duplicates"] = 1.0
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
