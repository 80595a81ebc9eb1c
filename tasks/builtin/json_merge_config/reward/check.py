import json
import sys
from pathlib import Path


def _merge(a, b):
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def grade(transcript, workspace_path):
    cfg = Path(workspace_path) / "config"
    scores = {"valid_json": 0.0, "overrides_applied": 0.0, "defaults_kept": 0.0, "exact": 0.0}
    try:
        d = json.loads((cfg / "defaults.json").read_text(encoding="utf-8"))
        o = json.loads((cfg / "overrides.json").read_text(encoding="utf-8"))
        got = json.loads((cfg / "merged.json").read_text(encoding="utf-8"))
    except Exception:
        return scores
    if not isinstance(got, dict):
        return scores
    scores["valid_json"] = 1.0
    expected = _merge(d, o)

    def leaves(x, prefix=()):
        if isinstance(x, dict) and x:
            for k, v in x.items():
                for item in leaves(v, prefix + (k,)):
                    yield item
        else:
            yield prefix, x

    def lookup(x, path):
        for k in path:
            if not isinstance(x, dict) or k not in x:
                return KeyError
            x = x[k]
        return x
    if all(lookup(got, p) == v for p, v in leaves(o)):
        scores["overrides_applied"] = 1.0
    if all(lookup(got, p) == lookup(expected, p) for p, _ in leaves(d)):
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
