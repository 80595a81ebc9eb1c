"""archive_site: dist/site.tar.gz holds site/ without drafts; dist/MANIFEST.txt lists it.

The expected answer is a constant, computed once from the pristine task; the workspace is read only for the
agent's outputs (the archive's member bytes are compared with the pristine sha256). An input file that is still in the workspace but no longer holds its pristine bytes
(sha256 below) means the inputs were rewritten: every sub-score is then 0.
"""

import hashlib
import json
import os
import sys
import tarfile
from pathlib import Path

PRISTINE_SHA256 = {
    "site/draft-about.html": "2004354a707ecc863ddde9d9e5cd3452b0032e1c25438c029b8a1dcf3aae285d",
    "site/img/draft_banner.svg": "cd1fafe3cc7f06f55ead3f0dce39300aca7a8911793e76fcdd327799c0709ac2",
    "site/img/logo.svg": "e4dd91a9545a8dc742502e27ebd5773bb002c3526ab15f2ffa4334c282dd60c4",
    "site/index.html": "a4952cfa9a2c4652de405e67a2a98cf0b02c9aa536886e65047a3c9e38b4d5e3",
    "site/style.css": "0bf4d668930b5ab1d543ab1d43785e7cbe4b5f29d95ed3593ea5e9953f7cca59",
}
# The files to archive: every input under site/ whose name does not start with "draft", sorted.
MEMBERS = sorted(rel for rel in PRISTINE_SHA256 if not rel.rsplit("/", 1)[-1].startswith("draft"))


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


def grade(transcript, workspace_path):
    ws = Path(workspace_path)
    scores = {"archive_readable": 0.0, "right_members": 0.0, "contents_match": 0.0, "manifest": 0.0}
    if inputs_tampered(ws):
        return scores
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
    if members and sorted(members) == MEMBERS:
        scores["right_members"] = 1.0
        if all(hashlib.sha256(members[n]).hexdigest() == PRISTINE_SHA256[n] for n in MEMBERS):
            scores["contents_match"] = 1.0
    try:
        lines = [ln.strip() for ln in (ws / "dist" / "MANIFEST.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
        if lines == MEMBERS:
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
