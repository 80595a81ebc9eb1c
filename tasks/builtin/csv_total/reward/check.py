import csv
import json
import re
import sys
from decimal import Decimal
from pathlib import Path


def _expected(ws):
    try:
        with (ws / "sales.csv").open(newline="", encoding="utf-8") as f:
            total = sum(Decimal(r["qty"]) * Decimal(r["unit_price"]) for r in csv.DictReader(f))
        return total.quantize(Decimal("0.01"))
    except Exception:
        return None


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"format": 0.0, "value": 0.0}
    try:
        text = (ws / "total.txt").read_text(encoding="utf-8").strip()
    except Exception:
        return scores
    if re.fullmatch(r"\d+\.\d{2}", text):
        scores["format"] = 1.0
        exp = _expected(ws)
        if exp is not None and Decimal(text) == exp:
            scores["value"] = 1.0
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
