"""JudgeClient against a real local OpenAI-compatible HTTP server (no mocked client)."""

from __future__ import annotations

import json

import pytest

from clawgym_env.errors import TaskError
from clawgym_env.testing import JudgeServer, free_port
from tasks.judge import ENV_API_KEY, ENV_BASE_URL, ENV_MODEL, JudgeAnswerError, JudgeClient, parse_json_object


@pytest.fixture(scope="module")
def shared():
    with JudgeServer(lambda body: (500, "no handler set")) as srv:
        yield srv


@pytest.fixture
def serve(shared):
    """serve(handler) -> the shared running server, answering with ``handler`` from now on."""
    def use(handler):
        shared.handler = handler
        shared.requests.clear()
        return shared
    return use


VERDICT = {"criteria": [{"index": 0, "pass": True, "reason": "found {braces} in text"}], "rubric_pass": True}


def _answers(text: str):
    return lambda body: (200, text)


@pytest.mark.parametrize("text", [
    json.dumps(VERDICT),
    "```json\n" + json.dumps(VERDICT, indent=2) + "\n```",
    "Here is my verdict:\n" + json.dumps(VERDICT) + "\nLet me know if you need more.",
    "<think>the shape is {criteria: ...} — not JSON</think>\n" + json.dumps(VERDICT),
    json.dumps(VERDICT)[:-1] + ",}",  # a trailing comma
])
def test_judge_json_parses_leniently_over_http(text, serve):
    srv = serve(_answers(text))
    judge = JudgeClient(srv.base_url, "judge-x", backoff_s=0.01)
    assert judge.judge_json("Grade it.", "Deliverable: 42") == VERDICT
    (req,) = srv.requests
    assert req["model"] == "judge-x" and req["temperature"] == 0.0
    assert req["messages"][0]["role"] == "system" and "JSON object" in req["messages"][0]["content"]
    assert req["messages"][1] == {"role": "user", "content": "Deliverable: 42"}


@pytest.mark.parametrize("text,why", [
    ("I think it passes.", "no '{'"),
    ("[1, 2, 3]", "no '{'"),
    ('{"criteria": [', "no complete"),
])
def test_judge_json_error_carries_raw_text(text, why, serve):
    srv = serve(_answers(text))
    judge = JudgeClient(srv.base_url, "judge-x", backoff_s=0.01)
    with pytest.raises(JudgeAnswerError) as ei:
        judge.judge_json("Grade it.", "x")
    assert ei.value.raw == text
    msg = str(ei.value)
    assert why in msg and repr(text)[1:-1][:15] in msg and "judge-x" in msg and srv.base_url in msg


def test_complete_returns_text_and_empty_answer_is_an_answer_error(serve):
    srv = serve(_answers("plain words"))
    assert JudgeClient(srv.base_url, "m").complete([{"role": "user", "content": "hi"}]) == "plain words"
    srv = serve(_answers(""))
    with pytest.raises(JudgeAnswerError, match="empty answer"):
        JudgeClient(srv.base_url, "m").complete([{"role": "user", "content": "hi"}])


def test_retries_5xx_with_backoff_then_succeeds(serve):
    state = {"n": 0}

    def flaky(body):
        state["n"] += 1
        return (503, "overloaded") if state["n"] <= 2 else (200, '{"ok": true}')

    srv = serve(flaky)
    judge = JudgeClient(srv.base_url, "m", max_retries=3, backoff_s=0.01)
    assert judge.judge_json("s", "u") == {"ok": True}
    assert len(srv.requests) == 3


def test_5xx_retries_are_bounded(serve):
    srv = serve(lambda body: (500, "boom"))
    judge = JudgeClient(srv.base_url, "m", max_retries=2, backoff_s=0.01)
    with pytest.raises(TaskError, match=r"HTTP 500.*after 3 tries"):
        judge.complete([{"role": "user", "content": "x"}])
    assert len(srv.requests) == 3


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_4xx_is_not_retried(status, serve):
    srv = serve(lambda body: (status, "no such model"))
    judge = JudgeClient(srv.base_url, "m", max_retries=3, backoff_s=0.01)
    with pytest.raises(TaskError, match=f"HTTP {status}") as ei:
        judge.complete([{"role": "user", "content": "x"}])
    assert len(srv.requests) == 1
    assert not isinstance(ei.value, JudgeAnswerError)


def test_unreachable_endpoint_is_retried_then_named():
    url = f"http://127.0.0.1:{free_port()}/v1"
    judge = JudgeClient(url, "m", max_retries=1, backoff_s=0.01, timeout=5)
    with pytest.raises(TaskError, match=r"unreachable after 2 tries") as ei:
        judge.complete([{"role": "user", "content": "x"}])
    assert url in str(ei.value) and not isinstance(ei.value, JudgeAnswerError)


def test_from_env_names_missing_variables(monkeypatch):
    for name in (ENV_BASE_URL, ENV_MODEL, ENV_API_KEY):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(TaskError) as ei:
        JudgeClient.from_env()
    assert ENV_BASE_URL in str(ei.value) and ENV_MODEL in str(ei.value)
    monkeypatch.setenv(ENV_BASE_URL, "http://127.0.0.1:9/v1/")
    with pytest.raises(TaskError) as ei:
        JudgeClient.from_env()
    assert ENV_MODEL in str(ei.value) and ENV_BASE_URL not in str(ei.value)


def test_from_env_builds_a_working_client(monkeypatch, serve):
    srv = serve(_answers('{"v": 1}'))
    monkeypatch.setenv(ENV_BASE_URL, srv.base_url + "/")
    monkeypatch.setenv(ENV_MODEL, "env-model")
    monkeypatch.setenv(ENV_API_KEY, "sk-test")
    judge = JudgeClient.from_env()
    assert (judge.base_url, judge.model, judge.temperature) == (srv.base_url, "env-model", 0.0)
    assert judge.judge_json("s", "u") == {"v": 1}
    assert srv.requests[0]["model"] == "env-model"


def test_parse_json_object_cases():
    assert parse_json_object('{"a": "}{", "b": [1, 2]}') == {"a": "}{", "b": [1, 2]}
    assert parse_json_object('note {not json} then {"x": {"y": "\\"}"}}') == {"x": {"y": '"}'}}
    assert parse_json_object('```\n{"a": 1,\n "b": [1, 2,],}\n```') == {"a": 1, "b": [1, 2]}
    assert parse_json_object('<think>unfinished {"draft": 1}') == {"draft": 1}
    for bad in ("", "true", "[1, 2]", "{'single': 'quotes'}"):
        with pytest.raises(ValueError):
            parse_json_object(bad)


def test_constructor_requires_url_and_model():
    with pytest.raises(TaskError, match=ENV_BASE_URL):
        JudgeClient("", "m")
    with pytest.raises(TaskError):
        JudgeClient("http://127.0.0.1:9/v1", "")
