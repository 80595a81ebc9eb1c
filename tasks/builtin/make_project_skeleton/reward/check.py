import json
import re
import sys
from pathlib import Path


def _read(p):
    try:
        return p.read_text(encoding="utf-8")
    except Exception:
        return None


def grade(transcript, workspace_path):
    root = Path(workspace_path) / "calc"
    scores = {"folders": 0.0, "package_version": 0.0, "tests_init": 0.0, "readme": 0.0, "gitignore": 0.0}
    if (root / "src" / "calc").is_dir() and (root / "tests").is_dir():
        scores["folders"] = 1.0
    init = _read(root / "src" / "calc" / "__init__.py")
    if init is not None and re.search(r"^__version__\s*=\s*[\"']0\.1\.0[\"']\s*$", init, re.M):
        scores["package_version"] = 1.0
    tinit = _read(root / "tests" / "__init__.py")
    if tinit is not None and not tinit.strip():
        scores["tests_init"] = 1.0
    readme = _read(root / "README.md")
    if readme is not None and readme.splitlines()[:1] == ["# calc"]:
        scores["readme"] = 1.0
    gi = _read(root / ".gitignore")
    if gi is not None and "__pycache__/" in [ln.strip() for ln in gi.splitlines()]:
        scores["gitignore"] = 1.0
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
