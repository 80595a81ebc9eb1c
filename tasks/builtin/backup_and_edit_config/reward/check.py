import configparser
import hashlib
import json
import sys
from pathlib import Path

ORIGINAL_SHA256 = "48f134b202cefb148ef1b7a0ece68ce7eef98cb54a06878a4c1d63502d3a38d4"
CHANGES = {("server", "port"): "9090", ("server", "debug"): "false", ("database", "pool"): "10"}


def _parse(text):
    cp = configparser.ConfigParser(inline_comment_prefixes=None)
    cp.read_string(text)
    return {(s, k): v for s in cp.sections() for k, v in cp.items(s)}


def grade(transcript, workspace_path):
    app = Path(workspace_path) / "app"
    scores = {"backup_intact": 0.0, "values_changed": 0.0, "others_kept": 0.0, "comments_kept": 0.0}
    try:
        backup = (app / "settings.ini.bak").read_bytes()
        if hashlib.sha256(backup).hexdigest() == ORIGINAL_SHA256:
            scores["backup_intact"] = 1.0
    except Exception:
        pass
    try:
        text = (app / "settings.ini").read_text(encoding="utf-8")
        got = _parse(text)
    except Exception:
        return scores
    if all(got.get(k) == v for k, v in CHANGES.items()):
        scores["values_changed"] = 1.0
    original = {("server", "host"): "0.0.0.0", ("database", "name"): "app", ("database", "timeout"): "30"}
    if set(got) == set(original) | set(CHANGES) and all(got[k] == v for k, v in original.items()):
        scores["others_kept"] = 1.0
    lines = [ln.strip() for ln in text.splitlines()]
    if "; app settings" in lines and "; connection pool" in lines:
        scores["comments_kept"] = 1.0
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
