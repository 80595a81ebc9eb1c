"""The Gemini dialect (a plugin on the dialect seam) against the real proxy, with the official ``google-genai`` SDK
as the client and the scripted echo policy: answers, a tool-call round trip with stable ids, streaming,
``countTokens``, the system instruction, Google's error shape, and every recorded call token-exact."""

from __future__ import annotations

import pytest

genai = pytest.importorskip("google.genai")
from google.genai import errors, types  # noqa: E402

from clawgym_env.policy.chat_format import render_prompt_ids  # noqa: E402
from clawgym_env.proxy.dialects.registry import registered  # noqa: E402
from clawgym_env.proxy.server import ProxyServer  # noqa: E402
from clawgym_env.testing import EchoScriptPolicy  # noqa: E402
from clawgym_env.testing.policy import DEFAULT_TOOL_ARGS  # noqa: E402

READ = types.FunctionDeclaration(name="read_file", description="Read a file.", parameters_json_schema={
    "type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["path"]})


@pytest.fixture(scope="module")
def policy(tokenizer):
    return EchoScriptPolicy(tokenizer)


@pytest.fixture(scope="module")
def server(policy):
    with ProxyServer(policy) as srv:
        yield srv


@pytest.fixture
def episode(server):
    """(client, session) of a fresh episode (each test closes it and checks its calls)."""
    s = server.open_episode()
    root = s.base_url(server.url).removesuffix("/v1")
    client = genai.Client(api_key="not-a-key", http_options=types.HttpOptions(
        base_url=root, api_version="v1beta", timeout=120_000))
    return client, s


def calls_of(server, session):
    return server.close_episode(session.token)


def test_the_dialect_is_registered_by_its_entry_point():
    assert "gemini" in [d.name for d in registered()]


def test_generate_with_a_system_instruction_is_recorded_token_exact(server, episode, tokenizer):
    client, s = episode
    answer = client.models.generate_content(
        model="gemini-2.5-pro", contents="hello gemini",
        config=types.GenerateContentConfig(system_instruction="You are terse.", temperature=0.5, max_output_tokens=64))
    assert answer.text == "Echo: hello gemini"
    assert answer.candidates[0].finish_reason == types.FinishReason.STOP
    (call,) = calls_of(server, s)
    assert call.dialect == "gemini" and call.path.endswith("/v1beta/models/gemini-2.5-pro:generateContent")
    assert call.token_exact and not call.stream
    assert call.prompt_token_ids == render_prompt_ids(tokenizer, [{"role": "system", "content": "You are terse."},
                                                                  {"role": "user", "content": "hello gemini"}])
    assert tokenizer.decode(call.output_token_ids).startswith("Echo: hello gemini")
    assert call.sampling["temperature"] == 0.5
    assert answer.usage_metadata.prompt_token_count == len(call.prompt_token_ids)
    assert answer.usage_metadata.candidates_token_count == len(call.output_token_ids)


def test_a_tool_call_round_trip_keeps_its_id_and_extends_the_prompt(server, episode):
    client, s = episode
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[READ])])
    user = types.Content(role="user", parts=[types.Part(text="read my notes")])
    first = client.models.generate_content(model="m", contents=[user], config=config)
    (fc,) = first.function_calls
    assert fc.name == "read_file" and fc.args == DEFAULT_TOOL_ARGS and fc.id
    result = types.Part(function_response=types.FunctionResponse(id=fc.id, name=fc.name, response={"output": "42"}))
    second = client.models.generate_content(
        model="m", config=config,
        contents=[user, first.candidates[0].content, types.Content(role="user", parts=[result])])
    assert second.text == "Tool said: 42"
    c1, c2 = calls_of(server, s)
    assert c1.response_message["tool_calls"][0]["id"] == fc.id  # the id answered is the id recorded
    assert c1.token_exact and c2.token_exact
    head = c1.prompt_token_ids + c1.output_token_ids
    assert c2.prompt_token_ids[:len(head)] == head  # the re-sent history renders to the ids the policy saw


def test_streaming_sends_sse_chunks_that_add_up_to_the_answer(server, episode):
    client, s = episode
    chunks = list(client.models.generate_content_stream(model="m", contents="THINK: stream me"))
    text = "".join(p.text for c in chunks for p in c.candidates[0].content.parts or [] if p.text and not p.thought)
    thought = "".join(p.text for c in chunks for p in c.candidates[0].content.parts or [] if p.thought)
    assert text == "Echo: THINK: stream me" and thought.startswith("Thinking about stream me")
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])
    (call,) = calls_of(server, s)
    assert call.stream and call.token_exact and call.path.endswith(":streamGenerateContent")
    stream_calls = [c for c in chunks if c.function_calls]
    assert not stream_calls


def test_a_streamed_tool_call_carries_its_id_and_args(server, episode):
    client, s = episode
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[READ])])
    chunks = list(client.models.generate_content_stream(model="m", contents="read", config=config))
    calls = [fc for c in chunks for fc in c.function_calls or []]
    assert [(fc.name, fc.args) for fc in calls] == [("read_file", DEFAULT_TOOL_ARGS)] and calls[0].id
    (call,) = calls_of(server, s)
    assert call.response_message["tool_calls"][0]["id"] == calls[0].id


def test_count_tokens_is_the_rendered_prompt_and_is_not_recorded(server, episode, tokenizer):
    client, s = episode
    counted = client.models.count_tokens(model="m", contents="how long is this?")
    assert counted.total_tokens == len(render_prompt_ids(tokenizer, [{"role": "user",
                                                                      "content": "how long is this?"}]))
    assert calls_of(server, s) == []


def test_errors_come_in_googles_shape(server, episode):
    client, s = episode
    with pytest.raises(errors.ClientError) as bad:
        client.models.generate_content(model="m", contents="x", config=types.GenerateContentConfig(candidate_count=2))
    assert bad.value.code == 400 and bad.value.status == "INVALID_ARGUMENT"
    assert "candidateCount" in bad.value.message
    with pytest.raises(errors.ClientError) as role:
        client.models.generate_content(model="m", contents=[types.Content(role="robot", parts=[types.Part(text="x")])])
    assert role.value.code == 400 and "contents[0].role" in role.value.message
    gone = genai.Client(api_key="x", http_options=types.HttpOptions(
        base_url=f"{server.url}/ep/not-a-token", api_version="v1beta", timeout=60_000))
    with pytest.raises(errors.ClientError) as missing:
        gone.models.generate_content(model="m", contents="x")
    assert missing.value.code == 404 and missing.value.status == "NOT_FOUND"
    assert "episode token" in missing.value.message
    assert calls_of(server, s) == []
