import json
import sys
from pathlib import Path


def _expected(limit=120):
    ps = [n for n in range(2, limit) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
    lines = [" ".join(str(p) for p in ps[k:k + 10]) for k in range(0, len(ps), 10)]
    return "\n".join(lines + ["count: %d" % len(ps)]) + "\n"


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"file_exists": 0.0, "exact_output": 0.0}
    p = ws / "primes_output.txt"
    if not p.is_file():
        return scores
    scores["file_exists"] = 1.0
    try:
        if p.read_text(encoding="utf-8").rstrip("\n") == _expected().rstrip("\n"):
            scores["exact_output"] = 1.0
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
