"""``count_errors``: a one-tool-step task family that a tiny random-init policy can learn on a CPU in minutes.

Each task's workspace holds ``app.log``, a generated log of 20-50 lines; the instruction asks for the
number of lines containing ``ERROR`` written into ``errors.txt``. The scripted expert solves every
task with one shell command, ``grep -c ERROR app.log > errors.txt``, then answers ``Done.``; its
``wrong`` variant counts case-insensitively (``grep -ci``), which the logs' lower-case distractor
lines ("0 errors", "error budget") make wrong. The verifier scores two halves: ``errors.txt`` exists
(0.5) and holds exactly the count (0.5); a pass is reward 1.0. The count and ``app.log``'s sha256 are constants in
each task's check (the generator knows them): the check never recounts from the workspace's ``app.log``, and a
rewritten ``app.log`` scores 0 on both halves.

What is learned, and what the splits test: the answer differs from task to task, so a policy that
memorised answers fails; the train and held-out splits are disjoint sets of generated logs
(different seeds), so a held-out pass means the policy learned the *procedure*. The instruction is
the same for every task: the policy does not need to read it to act. That is deliberate. A tiny
random-init Qwen3 (2 layers, hidden 64) trained by SFT on the harness's real prompts — ~370 fixed
tokens of mini's system prompt and tool schemas before a short instruction — did not learn to copy
an argument out of the instruction within 400 SFT steps in our measurements (the arguments are one
token in ~400, and attention starts uniform), whereas a fixed procedure is learned in well under a
hundred. Instruction-conditioned families need a pretrained model, not a CPU demo.

Generation is deterministic (seeded): same arguments, byte-identical files. Regenerate the
committed suites with ``python -m tasks.families.count_errors``.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

MOUNT_DIR = "/root/.openclaw/workspace"
HERE = Path(__file__).resolve().parent
SPLITS = {"train": (HERE / "count_errors_train", 48, 0), "heldout": (HERE / "count_errors_heldout", 16, 10_000)}
INSTRUCTION = ("Count the lines of app.log that contain the word ERROR (in capitals) and write that number, "
               "digits only, into errors.txt.")
LIMITS = {"timeout_s": 120, "max_turns": 3, "reward_timeout_s": 30}
COMMAND = "grep -c ERROR app.log > errors.txt"
WRONG_COMMAND = "grep -ci error app.log > errors.txt"

ERRORS = ("disk quota exceeded", "connection refused by db-1", "payment gateway timeout", "null user id in session",
          "failed to parse config line 12", "worker 3 crashed")
OTHERS = ("INFO request served in {n} ms", "INFO 0 errors in batch {n}", "DEBUG cache hit ratio 0.{n}",
          "WARN retrying upload, attempt {n}", "INFO error budget at {n} percent", "INFO user {n} logged in",
          "WARN slow query took {n} ms", "DEBUG scheduled job {n} queued")

CHECK_PY = '''"""count_errors: errors.txt holds the number of app.log lines containing ERROR.

The expected count is a constant written by the generator; the workspace is read only for errors.txt and to
compare app.log with its pristine sha256 (an app.log rewritten in place scores 0 on both halves).
"""

import hashlib
import json
import os
import sys
from pathlib import Path

EXPECTED = {count}
PRISTINE_SHA256 = {{"app.log": "{digest}"}}
MAX_INPUT_BYTES = 1 << 20


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


def grade(workspace):
    path = Path(workspace) / "errors.txt"
    scores = {{"file_exists": 0.0, "count_exact": 0.0}}
    if any(_altered(Path(workspace) / rel, digest) for rel, digest in PRISTINE_SHA256.items()):
        return scores
    if path.is_file():
        scores["file_exists"] = 1.0
        try:
            text = path.read_text(encoding="utf-8").strip()
        except Exception:
            text = None
        if text == str(EXPECTED):
            scores["count_exact"] = 1.0
    return scores


if __name__ == "__main__":
    print(json.dumps(grade(sys.argv[1] if len(sys.argv) > 1 else ".")))
'''

REWARD_SH = '''#!/usr/bin/env bash
set -euo pipefail
python3 {mount}/reward/check.py {mount} | python3 -c 'import json, sys; d = json.loads(sys.stdin.read()); print(sum(d.values()) / len(d))'
'''


def make_log(seed: int) -> tuple[str, int, int]:
    """(log text, lines containing ERROR, lines containing 'error' in any case) for a seed."""
    rng = random.Random(seed)
    n = rng.randint(20, 50)
    errors = set(rng.sample(range(n), rng.randint(1, 12)))
    lines = []
    for i in range(n):
        stamp = f"2026-05-{1 + seed % 28:02d} {i // 60 % 24:02d}:{i % 60:02d}:{rng.randint(0, 59):02d}"
        if i in errors:
            lines.append(f"{stamp} ERROR {rng.choice(ERRORS)}")
        else:
            lines.append(f"{stamp} {rng.choice(OTHERS).format(n=rng.randint(1, 99))}")
    text = "\n".join(lines) + "\n"
    return text, len(errors), sum("error" in line.lower() for line in lines)


def task_id(split: str, i: int) -> str:
    return f"count_errors-{split}-{i:03d}"


def write_task(root: Path, split: str, i: int, seed: int) -> Path:
    """Write one task dir under ``root``; returns it."""
    log, count, loose = make_log(seed)
    d = root / task_id(split, i)
    (d / "reward").mkdir(parents=True, exist_ok=True)
    (d / "input_files").mkdir(exist_ok=True)
    (d / "input_files" / "app.log").write_text(log)
    entry = {"task_id": task_id(split, i), "user_query": INSTRUCTION, "input_mount_dir": MOUNT_DIR,
             "metadata": {"category": "logs", "grading_type": "automated", "family": "count_errors", "split": split,
                          "seed": seed, "expected": count, "case_insensitive_count": loose},
             "limits": LIMITS}
    expert = {"steps": [{"tool": "bash", "command": COMMAND}, {"final": "Done."}],
              "wrong": [{"tool": "bash", "command": WRONG_COMMAND}, {"final": "Done."}]}
    (d / "data_entry.json").write_text(json.dumps(entry, indent=2) + "\n")
    (d / "expert.json").write_text(json.dumps(expert, indent=2) + "\n")
    digest = hashlib.sha256((d / "input_files" / "app.log").read_bytes()).hexdigest()
    (d / "reward" / "check.py").write_text(CHECK_PY.format(count=count, digest=digest))
    (d / "reward" / "reward.sh").write_text(REWARD_SH.format(mount=MOUNT_DIR))
    return d


def generate(out: dict[str, Path] | None = None) -> dict[str, Path]:
    """(Re)write both splits (default: the committed folders next to this module); returns them."""
    roots = {}
    for split, (default_root, n, seed0) in SPLITS.items():
        root = Path((out or {}).get(split, default_root))
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        for i in range(n):
            write_task(root, split, i, seed0 + i)
        roots[split] = root
    return roots


if __name__ == "__main__":
    for split, path in generate().items():
        print(f"{split}: {SPLITS[split][1]} tasks in {path}")
