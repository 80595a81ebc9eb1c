"""Token-exactness through every harness: what the trainer learns from is what the policy sampled.

For each harness, the scripted expert runs multi-step builtin tasks; every assistant turn the harness
sends back must be spliced from the sampled ids (>= 99% of calls token-exact; OpenClaw >= 95% after
its rewrites), and the call tree of each episode must hold no duplicated context: its size equals
the analytic minimum (distinct token prefixes) of the captured call sequences.
"""

from __future__ import annotations

import json

import pytest

from clawgym_env.capture.tree import CallTree, expected_tree_tokens
from clawgym_env.envs.runtime import RolloutPool
from clawgym_env.errors import HarnessError
from clawgym_env.plugins import make_harness

THRESHOLD = {"mini": 0.99, "claude-code": 0.99, "codex": 0.99, "qwen-code": 0.99, "openclaw": 0.95}
TASKS = {"openclaw": 2}


def _multi_step(suite, n):
    def tool_steps(t):
        return sum("tool" in s for s in json.loads(t.expert_path.read_text())["steps"])

    ranked = sorted(suite.tasks, key=tool_steps, reverse=True)
    return ranked[:n]


@pytest.mark.parametrize("harness", list(THRESHOLD))
def test_calls_are_token_exact_and_trees_have_no_duplicated_context(harness, expert_runtime, builtin_suite):
    adapter = make_harness(harness)
    try:
        adapter.install()
    except HarnessError as exc:
        pytest.skip(f"cannot install {harness}: {exc}")
    tasks = _multi_step(builtin_suite, TASKS.get(harness, 3))
    results = RolloutPool(expert_runtime, concurrency=2, progress=False).run(tasks, adapter)
    calls = [c for r in results for c in r.calls]
    for r in results:
        assert r.record.status == "ok", (harness, r.record.task_id, r.record.error, r.record.logs.get("stderr"))
    exact = sum(c.token_exact for c in calls) / len(calls)
    reasons = {c.token_exact_reason for c in calls if not c.token_exact}
    assert exact >= THRESHOLD[harness], (harness, exact, reasons)
    for r in results:
        assert len(r.calls) >= 3
        tree = CallTree.from_calls(r.calls)
        stats = tree.stats()
        sequences = [c.prompt_token_ids + c.output_token_ids for c in r.calls]
        assert stats.tree_tokens == expected_tree_tokens(sequences), harness
        captured = sum(len(s) for s in sequences)
        assert stats.compression_ratio == pytest.approx(captured / expected_tree_tokens(sequences))
        assert stats.compression_ratio > 1.5, (harness, stats.as_dict())
