"""json_merge_config: config/merged.json is the deep merge of config/defaults.json with config/overrides.json.

The expected answer is a constant, computed once from the pristine task; the workspace is read only for the
agent's outputs. An input file that is still in the workspace but no longer holds its pristine bytes
(sha256 below) means the inputs were rewritten: every sub-score is then 0.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

PRISTINE_SHA256 = {
    "config/defaults.json": "54092b1f16c5a4b353425f12ba6d92d682a7901ec3c1089f0af13c8038a64b8f",
    "config/overrides.json": "b7c98c34c79d5f8deedff52e146171c8f4c0ebb625d119e3d04690df64bf3b3a",
}
# The parsed contents of the pristine defaults and overrides.
DEFAULTS = {"server": {"host": "127.0.0.1", "port": 8000, "tls": {"enabled": False, "cert": None}},
            "logging": {"level": "info", "handlers": ["console"]}, "features": {"beta": False, "search": True}}
OVERRIDES = {"server": {"port": 9443, "tls": {"enabled": True, "cert": "/etc/ssl/app.pem"}},
             "logging": {"handlers": ["file"]}, "features": {"beta": True}}


MAX_INPUT_BYTES = 1 << 20  # every pristine input is far smaller: a file this large there was rewritten


def _altered(path, digest):
    """True when ``path`` exists but is not a regular file holding the pristine bytes (sha256 ``digest``)."""
    if not os.path.lexists(path):
        return False
    try:
        if not path.is_file() or path.stat().st_size > MAX_INPUT_BYTES:
            return True
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest() != digest
    except OSError:
        return True


def inputs_tampered(ws):
    """True when an input file the task gave is still in the workspace with other bytes than the pristine task's."""
    return any(_altered(ws / rel, digest) for rel, digest in PRISTINE_SHA256.items())


def _merge(a, b):
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _leaves(x, prefix=()):
    if isinstance(x, dict) and x:
        for k, v in x.items():
            for item in _leaves(v, prefix + (k,)):
                yield item
    else:
        yield prefix, x


def _lookup(x, path):
    for k in path:
        if not isinstance(x, dict) or k not in x:
            return KeyError
        x = x[k]
    return x


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"valid_json": 0.0, "overrides_applied": 0.0, "defaults_kept": 0.0, "exact": 0.0}
    if inputs_tampered(ws):
        return scores
    try:
        got = json.loads((ws / "config" / "merged.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(got, dict):
        return scores
    scores["valid_json"] = 1.0
    expected = _merge(DEFAULTS, OVERRIDES)
    if all(_lookup(got, p) == v for p, v in _leaves(OVERRIDES)):
        scores["overrides_applied"] = 1.0
    if all(_lookup(got, p) == _lookup(expected, p) for p, _ in _leaves(DEFAULTS)):
        scores["defaults_kept"] = 1.0
    if got == expected:
        scores["exact"] = 1.0
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
