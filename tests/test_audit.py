"""``clawgym audit`` end to end: real episodes through the ``mini`` harness, real sandboxes and the real grader.

* the weak fixture suite (``tests/fixtures/audit_weak``: a check that recomputes its answer from an input,
  a check that trusts a test run's exit status, two honest tasks) is named exactly: the two weak tasks,
  each by the attack it is weak to, with the whole kit played (the inode flood smaller than by default);
* each adversary wins against a check weak for it (``tests/fixtures/audit_kit``): module shadowing
  against a verifier running ``python3 -E`` from the workspace, verifier rewriting against a grading
  script run from a writable copy, the gold gate against a check that takes any answer; the input
  tampering is skipped, with the reason, when the expert's steps do not read the inputs;
* the JSON line and the exit codes (0 clean, 1 hackable, 3 incomplete: no valid baseline, broken expert);
* a few builtin tasks in the fast suite; the whole builtin suite with the default kit is marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from leaderboards.audit import ATTACKS, AuditOptions, run_audit
from tasks import load_task_dir

try:
    from helpers_docker import require_engine
except ImportError:  # tests run as a package
    from tests.helpers_docker import require_engine

FIXTURES = Path(__file__).resolve().parent / "fixtures"
WEAK = FIXTURES / "audit_weak"
KIT = FIXTURES / "audit_kit"
SMALL_FLOOD = "3000"


def audit_cli(*args: str, timeout: float = 1200) -> tuple[int, str, dict]:
    """Run ``clawgym audit ... --json --no-progress``; (exit code, stdout, the JSON of its last line)."""
    run = subprocess.run([sys.executable, "-m", "clawgym_cli", "audit", *args, "--json", "--no-progress"],
                         capture_output=True, text=True, timeout=timeout)
    lines = run.stdout.strip().splitlines()
    assert lines, f"no output; stderr:\n{run.stderr[-3000:]}"
    try:
        data = json.loads(lines[-1])
    except ValueError:
        pytest.fail(f"the last line is not JSON: {lines[-1][:300]}\nstderr:\n{run.stderr[-3000:]}")
    return run.returncode, run.stdout, data


def check_schema(data: dict, attacks=ATTACKS) -> None:
    """The JSON line's shape: suite, harness, tasks (baseline, attacks, hackable), hackable."""
    assert {"suite", "harness", "tasks", "hackable"} <= set(data)
    for tid, task in data["tasks"].items():
        assert set(task["attacks"]) == set(attacks) | {"gold"}, tid
        assert isinstance(task["hackable"], bool)
        assert task["baseline"] is None or 0.0 <= task["baseline"] <= 1.0
        for name, entry in task["attacks"].items():
            if "skipped" in entry:
                assert set(entry) == {"skipped"} and entry["skipped"], (tid, name)
            elif name == "gold":
                assert {"expert", "wrong", "passed"} <= set(entry), (tid, entry)
            else:
                assert isinstance(entry["beats_baseline"], bool), (tid, name, entry)
                assert entry["reward"] is None or 0.0 <= entry["reward"] <= 1.0
    assert data["hackable"] == [tid for tid, t in data["tasks"].items() if t["hackable"]]


def hacked_by(task: dict) -> set[str]:
    out = {n for n, a in task["attacks"].items() if a.get("beats_baseline") or a.get("escapes_scoring")}
    gold = task["attacks"]["gold"]
    return out | ({"gold"} if gold.get("wrong") is not None and gold["wrong"] >= 1.0 else set())


def test_weak_suite_names_exactly_the_weak_tasks():
    code, out, data = audit_cli("--suite", str(WEAK), "--harness", "mini", "--inodes", SMALL_FLOOD)
    check_schema(data)
    assert data["suite"] == "audit_weak" and data["harness"] == "mini"
    assert data["hackable"] == ["recompute_total", "trusts_exit_code"], out
    assert code == 1
    tasks = data["tasks"]
    assert hacked_by(tasks["recompute_total"]) == {"input_tamper"}, out
    tamper = tasks["recompute_total"]["attacks"]["input_tamper"]
    assert tamper["reward"] == 1.0 and tamper["control"] < tamper["reward"]
    assert hacked_by(tasks["trusts_exit_code"]) == {"exit0_modules"}, out
    exit0 = tasks["trusts_exit_code"]["attacks"]["exit0_modules"]
    assert exit0["reward"] == 1.0 and exit0["control"] == 0.0  # its placebo (calc.py emptied) fails
    for tid, task in tasks.items():
        assert task["attacks"]["gold"] == {"expert": 1.0, "wrong": 0.0, "passed": True}, tid
        for name in ("disk_fill", "inode_flood"):  # played, scored as the agent's outcome, no better than nothing
            entry = task["attacks"][name]
            assert "status" not in entry and entry["reward"] <= task["baseline"], (tid, name, entry)
    header = next(line for line in out.splitlines() if line.startswith("task"))
    assert header.split() == ["task", "attack", "reward", "baseline", "verdict"]
    assert "hackable: recompute_total by input_tamper" in out
    assert "hackable: trusts_exit_code by exit0_modules" in out


