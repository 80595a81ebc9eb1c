import csv
import json
import os
import re
import sys
from pathlib import Path


def read_final_message():
    """The agent's final answer from the verifier payload; None when missing or unreadable."""
    path = os.environ.get("OPENCLAW_REWARD_PAYLOAD")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except Exception:
        return None
    msg = data.get("final_message") if isinstance(data, dict) else None
    return msg if isinstance(msg, str) else None


def numbers_in(text):
    """Integers written in text (thousands separators allowed), in order."""
    out = []
    for m in re.finditer(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?![\d])|(?<![\w.])-?\d+(?:\.\d+)?(?![\w])", text):
        s = m.group(0).replace(",", "")
        try:
            out.append(float(s))
        except ValueError:
            pass
    return out


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"city_correct": 0.0, "density_correct": 0.0}
    final = read_final_message()
    if not final or not final.strip():
        return scores
    try:
        with (ws / "cities.csv").open(newline="", encoding="utf-8") as f:
            rows = [(r["city"], float(r["population"]) / float(r["area_km2"])) for r in csv.DictReader(f)]
        city, density = max(rows, key=lambda r: r[1])
    except Exception:
        return scores
    low = final.lower()
    mentioned = [c for c, _ in rows if re.search(r"\b" + re.escape(c.lower()) + r"\b", low)]
    if mentioned == [city]:
        scores["city_correct"] = 1.0
    if any(abs(n - density) <= 1 for n in numbers_in(final)):
        scores["density_correct"] = 1.0
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
