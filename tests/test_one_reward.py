"""One reward: a JobBench task and a hybrid ClawGym-Bench task get the same reward in ``env.step``,
in a training step's rollouts (:func:`trainers.rollouts.sync.run_jobs`) and in ``clawgym eval`` — all
graded inside the episode by the task's grader, with the judge served by a real local
OpenAI-compatible HTTP server. A judge that fails gives ``reward_invalid``, never a 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawgym_env.envs.env import ClawGymEnv
from clawgym_env.envs.runtime import Runtime
from clawgym_env.testing import JudgeServer
from leaderboards.run import run_eval
from leaderboards.schema import read_results
from tasks import load_suite
from tasks.judge import JudgeClient
from trainers.rollouts.sync import run_jobs

FIXTURES = Path(__file__).resolve().parent.parent / "tasks" / "fixtures"
RUBRIC_SCORE = 0.5


def _judge_reply(body: dict) -> tuple[int, str]:
    """Hybrid rubric requests get score 0.5; JobBench rubric requests pass every criterion."""
    system = body["messages"][0]["content"]
    if "grader of work done by an AI agent" in system:
        return 200, json.dumps({"score": RUBRIC_SCORE, "rationale": "half of it"})
    user = body["messages"][-1]["content"]
    n = user.count("Criterion ")
    return 200, json.dumps({"criteria": [{"index": i, "pass": True, "reason": "ok"} for i in range(n)],
                            "rubric_pass": True})


@pytest.fixture(scope="module")
def judge():
    with JudgeServer(_judge_reply) as srv:
        yield JudgeClient(srv.base_url, "judge-test", max_retries=0)


@pytest.fixture(scope="module")
def agent(tmp_path_factory) -> str:
    """One scripted agent for both tasks: a JobBench deliverable and a partly right ClawGym-Bench answer."""
    path = tmp_path_factory.mktemp("agent") / "agent.json"
    path.write_text(json.dumps({"steps": [
        {"tool": "write_file", "path": "outputs/report.md", "content": "# Report\nTotals reconciled.\n"},
        {"tool": "write_file", "path": "output/totals.json",
         "content": json.dumps({"north": 150.5, "south": 100.0, "east": 200.1})},
        {"tool": "write_file", "path": "output/summary.md", "content": "North did fine."},
        {"final": "Done: outputs/report.md, output/totals.json and output/summary.md."}]}))
    return f"scripted:file:{path}"


CASES = [("jobbench", FIXTURES / "jobbench", "accountants__task1"),
         ("hybrid", FIXTURES / "clawgym_bench", "task_h1")]


@pytest.mark.parametrize("kind, suite, task_id", CASES, ids=[c[0] for c in CASES])
def test_env_training_and_eval_read_one_reward(kind, suite, task_id, judge, agent, tmp_path):
    task = load_suite(suite).get(task_id)
    env = ClawGymEnv("mini", agent, suite=str(suite), task_ids=[task_id], out_dir=tmp_path / "env", judge=judge)
    try:
        env.reset(options={"task_id": task_id})
        _, env_reward, *_, info = env.step(None)
    finally:
        env.close()
    assert info["status"] == "ok", info["episode"]["error"]

    with Runtime(agent, out_dir=tmp_path / "train", judge=judge) as rt:
        group = run_jobs(rt, [(task, "mini")], group_size=2, concurrency=2)
    train_rewards = [r.record.reward for r in group]
    assert [r.record.status for r in group] == ["ok", "ok"], [r.record.error for r in group]

    out = tmp_path / "eval.jsonl"
    run_eval(suite, harness="mini", policy=agent, out=out, judge=judge, progress=False, retries=0,
             limit=None)
    rows = {r.task_id: r for r in read_results(out).rows}
    row = rows[task_id]
    assert row.status == "ok", row.error

    assert env_reward == train_rewards[0] == train_rewards[1] == row.reward
    assert info["subscores"] == row.subscores == dict(group[0].record.subscores)
    if kind == "hybrid":
        code = row.subscores["code_score"]
        assert 0.0 < code < 1.0 and row.subscores["rubric_score"] == RUBRIC_SCORE
        assert row.reward == pytest.approx(0.7 * code + 0.3 * RUBRIC_SCORE)
        assert row.scorer == "tasks.hybrid.hybrid_grade"
    else:
        assert row.reward == 1.0 and row.subscores["earned"] == row.subscores["possible"] > 0
        assert row.scorer == "tasks.jobbench.score_jobbench"


@pytest.mark.parametrize("kind, suite, task_id", CASES, ids=[c[0] for c in CASES])
def test_a_failed_judge_is_no_valid_reward_in_the_episode(kind, suite, task_id, agent, tmp_path):
    task = load_suite(suite).get(task_id)
    with JudgeServer(lambda body: (200, "I would rather not say.")) as bad:
        judges = {"unreachable": JudgeClient("http://127.0.0.1:9/v1", "judge-test", max_retries=0, timeout=5),
                  "nonsense": JudgeClient(bad.base_url, "judge-test", max_retries=0)}
        with Runtime(agent, out_dir=tmp_path / "eps") as rt:
            for name, judge in judges.items():
                rec = rt.run(task, _mini(), judge=judge).record
                assert rec.status == "reward_invalid", (name, rec.status, rec.reward, rec.error)
                assert rec.reward == 0.0 and "no valid reward" in rec.error, (name, rec.error)


def test_judge_defaults_to_the_environment_configured_one(agent, tmp_path, monkeypatch):
    task = load_suite(FIXTURES / "clawgym_bench").get("task_h1")
    monkeypatch.delenv("CLAWGYM_JUDGE_BASE_URL", raising=False)
    monkeypatch.delenv("CLAWGYM_JUDGE_MODEL", raising=False)
    with Runtime(agent, out_dir=tmp_path / "eps") as rt:
        rec = rt.run(task, _mini()).record
        assert rec.status == "reward_invalid" and "CLAWGYM_JUDGE_BASE_URL" in rec.error, rec.error
        with JudgeServer(_judge_reply) as srv:
            monkeypatch.setenv("CLAWGYM_JUDGE_BASE_URL", srv.base_url)
            monkeypatch.setenv("CLAWGYM_JUDGE_MODEL", "judge-env")
            rec = rt.run(task, _mini()).record
            assert rec.status == "ok" and rec.subscores["rubric_score"] == RUBRIC_SCORE, rec.error
            assert srv.requests[-1]["model"] == "judge-env"


def _mini():
    from clawgym_env.plugins import make_harness

    return make_harness("mini")


def test_a_suite_that_needs_a_judge_fails_fast_without_one(monkeypatch):
    """Training on judged tasks without a judge configuration fails before the first rollout, naming
    the variables, instead of turning every episode into reward_invalid."""
    from clawgym_env.errors import ClawGymError
    from tasks import load_suite
    from trainers.rollouts.sync import judge_for

    for var in ("CLAWGYM_JUDGE_BASE_URL", "CLAWGYM_JUDGE_MODEL", "CLAWGYM_JUDGE_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert judge_for(list(load_suite("builtin").tasks)) is None
    judged = [t for t in _judged_tasks()]
    assert judged, "the bundled fixtures hold a judged (hybrid) task"
    with pytest.raises(ClawGymError, match="CLAWGYM_JUDGE"):
        judge_for(judged)


def _judged_tasks():
    from pathlib import Path

    from clawgym_env.grading.grade import needs_judge
    from tasks import load_suite

    root = Path(__file__).resolve().parents[1] / "tasks" / "fixtures" / "clawgym_bench"
    return [t for t in load_suite(str(root)).tasks if needs_judge(t)]
