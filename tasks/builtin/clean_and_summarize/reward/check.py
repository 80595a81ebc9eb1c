import csv
import json
import math
import sys
from pathlib import Path


def _num(s):
    try:
        v = float(s)
        return v if math.isfinite(v) else None
    except Exception:
        return None


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    keys = ["count", "mean", "min", "max", "by_sensor"]
    scores = {"clean_csv": 0.0}
    scores.update({"summary_" + k: 0.0 for k in keys})
    try:
        with (ws / "readings.csv").open(newline="", encoding="utf-8") as f:
            rows = [(r["sensor"], _num(r["value"])) for r in csv.DictReader(f)]
    except Exception:
        return scores
    good = [(s, v) for s, v in rows if v is not None]
    try:
        with (ws / "clean.csv").open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader)
            got = [(r[0], _num(r[1])) for r in reader if r]
        if header == ["sensor", "value"] and got == good:
            scores["clean_csv"] = 1.0
    except Exception:
        pass
    values = [v for _, v in good]
    by_sensor = {}
    for s, _ in good:
        by_sensor[s] = by_sensor.get(s, 0) + 1
    expected = {"count": len(values), "mean": round(sum(values) / len(values), 3),
                "min": min(values), "max": max(values), "by_sensor": by_sensor}
    try:
        summary = json.loads((ws / "summary.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(summary, dict):
        return scores
    for k in keys:
        got_v = summary.get(k)
        if k in ("mean", "min", "max"):
            ok = isinstance(got_v, (int, float)) and not isinstance(got_v, bool) and abs(got_v - expected[k]) < 1e-6
        else:
            ok = got_v == expected[k]
        if ok:
            scores["summary_" + k] = 1.0
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
