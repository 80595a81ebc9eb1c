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
    scores = {"count_correct": 0.0}
    final = read_final_message()
    if not final or not final.strip():
        return scores
    try:
        expected = len((ws / "essay.txt").read_text(encoding="utf-8").split())
    except Exception:
        return scores
    nums = numbers_in(final)
    near_misses = [n for n in nums if n != expected and 0.5 * expected <= n <= 1.5 * expected]
    if expected in nums and not near_misses:
        scores["count_correct"] = 1.0
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
