"""End-to-end episodes: builtin task → bubblewrap sandbox → mini harness → proxy → reward."""

from __future__ import annotations

import json

from clawgym_env.capture.records import read_calls
from clawgym_env.envs.runtime import RolloutPool, Runtime
from clawgym_env.plugins import make_harness


def _multi_step_tasks(suite, n):
    tasks = []
    for t in suite.tasks:
        steps = json.loads(t.expert_path.read_text())["steps"]
        if sum("tool" in s for s in steps) >= 2:
            tasks.append(t)
    assert len(tasks) >= n, "the builtin suite needs enough multi-step tasks"
    return tasks[:n]


def test_expert_solves_builtin_tasks_through_mini(expert_runtime, builtin_suite, tokenizer):
    tasks = _multi_step_tasks(builtin_suite, 6)
    results = RolloutPool(expert_runtime, concurrency=3, progress=False).run(tasks, make_harness("mini"))
    assert [r.record.task_id for r in results] == [t.id for t in tasks]
    for r in results:
        rec = r.record
        assert rec.status == "ok", (rec.task_id, rec.error, rec.logs)
        assert rec.reward == 1.0, (rec.task_id, rec.subscores, rec.reward_reason, rec.logs)
        assert rec.num_calls >= 3 and rec.num_calls == len(r.calls)
        on_disk = read_calls(rec.calls_path)
        assert [c.output_token_ids for c in on_disk] == [c.output_token_ids for c in r.calls]
        for call in r.calls:
            assert call.prompt_token_ids and call.output_token_ids
            assert len(call.output_logprobs) == len(call.output_token_ids)
            assert call.token_exact, call.token_exact_reason
        for prev, nxt in zip(r.calls, r.calls[1:]):  # token in, token out: each call extends the last
            assert nxt.prompt_token_ids[:len(prev.prompt_token_ids) + len(prev.output_token_ids)] == \
                prev.prompt_token_ids + prev.output_token_ids
        # the final answer the harness printed is what the policy sampled in the last call
        last = tokenizer.decode(r.calls[-1].output_token_ids, skip_special_tokens=True)
        assert rec.final_message.strip() and rec.final_message.strip() in last
    assert sum(bool(r.record.workspace_changes) for r in results) >= 3, "the expert changed workspaces"


def test_wrong_script_scores_below_one(builtin_suite, tmp_path):
    tasks = _multi_step_tasks(builtin_suite, 3)
    with Runtime("scripted:wrong", out_dir=tmp_path) as rt:
        results = RolloutPool(rt, concurrency=3, progress=False).run(tasks, make_harness("mini"))
    for r in results:
        assert r.record.status in ("ok", "reward_error"), (r.record.error, r.record.logs)
        assert r.record.reward < 1.0, r.record.task_id


def test_streaming_mini_matches_non_streaming(expert_runtime, builtin_suite):
    task = _multi_step_tasks(builtin_suite, 1)[0]
    plain = expert_runtime.run(task, make_harness("mini"))
    streamed = expert_runtime.run(task, make_harness("mini", stream=True))
    assert streamed.record.reward == plain.record.reward == 1.0
    assert all(c.stream for c in streamed.calls) and not any(c.stream for c in plain.calls)
    assert [c.output_token_ids for c in streamed.calls] == [c.output_token_ids for c in plain.calls]


def test_timeout_is_a_record_with_status(builtin_suite, tmp_path):
    task = builtin_suite.tasks[0].model_copy(deep=True)
    task.limits.timeout_s = 15  # room for mini to start and make its first call on a loaded machine
    script = tmp_path / "sleepy.json"
    script.write_text(json.dumps({"steps": [{"tool": "bash", "command": "sleep 60"}, {"final": "done"}]}))
    with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "eps") as rt:
        res = rt.run(task, make_harness("mini"))
    assert (res.record.status, res.record.failure_boundary) == ("timeout", "harness"), res.record.error
    assert res.record.num_calls == 1 and res.record.is_task_outcome  # the agent's own slowness: scored
    assert res.record.reward < 1.0


class BrokenSandbox:
    """A backend whose start fails, as a real one does when its engine is missing."""

    def __init__(self, spec):
        self.spec = spec

    def __enter__(self):
        from clawgym_env.errors import SandboxError

        raise SandboxError("cannot start (test)")

    def __exit__(self, *exc):
        return None


def test_sandbox_failure_is_infra_error_not_zero(builtin_suite, tmp_path, monkeypatch):
    from clawgym_env.plugins import sandboxes

    with sandboxes.registered("broken", BrokenSandbox), \
            Runtime("scripted:expert", sandbox="broken", out_dir=tmp_path) as rt:
        res = rt.run(builtin_suite.tasks[0], make_harness("mini"))
    assert res.record.status == "infra_error" and res.record.is_infra_failure
    assert res.record.failure_boundary == "sandbox" and "cannot start" in res.record.error
    assert res.record.num_calls == 0
