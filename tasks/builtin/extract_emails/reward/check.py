import json
import re
import sys
from pathlib import Path

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"all_found": 0.0, "exact_list": 0.0}
    try:
        src = (ws / "contacts.txt").read_text(encoding="utf-8")
        got = [ln.strip() for ln in (ws / "emails.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
    except Exception:
        return scores
    expected = sorted({m.lower() for m in EMAIL.findall(src)})
    if expected and {g.lower() for g in got} == set(expected):
        scores["all_found"] = 1.0
    if got == expected:
        scores["exact_list"] = 1.0
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
