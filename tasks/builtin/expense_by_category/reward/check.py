import csv
import json
import sys
from decimal import Decimal
from pathlib import Path


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"valid_json": 0.0, "totals": 0.0, "largest": 0.0}
    try:
        totals = {}
        with (ws / "expenses.csv").open(newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                totals[r["category"]] = totals.get(r["category"], Decimal(0)) + Decimal(r["amount"])
        largest = max(totals, key=lambda k: totals[k])
        data = json.loads((ws / "by_category.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(data, dict):
        return scores
    scores["valid_json"] = 1.0
    got = data.get("totals")
    if isinstance(got, dict) and set(got) == set(totals):
        try:
            if all(abs(Decimal(str(got[k])) - totals[k]) < Decimal("0.005") for k in totals):
                scores["totals"] = 1.0
        except Exception:
            pass
    if data.get("largest") == largest:
        scores["largest"] = 1.0
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
