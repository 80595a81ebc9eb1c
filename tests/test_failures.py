"""The failure classifier's rule for context overflows: whose failure is a prompt that no longer fits."""

from __future__ import annotations

from clawgym_env.failures import classify_run
from clawgym_env.proxy.sessions import CallFailure


def _overflow(at: float) -> CallFailure:
    return CallFailure(status=400, code="context_length_exceeded", message="prompt too long", boundary="policy",
                       at=at)


def test_overflow_after_the_agent_grew_its_history_is_its_outcome():
    v = classify_run(returncode=1, timed_out=False, final_message=None, num_calls=7, last_call_end=10.0,
                     call_failures=[_overflow(11.0)])
    assert v.status == "harness_error" and v.boundary == "harness"


def test_overflow_before_any_answer_is_infrastructure():
    v = classify_run(returncode=1, timed_out=False, final_message=None, num_calls=0,
                     call_failures=[_overflow(1.0)])
    assert v.status == "infra_error" and v.boundary == "policy"


def test_a_backend_failure_stays_infrastructure_mid_episode():
    crash = CallFailure(status=502, code="policy_error", message="backend died", boundary="policy", at=11.0)
    v = classify_run(returncode=1, timed_out=False, final_message=None, num_calls=7, last_call_end=10.0,
                     call_failures=[crash])
    assert v.status == "infra_error" and v.boundary == "policy"
