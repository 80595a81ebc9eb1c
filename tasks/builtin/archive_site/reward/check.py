import json
import sys
import tarfile
from pathlib import Path


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"archive_readable": 0.0, "right_members": 0.0, "contents_match": 0.0, "manifest": 0.0}
    expected = sorted(p.relative_to(ws).as_posix() for p in (ws / "site").rglob("*")
                      if p.is_file() and not p.name.startswith("draft"))
    members = {}
    try:
        with tarfile.open(str(ws / "dist" / "site.tar.gz"), "r:gz") as tar:
            for m in tar.getmembers():
                if m.isfile():
                    name = m.name[2:] if m.name.startswith("./") else m.name
                    members[name] = tar.extractfile(m).read()
        scores["archive_readable"] = 1.0
    except Exception:
        members = {}
    if members and sorted(members) == expected:
        scores["right_members"] = 1.0
        if all(members[n] == (ws / n).read_bytes() for n in expected):
            scores["contents_match"] = 1.0
    try:
        lines = [ln.strip() for ln in (ws / "dist" / "MANIFEST.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
        if lines == expected:
            scores["manifest"] = 1.0
    except Exception:
        pass
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
