"""Summarise a metrics CSV (name,value): the entries with the largest values."""

import argparse
import csv
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv_path", help="CSV file with columns name,value")
    ap.add_argument("--format", choices=["text", "json"], default="text", help="output format")
    ap.add_argument("--top", type=int, default=5, help="how many entries to show (default 5)")
    args = ap.parse_args()
    with open(args.csv_path, newline="") as f:
        rows = [(r["name"], float(r["value"])) for r in csv.DictReader(f)]
    rows.sort(key=lambda r: (-r[1], r[0]))
    top = rows[:args.top]
    if args.format == "json":
        print(json.dumps({"top": [{"name": n, "value": v} for n, v in top], "count": len(rows)}, indent=2))
    else:
        for n, v in top:
            print("%-12s %10.2f" % (n, v))


if __name__ == "__main__":
    main()
