import csv
import json
import sys
from pathlib import Path


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"valid_json": 0.0, "top3": 0.0, "count": 0.0}
    try:
        with (ws / "data" / "metrics.csv").open(newline="", encoding="utf-8") as f:
            rows = [(r["name"], float(r["value"])) for r in csv.DictReader(f)]
        got = json.loads((ws / "report.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(got, dict):
        return scores
    scores["valid_json"] = 1.0
    rows.sort(key=lambda r: (-r[1], r[0]))
    if got.get("top") == [{"name": n, "value": v} for n, v in rows[:3]]:
        scores["top3"] = 1.0
    if got.get("count") == len(rows):
        scores["count"] = 1.0
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
