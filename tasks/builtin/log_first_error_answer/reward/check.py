import json
import os
import re
import sys
from pathlib import Path

LINE = re.compile(r"^(\d\d:\d\d:\d\d) \[(\w+)\] ([\w-]+):")


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


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"time_correct": 0.0, "component_correct": 0.0}
    final = read_final_message()
    if not final or not final.strip():
        return scores
    try:
        entries = [m.groups() for m in map(LINE.match, (ws / "server.log").read_text(encoding="utf-8").splitlines()) if m]
        when, _, component = next(e for e in entries if e[1] == "ERROR")
    except Exception:
        return scores
    times = set(re.findall(r"\b\d\d:\d\d:\d\d\b", final))
    if times == {when}:
        scores["time_correct"] = 1.0
    if re.search(r"\b" + re.escape(component) + r"\b", final, re.I):
        scores["component_correct"] = 1.0
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
