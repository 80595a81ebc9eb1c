import csv
import json
import sys
from pathlib import Path


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"valid_json_array": 0.0, "row_count": 0.0, "types": 0.0, "values": 0.0}
    try:
        with (ws / "inventory.csv").open(newline="", encoding="utf-8") as f:
            src = list(csv.DictReader(f))
        data = json.loads((ws / "inventory.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(data, list) or not all(isinstance(o, dict) for o in data):
        return scores
    scores["valid_json_array"] = 1.0
    if len(data) == len(src):
        scores["row_count"] = 1.0
    def typed(o):
        return (set(o) == {"sku", "name", "qty", "price"} and isinstance(o["sku"], str)
                and isinstance(o["name"], str) and type(o["qty"]) is int
                and type(o["price"]) in (int, float))
    if data and all(typed(o) for o in data):
        scores["types"] = 1.0
    try:
        expected = [(r["sku"], r["name"], int(r["qty"]), float(r["price"])) for r in src]
        got = [(o.get("sku"), o.get("name"), o.get("qty"), float(o.get("price"))) for o in data]
        if got == expected:
            scores["values"] = 1.0
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
