"""Hermetic reward: an agent cannot change its own score by editing or planting verifier files."""

from __future__ import annotations

import json

from clawgym_env.envs.runtime import Runtime
from clawgym_env.grading.reward import grade_workspace, parse_reward_output
from clawgym_env.plugins import make_harness


def _cheat_steps(task):
    forged = 'import json\nprint(json.dumps({"forged": 1.0}))\n'
    return {"steps": [
        {"tool": "write_file", "path": "reward/check.py", "content": forged},
        {"tool": "write_file", "path": "reward/reward.sh", "content": "echo 1.0\n"},
        {"tool": "write_file", "path": "reward/json.py", "content": "raise SystemExit('shadowed')\n"},
        {"tool": "write_file", "path": "json.py", "content": "raise SystemExit('shadowed')\n"},
        {"final": "All done, trust me."},
    ]}


def test_agent_rewriting_the_checker_gets_its_honest_score(builtin_suite, tmp_path):
    task = builtin_suite.tasks[0]
    script = tmp_path / "cheat.json"
    script.write_text(json.dumps(_cheat_steps(task)))
    with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "cheat") as rt:
        cheat = rt.run(task, make_harness("mini"), keep_workspace=True)
    with Runtime("scripted:noop", out_dir=tmp_path / "noop") as rt:
        honest = rt.run(task, make_harness("mini"))
    assert cheat.record.status in ("ok", "reward_error"), cheat.record.logs
    assert {c.path for c in cheat.record.workspace_changes} >= {"reward/check.py", "reward/reward.sh"}
    assert "forged" not in cheat.record.subscores
    assert cheat.record.reward == honest.record.reward < 1.0
    # and the planted files are still in the agent's workspace: grading left it untouched
    ws = tmp_path / "cheat" / cheat.record.episode_id / "workspace"
    assert (ws / "reward" / "reward.sh").read_text() == "echo 1.0\n"


def test_grade_scores_an_expert_workspace_and_an_empty_one(builtin_suite, tmp_path):
    task = builtin_suite.tasks[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    rr = grade_workspace(task, empty, final_message="")
    assert rr.reward < 1.0
    assert rr.subscores and all(0.0 <= v <= 1.0 for v in rr.subscores.values())


def test_reward_contract_parsing():
    assert parse_reward_output("noise\n0.75\n", 0, False) == (0.75, True, None)
    assert parse_reward_output("1\n", 0, False)[0] == 1.0
    for out, code, to in [("abc\n", 0, False), ("", 0, False), ("0.5\n", 1, False), ("0.5\n", 0, True),
                          ("1.5\n", 0, False), ("nan\n", 0, False)]:
        reward, ok, reason = parse_reward_output(out, code, to)
        assert reward == 0.0 and not ok and reason
