"""backup_and_edit_config: app/settings.ini backed up unchanged to app/settings.ini.bak, then edited in place.

The expected values are constants taken once from the pristine task. app/settings.ini is the one input the task
asks the agent to rewrite (EDITED_INPUTS), so it is read as an output; the backup must hold the pristine bytes
(sha256 below).
"""

import configparser
import hashlib
import json
import sys
from pathlib import Path

PRISTINE_SHA256 = {
    "app/settings.ini": "48f134b202cefb148ef1b7a0ece68ce7eef98cb54a06878a4c1d63502d3a38d4",
}
EDITED_INPUTS = ("app/settings.ini",)
CHANGES = {("server", "port"): "9090", ("server", "debug"): "false", ("database", "pool"): "10"}
ORIGINAL = {("server", "host"): "0.0.0.0", ("database", "name"): "app", ("database", "timeout"): "30"}
COMMENTS = ("; app settings", "; connection pool")


def _parse(text):
    cp = configparser.ConfigParser(inline_comment_prefixes=None)
    cp.read_string(text)
    return {(s, k): v for s in cp.sections() for k, v in cp.items(s)}


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    settings = ws / EDITED_INPUTS[0]
    scores = {"backup_intact": 0.0, "values_changed": 0.0, "others_kept": 0.0, "comments_kept": 0.0}
    try:
        backup = (ws / "app" / "settings.ini.bak").read_bytes()
        if hashlib.sha256(backup).hexdigest() == PRISTINE_SHA256[EDITED_INPUTS[0]]:
            scores["backup_intact"] = 1.0
    except Exception:
        pass
    try:
        text = settings.read_text(encoding="utf-8")
        got = _parse(text)
    except Exception:
        return scores
    if all(got.get(k) == v for k, v in CHANGES.items()):
        scores["values_changed"] = 1.0
    if set(got) == set(ORIGINAL) | set(CHANGES) and all(got[k] == v for k, v in ORIGINAL.items()):
        scores["others_kept"] = 1.0
    lines = [ln.strip() for ln in text.splitlines()]
    if all(c in lines for c in COMMENTS):
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
