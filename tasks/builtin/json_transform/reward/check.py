import json
import sys
from pathlib import Path


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"valid_json_array": 0.0, "right_users": 0.0, "shape": 0.0, "sorted": 0.0}
    try:
        users = json.loads((ws / "users.json").read_text(encoding="utf-8"))
        data = json.loads((ws / "active_users.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(data, list) or not all(isinstance(o, dict) for o in data):
        return scores
    scores["valid_json_array"] = 1.0
    expected = sorted(({"id": u["id"], "full_name": u["first_name"] + " " + u["last_name"]}
                       for u in users if u.get("active") is True), key=lambda o: o["id"])
    if sorted(data, key=lambda o: str(o.get("id"))) == sorted(expected, key=lambda o: str(o["id"])):
        scores["right_users"] = 1.0
    if data and all(set(o) == {"id", "full_name"} for o in data):
        scores["shape"] = 1.0
    if data == expected:
        scores["sorted"] = 1.0
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
