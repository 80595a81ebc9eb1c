"""``name_file``: a one-tool-step task family that a tiny policy can learn on a CPU in minutes.

Each task says: create a file named ``"<name>.txt"`` whose only content is the word ``"<word>"``,
with ``name`` from :data:`NAMES` and ``word`` from :data:`WORDS` (single tokens of the Qwen3
tokenizer, so the arguments of the tool call are literally present in the instruction). The
scripted expert writes the file in one ``write_file`` step and answers ``Done.``. The verifier
scores two halves: the file exists (0.5) and its content, stripped of surrounding whitespace, is
exactly the word (0.5); a pass is reward 1.0.

Splits (invariants): ``train`` and ``heldout`` partition the ``len(NAMES) * len(WORDS)`` pairs;
``heldout`` holds the pairs ``(i, (i + k) % n)`` for ``k`` in :data:`HELDOUT_OFFSETS`, so every
name and every word occurs in both splits but no held-out *combination* is ever trained on.
Generation is deterministic: same arguments, byte-identical files.

Regenerate the committed suites with ``python -m tasks.families.name_file``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

NAMES = ("cat", "dog", "fox", "owl", "bee", "cow", "pig", "hen")
WORDS = ("red", "blue", "green", "gold", "pink", "gray", "lime", "mint")
HELDOUT_OFFSETS = (3, 6)
MOUNT_DIR = "/root/.openclaw/workspace"
HERE = Path(__file__).resolve().parent
SPLIT_DIRS = {"train": HERE / "name_file_train", "heldout": HERE / "name_file_heldout"}

INSTRUCTION = 'Create a file named "{name}.txt" containing exactly "{word}".'
LIMITS = {"timeout_s": 120, "max_turns": 3, "reward_timeout_s": 30}

CHECK_PY = '''import json
import sys
from pathlib import Path

NAME = {name!r}
WORD = {word!r}


def grade(workspace):
    path = Path(workspace) / (NAME + ".txt")
    scores = {{"file_exists": 0.0, "content_exact": 0.0}}
    if path.is_file():
        scores["file_exists"] = 1.0
        try:
            text = path.read_text(encoding="utf-8")
        except Exception:
            text = None
        if text is not None and text.strip() == WORD:
            scores["content_exact"] = 1.0
    return scores


if __name__ == "__main__":
    print(json.dumps(grade(sys.argv[1] if len(sys.argv) > 1 else ".")))
'''

REWARD_SH = '''#!/usr/bin/env bash
set -euo pipefail
python3 {mount}/reward/check.py {mount} | python3 -c 'import json, sys; d = json.loads(sys.stdin.read()); print(sum(d.values()) / len(d))'
'''


def split_of(i: int, j: int) -> str:
    """``"heldout"`` or ``"train"`` for the pair (NAMES[i], WORDS[j])."""
    return "heldout" if (j - i) % len(WORDS) in HELDOUT_OFFSETS else "train"


def pairs(split: str) -> list[tuple[str, str]]:
    """The (name, word) pairs of a split, in a fixed order."""
    return [(n, w) for i, n in enumerate(NAMES) for j, w in enumerate(WORDS) if split_of(i, j) == split]


def task_id(name: str, word: str) -> str:
    return f"name_file-{name}-{word}"


def write_task(root: Path, name: str, word: str) -> Path:
    """Write one task dir under ``root``; returns it."""
    d = root / task_id(name, word)
    (d / "reward").mkdir(parents=True, exist_ok=True)
    entry = {"task_id": task_id(name, word), "user_query": INSTRUCTION.format(name=name, word=word),
             "input_mount_dir": MOUNT_DIR,
             "metadata": {"category": "files", "grading_type": "automated", "family": "name_file",
                          "name": name, "word": word},
             "limits": LIMITS}
    expert = {"steps": [{"tool": "write_file", "path": f"{name}.txt", "content": word}, {"final": "Done."}],
              "wrong": [{"tool": "write_file", "path": f"{name}.txt", "content": word.upper()}, {"final": "Done."}]}
    (d / "data_entry.json").write_text(json.dumps(entry, indent=2) + "\n")
    (d / "expert.json").write_text(json.dumps(expert, indent=2) + "\n")
    (d / "reward" / "check.py").write_text(CHECK_PY.format(name=name, word=word))
    (d / "reward" / "reward.sh").write_text(REWARD_SH.format(mount=MOUNT_DIR))
    return d


def generate(out: dict[str, Path] | None = None) -> dict[str, Path]:
    """(Re)write both splits (default: the committed folders next to this module); returns them."""
    out = out or SPLIT_DIRS
    for split, root in out.items():
        root = Path(root)
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        for name, word in pairs(split):
            write_task(root, name, word)
    return out


if __name__ == "__main__":
    for split, path in generate().items():
        print(f"{split}: {len(pairs(split))} tasks in {path}")
