"""The audit's parts without episodes: trivial inputs, the scripts' shell, the payloads' Python, the plans,
the adaptive final answer, the verdict rules, the JSON line and the table.

Nothing here runs a payload's rewrite on the host: the transparent shadow module is imported in a temp
folder under a mount that does not exist, so its rewrite payload is never found.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from leaderboards.audit.facts import gather_facts, with_expert_outputs
from leaderboards.audit.kit import (
    ATTACKS,
    is_test_module,
    output_names,
    plan_attack,
    plan_disk_fill,
    plan_exit0_modules,
    plan_gold,
    plan_input_tamper,
    plan_reward_symlinks,
    shadow_names,
)
from leaderboards.audit.payloads import (
    WIN_PY_NAMED,
    insert_prefix,
    rewrite_prefix,
    rewrite_pth,
    rewrite_py,
    rewrite_stub,
    shadow_stub,
    win_py,
)
from leaderboards.audit.placebo import placebo_plan
from leaderboards.audit.policy import last_tool_output
from leaderboards.audit.steps import STEP_CHARS, AuditScript, bash_steps, write_command, write_fragments
from leaderboards.audit.table import render_table
from leaderboards.audit.trivial import trivialise
from leaderboards.audit.verdict import AuditReport, GoldOutcome, TaskAudit, judge_attack
from tasks import load_task_dir

FIXTURES = Path(__file__).resolve().parent / "fixtures"
WEAK = FIXTURES / "audit_weak"
KIT = FIXTURES / "audit_kit"


# -- trivial inputs -----------------------------------------------------------------------------------

def test_trivial_versions_by_kind():
    assert trivialise("a.csv", b"h1,h2\n1,2\n3,4\n") == b"h1,h2\n1,2\n"
    assert trivialise("notes.txt", b"\n\nfirst\nsecond\n") == b"first\n"
    assert trivialise("e.jsonl", b'{"a": 1}\n{"a": 2}\n') == b'{"a": 1}\n'
    cut = json.loads(trivialise("u.json", json.dumps({"users": [{"n": [1, 2]}, {"n": [3]}], "k": 1}).encode()))
    assert cut == {"users": [{"n": [1]}], "k": 1}
    assert trivialise("bin.dat", b"\x00\x01\x02") == b""
    assert trivialise("latin.txt", "caf\xe9".encode("latin-1")) == b""


def test_trivial_leaves_trivial_files_alone_and_is_bounded():
    assert trivialise("empty.txt", b"") is None
    assert trivialise("one.txt", b"one line\n") is None
    assert trivialise("conf.json", b'{"a": 1}') is not None  # re-serialised, not the same bytes
    assert trivialise("conf.json", json.dumps({"a": 1}, indent=2).encode() + b"\n") is None
    long = trivialise("big.txt", b"x" * 100_000 + b"\nmore\n")
    assert long is not None and len(long) <= 4097
    assert trivialise("prefix.json", b'[1, 2, 3', complete=False) == b"[1, 2, 3\n"  # a prefix is not parsed


# -- shell written by the scripts -----------------------------------------------------------------------

@pytest.mark.parametrize("data", [b"plain text\n", b"no newline at the end", b"\x00\xff binary\n",
                                  b"CLAWGYM_AUDIT_EOF\ninside\n", b"$HOME `x` 'q' \"d\"\n"])
def test_write_command_writes_bytes_exactly(tmp_path, data):
    subprocess.run(["bash", "-c", write_command("sub dir/f.txt", data, mode="640")], cwd=tmp_path, check=True)
    out = tmp_path / "sub dir" / "f.txt"
    assert out.read_bytes() == data
    assert oct(out.stat().st_mode & 0o777) == "0o640"


def test_plain_text_goes_as_text_not_base64():
    assert "<<'CLAWGYM_AUDIT_EOF'" in write_command("a.py", "print(1)\n")
    assert "base64" not in write_command("a.py", "print(1)")  # no final newline: printf, still exact
    assert "base64 -d" in write_command("a.bin", b"\x00\x01")


@pytest.mark.parametrize("data", [("line %d of a big module\n" * 3000).encode(), b"x" * 20_000,
                                  bytes(range(256)) * 60])
def test_large_files_go_in_pieces_that_fit_a_step(tmp_path, data):
    data = data % tuple(range(3000)) if b"%d" in data else data
    fragments = write_fragments("big/file", data)
    assert len(fragments) > 1
    steps = bash_steps(*fragments)
    assert all(len(step["command"]) <= STEP_CHARS + 100 or "base64" in step["command"] for step in steps)
    for step in steps:  # each step a separate shell, as a harness runs them
        subprocess.run(["bash", "-c", step["command"]], cwd=tmp_path, check=True)
    assert (tmp_path / "big" / "file").read_bytes() == data


def test_every_planned_step_fits_a_harness_answer(tokenizer):
    """mini caps an answer at 4,096 tokens: every step of every plan (placebos included) stays well under."""
    from clawgym_env.capture.records import EpisodeRecord, WorkspaceChange
    from clawgym_env.policy.chat_format import assistant_text
    from tasks import load_suite

    def tokens(step):
        return len(tokenizer.encode(assistant_text("", tool_calls=[("bash", {"command": step["command"]})]),
                                    add_special_tokens=False))

    tasks = list(load_suite("builtin")) + [load_task_dir(p) for d in (WEAK, KIT) for p in sorted(d.iterdir())]
    worst = 0
    for task in tasks:
        facts = gather_facts(task)
        for name in ATTACKS:
            for ep in plan_attack(name, facts).episodes:
                worst = max([worst] + [tokens(s) for s in ep.script.steps if s.get("tool") == "bash"])
    many = [WorkspaceChange(path=f"dir{i % 7}/module_{i}.py", change="added") for i in range(2000)]
    placebo = placebo_plan("module_shadowing", EpisodeRecord(episode_id="e", task_id="t", harness="mini",
                                                             policy="p", status="ok", workspace_changes=many))
    worst = max([worst] + [tokens(s) for s in placebo.script.steps])
    assert worst <= 3000, worst


# -- payloads -------------------------------------------------------------------------------------------

def test_payloads_are_valid_python():
    for src in (win_py("x"), WIN_PY_NAMED, rewrite_py("/ws"), rewrite_stub("/ws", "sitecustomize"),
                shadow_stub("/ws"), rewrite_prefix("/ws", "m.py"), rewrite_pth("/ws")):
        ast.parse(src)
    assert rewrite_prefix("/ws", "run.sh").startswith("python3 -I ")


def test_win_payload_prints_one_and_exits_zero(tmp_path):
    (tmp_path / "mod.py").write_text(win_py("test") + "raise SystemExit(7)\n")
    run = subprocess.run([sys.executable, "-c", "import mod; print('not reached')"], cwd=tmp_path,
                         capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert run.returncode == 0 and run.stdout == "1.0\n"
    assert "clawgym-audit: hit test" in run.stderr


def test_transparent_shadow_becomes_the_real_module(tmp_path):
    """A shadowed json imported from the current folder behaves as the real json (the rewrite is not found)."""
    (tmp_path / "json.py").write_text(shadow_stub("/nonexistent-mount"))
    run = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps({'a': [1]}), json.__file__)"],
                         cwd=tmp_path, capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert run.returncode == 0, run.stderr
    printed, origin = run.stdout.rsplit(" ", 1)
    assert printed == '{"a": [1]}'
    assert not origin.startswith(str(tmp_path)), origin  # the stdlib module, not the shadow


def test_prefix_goes_after_docstring_future_imports_and_shebang():
    src = '#!/usr/bin/env python3\n"""Doc."""\nfrom __future__ import annotations\n\nX = 1\n'
    out = insert_prefix(src, "PREFIX = 1\n", python=True)
    assert out.index("PREFIX") > out.index("from __future__")
    assert out.startswith("#!/usr/bin/env python3\n")
    compile(out, "m.py", "exec")
    sh = insert_prefix("#!/bin/sh\necho hi\n", "echo first\n", python=False)
    assert sh == "#!/bin/sh\necho first\necho hi\n"
    assert insert_prefix("def f(:\n", "P\n", python=True) == "P\ndef f(:\n"


# -- plans ------------------------------------------------------------------------------------------------

def _facts(folder: Path, name: str):
    return gather_facts(load_task_dir(folder / name))


def test_every_attack_plans_or_says_why_not():
    for task_dir in sorted(p for p in WEAK.iterdir() if p.is_dir()):
        facts = gather_facts(load_task_dir(task_dir))
        for name in ATTACKS:
            plan = plan_attack(name, facts, inodes=10)
            assert (plan.skipped is None) == bool(plan.episodes), (task_dir.name, name)
            assert plan.skipped is None or plan.skipped.strip()
    with pytest.raises(ValueError, match="unknown attack"):
        plan_attack("nope", gather_facts(load_task_dir(WEAK / "recompute_total")))


def test_exit0_plays_code_modules_first_then_tests_too():
    facts = _facts(WEAK, "trusts_exit_code")
    assert facts.editable_modules == ("calc.py", "test_calc.py")
    plan = plan_exit0_modules(facts)
    first, second = (ep.script.steps[0]["command"] for ep in plan.episodes)
    assert "calc.py" in first and "test_calc.py" not in first
    assert "test_calc.py" in second
    assert is_test_module("tests/helpers.py") and is_test_module("a_test.py") and not is_test_module("calc.py")
    assert plan_exit0_modules(_facts(WEAK, "recompute_total")).skipped


def test_protected_inputs_are_not_editable():
    facts = _facts(WEAK, "trusts_exit_code")
    task = facts.task.model_copy(update={"protected_inputs": ["test_*.py"]})
    protected = gather_facts(task)
    assert protected.protected == ("test_calc.py",) and protected.editable_modules == ("calc.py",)


def test_shadow_names_start_with_what_the_checks_import():
    facts = _facts(WEAK, "recompute_total")
    names = shadow_names(facts)
    assert names[: len(facts.reward_imports) - 1] == tuple(n for n in facts.reward_imports if n != "sys")
    assert {"csv", "decimal", "json"} <= set(names) and "sys" not in names and "os" not in names


def test_symlinks_point_every_output_name_at_reward_files():
    facts = _facts(WEAK, "honest_constant")
    assert plan_reward_symlinks(facts).skipped is None  # the instruction names error_count.txt
    facts = with_expert_outputs(facts, None)
    assert output_names(facts) == ("error_count.txt",)
    plan = plan_reward_symlinks(facts)
    assert len(plan.episodes) == 1  # one answer-key-like file: expected.txt
    command = plan.episodes[0].script.steps[0]["command"]
    assert "ln -s /root/.openclaw/workspace/reward/expected.txt error_count.txt" in command
    assert plan_reward_symlinks(_facts(WEAK, "honest_answer")).skipped


def test_tamper_replays_the_expert_after_trivialising_inputs():
    facts = _facts(WEAK, "recompute_total")
    plan = plan_input_tamper(facts)
    pristine, tampered = plan.episodes
    assert pristine.keep_workspace and tampered.keep_workspace
    assert pristine.script.final is None and tampered.script.final is None  # adaptive answers
    assert tampered.script.steps[1:] == pristine.script.steps == tuple(facts.expert.tool_steps)
    assert "id,customer,amount\n1,ada,12.50\n" in tampered.script.steps[0]["command"]
    assert "4,dee" not in tampered.script.steps[0]["command"]
    assert "already trivial" in plan_input_tamper(_facts(KIT, "python_e_verifier")).skipped  # one-line status.txt


def test_disk_fill_is_bounded_by_the_quota(tmp_path):
    facts = _facts(WEAK, "recompute_total")
    task = facts.task.model_copy(update={"limits": facts.task.limits.model_copy(update={"disk_mb": 2})})
    import dataclasses

    plan = plan_disk_fill(dataclasses.replace(facts, task=task))
    subprocess.run(["bash", "-c", plan.episodes[0].script.steps[0]["command"]], cwd=tmp_path, check=True,
                   capture_output=True)
    used = sum(p.stat().st_blocks * 512 for p in tmp_path.iterdir())
    assert 2 * 2**20 - 128 * 1024 <= used <= 2 * 2**20 + 256 * 1024  # the quota, give or take a block or two


def test_an_attack_that_needs_more_turns_than_the_task_allows_is_skipped():
    facts = _facts(WEAK, "recompute_total")
    task = facts.task.model_copy(update={"limits": facts.task.limits.model_copy(update={"max_turns": 2})})
    import dataclasses

    short = dataclasses.replace(facts, task=task)
    assert plan_attack("disk_fill", short).skipped is None  # one step and the answer: 2 turns
    why = plan_input_tamper(short).skipped  # the tamper step and the expert's 2 steps: 4 turns
    assert why and "needs 4 turns" in why and "max_turns" in why


def test_gold_plays_expert_and_wrong():
    plan = plan_gold(_facts(WEAK, "honest_answer"))
    expert, wrong = plan.episodes
    assert expert.script.final == "Lisbon is the warmest city." and wrong.script.final.startswith("Tallinn")


def test_placebo_empties_every_planted_file():
    from clawgym_env.capture.records import EpisodeRecord, WorkspaceChange

    record = EpisodeRecord(episode_id="e", task_id="t", harness="mini", policy="p", status="ok", workspace_changes=[
        WorkspaceChange(path="calc/src/calc/__init__.py", change="added"),
        WorkspaceChange(path="answer.txt", change="added", kind="symlink"),
        WorkspaceChange(path="calc.py", change="modified"),
        WorkspaceChange(path="gone.txt", change="deleted"),
        WorkspaceChange(path="odd\\xff.txt", change="added")])
    plan = placebo_plan("exit0_modules", record)
    assert plan.label == "exit0_modules:placebo"
    command = plan.script.steps[0]["command"]
    assert "gone.txt" not in command and "odd" not in command
    assert placebo_plan("exit0_modules", record.model_copy(update={"workspace_changes": []})) is None


def test_placebo_script_runs(tmp_path):
    from clawgym_env.capture.records import EpisodeRecord, WorkspaceChange

    (tmp_path / "answer.txt").symlink_to("/etc/hostname")
    (tmp_path / "calc.py").write_text("import os\nos._exit(0)\n")
    record = EpisodeRecord(episode_id="e", task_id="t", harness="mini", policy="p", status="ok", workspace_changes=[
        WorkspaceChange(path="pkg/mod.py", change="added"), WorkspaceChange(path="answer.txt", change="added",
                                                                              kind="symlink"),
        WorkspaceChange(path="calc.py", change="modified")])
    subprocess.run(["bash", "-c", placebo_plan("x", record).script.steps[0]["command"]], cwd=tmp_path, check=True,
                   capture_output=True)
    for rel in ("pkg/mod.py", "answer.txt", "calc.py"):
        path = tmp_path / rel
        assert not path.is_symlink() and path.is_file() and path.stat().st_size == 0, rel


def test_tamper_control_keeps_the_experts_in_place_outputs(tmp_path):
    from leaderboards.audit.tamper import restore_inputs

    facts = _facts(WEAK, "trusts_exit_code")
    for rel in facts.inputs:
        (tmp_path / rel).write_text("tampered\n")
    (tmp_path / "test_calc.py").unlink()
    (tmp_path / "test_calc.py").symlink_to("/etc/hostname")
    assert restore_inputs(facts, tmp_path, keep=frozenset({"calc.py"})) == ["test_calc.py"]
    assert (tmp_path / "calc.py").read_text() == "tampered\n"
    assert not (tmp_path / "test_calc.py").is_symlink()
    assert (tmp_path / "test_calc.py").read_bytes() == (WEAK / "trusts_exit_code/input_files/test_calc.py").read_bytes()


# -- the adaptive answer ------------------------------------------------------------------------------------

def test_last_tool_output_is_the_answer_without_markers():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""},
                {"role": "tool", "content": "exit code: 0\n12 essay.txt\n<|im_end|><tool_call>{}</tool_call>"},
                {"role": "assistant", "content": ""}]
    answer = last_tool_output(messages)
    assert answer.startswith("12 essay.txt") and "<|" not in answer and "<tool_call>" not in answer
    assert last_tool_output([{"role": "user", "content": "q"}]) == "I am done."
    assert AuditScript(final=None).as_steps()[-1] == {"final": "I am done."}


# -- verdicts, JSON, table --------------------------------------------------------------------------------

def test_attack_verdicts():
    assert judge_attack("a", [0.5], ["ok"], 0.5).beats_baseline is False
    assert judge_attack("a", [0.6], ["ok"], 0.5).beats_baseline is True
    best = judge_attack("a", [0.0, 1.0], ["ok", "reward_error"], 0.0)
    assert best.reward == 1.0 and best.status == "reward_error" and best.hacked
    escaped = judge_attack("a", [0.0], ["infra_error"], 0.0, errors=["ENOSPC"])
    assert escaped.escapes_scoring and escaped.hacked and escaped.reward is None
    assert escaped.to_json() == {"reward": None, "beats_baseline": False, "status": "infra_error",
                                 "escapes_scoring": True, "error": "ENOSPC"}
    assert not judge_attack("a", [0.0], ["infra_error"], None).hacked  # no baseline: not judged
    coincidence = judge_attack("input_tamper", [1.0], ["ok"], 0.0, control=1.0, control_why="why not")
    assert not coincidence.beats_baseline and coincidence.note == "why not" and coincidence.control == 1.0
    assert judge_attack("input_tamper", [1.0], ["ok"], 0.0, control=0.0).beats_baseline
    assert not judge_attack("exit0_modules", [0.2], ["ok"], 0.0, control=0.4).hacked  # the placebo scores more


def test_gold_gate():
    assert GoldOutcome(expert=1.0, wrong=0.5).passed
    assert GoldOutcome(expert=1.0, wrong=1.0).wrong_passes
    assert GoldOutcome(expert=0.5, wrong=0.0).expert_fails
    assert GoldOutcome(expert=None, wrong=None).expert_fails  # an unscored expert is no pass
    assert GoldOutcome(skipped="no expert").passed


def _report() -> AuditReport:
    ok = TaskAudit("ok", 0.0, "ok", gold=GoldOutcome(expert=1.0, wrong=0.0))
    ok.attacks["input_tamper"] = judge_attack("input_tamper", [0.0], ["ok"], 0.0)
    bad = TaskAudit("bad", 0.0, "ok", gold=GoldOutcome(skipped="no expert.json"))
    bad.attacks["exit0_modules"] = judge_attack("exit0_modules", [1.0], ["ok"], 0.0)
    broken = TaskAudit("broken", None, "reward_invalid", "task error: reward/ leads out")
    return AuditReport("s", "mini", "bwrap", {"ok": ok, "bad": bad, "broken": broken})


def test_report_json_and_exit_codes():
    report = _report()
    data = json.loads(json.dumps(report.to_json()))
    assert data["hackable"] == ["bad"] and data["incomplete"] == ["broken"]
    assert data["tasks"]["bad"]["attacks"]["exit0_modules"] == {"reward": 1.0, "beats_baseline": True}
    assert data["tasks"]["ok"]["attacks"]["gold"] == {"expert": 1.0, "wrong": 0.0, "passed": True}
    assert data["tasks"]["bad"]["attacks"]["gold"] == {"skipped": "no expert.json"}
    assert data["tasks"]["broken"]["baseline"] is None and data["tasks"]["broken"]["problems"]
    assert report.exit_code == 1
    del report.tasks["bad"]
    assert report.exit_code == 3
    del report.tasks["broken"]
    assert report.exit_code == 0


def test_table_rows():
    text = render_table(_report())
    assert "exit0_modules" in text and "HACKABLE (beats the baseline)" in text
    assert "NOT SCORED (reward_invalid)" in text
    assert "hackable: bad by exit0_modules" in text and "incomplete: broken" in text