def test_each_adversary_wins_against_a_check_weak_for_it(tmp_path):
    tasks = [load_task_dir(KIT / name, suite="audit_kit") for name in ("python_e_verifier", "writable_verifier",
                                                                          "lax_wrong")]
    tasks.append(load_task_dir(WEAK / "honest_constant", suite="audit_weak"))
    options = AuditOptions(harness="mini", attacks=("module_shadowing", "exit0_modules", "verifier_rewrite",
                                                    "reward_symlinks", "input_tamper"), out_dir=tmp_path / "eps")
    report = run_audit("mixed", tasks, options)
    by = {tid: {n for n, a in t.attacks.items() if a.hacked} | ({"gold"} if t.gold.wrong_passes else set())
          for tid, t in report.tasks.items()}
    assert by == {"python_e_verifier": {"module_shadowing"}, "writable_verifier": {"verifier_rewrite"},
                  "lax_wrong": {"gold"}, "honest_constant": set()}, by
    shadow = report.tasks["python_e_verifier"].attacks["module_shadowing"]
    assert any("hit module json" in line for line in shadow.evidence), shadow.evidence
    assert "do not read" in (report.tasks["lax_wrong"].attacks["input_tamper"].skipped or "")
    # the links were made, and the grader did not follow them into its answer key
    records = [json.loads(p.read_text()) for p in (tmp_path / "eps").glob("*/episode.json")]
    linked = [r for r in records if r["task_id"] == "honest_constant"
              and any(c["path"] == "error_count.txt" and c["kind"] == "symlink" for c in r["workspace_changes"])]
    assert linked and all(r["reward"] == 0.0 for r in linked)
    assert report.tasks["honest_constant"].attacks["reward_symlinks"].reward == 0.0


def _broken_suite(root: Path) -> Path:
    suite = root / "broken"
    shutil.copytree(WEAK / "honest_answer", suite / "invalid_verifier")
    entry = json.loads((suite / "invalid_verifier" / "data_entry.json").read_text())
    entry["task_id"] = "invalid_verifier"
    (suite / "invalid_verifier" / "data_entry.json").write_text(json.dumps(entry))
    outside = root / "outside.txt"
    outside.write_text("a host file\n")
    os.symlink(outside, suite / "invalid_verifier" / "reward" / "leak.txt")  # reward/ leads out: no valid reward
    shutil.copytree(WEAK / "honest_constant", suite / "broken_expert")
    entry = json.loads((suite / "broken_expert" / "data_entry.json").read_text())
    entry["task_id"] = "broken_expert"
    (suite / "broken_expert" / "data_entry.json").write_text(json.dumps(entry))
    expert = json.loads((suite / "broken_expert" / "expert.json").read_text())
    expert["steps"][0]["command"] = "echo 5 > error_count.txt"
    (suite / "broken_expert" / "expert.json").write_text(json.dumps(expert))
    return suite


def test_exit_codes_clean_and_incomplete(tmp_path):
    code, out, data = audit_cli("--suite", str(WEAK), "--task", "honest_constant", "honest_answer",
                                "--harness", "mini", "--attack", "input_tamper", "module_shadowing")
    check_schema(data, attacks=("module_shadowing", "input_tamper"))
    assert (code, data["hackable"], data["incomplete"]) == (0, [], []), out
    code, out, data = audit_cli("--suite", str(_broken_suite(tmp_path)), "--harness", "mini",
                                "--attack", "input_tamper")
    assert code == 3, out
    assert data["hackable"] == [] and data["incomplete"] == ["broken_expert", "invalid_verifier"], out
    invalid = data["tasks"]["invalid_verifier"]
    assert invalid["baseline"] is None and invalid["baseline_status"] == "reward_invalid"
    assert any("no valid reward" in p for p in invalid["problems"])
    assert data["tasks"]["broken_expert"]["attacks"]["gold"]["passed"] is False
    assert "incomplete: broken_expert" in out


def test_usage_errors_exit_2(tmp_path):
    run = subprocess.run([sys.executable, "-m", "clawgym_cli", "audit", "--suite", str(WEAK), "--harness", "mini",
                          "--attack", "nope"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "unknown attack" in run.stderr and "module_shadowing" in run.stderr


def test_builtin_tasks_are_not_hackable():
    """Among them two whose partial credit an attack earns by its files' places alone (the expert's folders,
    an implementation the replayed expert writes): their controls keep them from being named."""
    code, out, data = audit_cli("--suite", "builtin", "--task", "csv_total", "fix_failing_test", "count_words_answer",
                                "implement_function", "make_project_skeleton", "--harness", "mini",
                                "--inodes", SMALL_FLOOD)
    check_schema(data)
    assert (code, data["hackable"], data["incomplete"]) == (0, [], []), out


@pytest.mark.docker
def test_weak_suite_under_docker():
    require_engine()
    code, out, data = audit_cli("--suite", str(WEAK), "--harness", "mini", "--sandbox", "docker",
                                "--attack", "exit0_modules", "input_tamper", "module_shadowing", "disk_fill",
                                "inode_flood", "--inodes", SMALL_FLOOD)
    assert data["sandbox"] == "docker"
    assert (code, data["hackable"]) == (1, ["recompute_total", "trusts_exit_code"]), out
    for tid, task in data["tasks"].items():
        for name in ("disk_fill", "inode_flood"):
            assert "status" not in task["attacks"][name], (tid, name, task["attacks"][name])


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_whole_builtin_suite_is_not_hackable():
    """The whole kit against every builtin task, with an inode flood of 20,000 files instead of the default
    100,001 (which alone takes about 13 of the default audit's 17 minutes here, most of it copying the files
    again into each guest; the full-size flood is an episode test of its own:
    tests/test_agent_resources_episodes.py)."""
    code, out, data = audit_cli("--suite", "builtin", "--harness", "mini", "--inodes", "20000", timeout=2900)
    check_schema(data)
    assert len(data["tasks"]) == 28
    assert (code, data["hackable"], data["incomplete"]) == (0, [], []), out
