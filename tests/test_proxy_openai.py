"""The serving proxy's OpenAI Chat Completions dialect, driven by the official ``openai`` SDK.

Every test talks HTTP to a real :class:`ProxyServer` (uvicorn in a thread) in front of
``EchoScriptPolicy`` (real Qwen3 tokenizer); raw bodies go through httpx.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest
from openai import OpenAI

from clawgym_env.errors import ProxyError
from clawgym_env.policy.chat_format import IM_END, assistant_text, parse_assistant, render_prompt_text
from clawgym_env.proxy.deltas import iter_deltas, segment, stop_cut, token_pieces
from clawgym_env.proxy.server import ProxyServer, serve_proxy
from clawgym_env.testing import FAIL, EchoScriptPolicy

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


@pytest.fixture(scope="module")
def policy(tokenizer):
    return EchoScriptPolicy(tokenizer)


@pytest.fixture(scope="module")
def server(policy):
    with ProxyServer(policy) as srv:
        yield srv


@pytest.fixture
def episode(server):
    session = server.open_episode(task={"id": "t1"}, harness="pytest")
    yield session
    if server.get_episode(session.token) is not None:
        server.close_episode(session.token)


def client_for(server, session, **kw) -> OpenAI:
    return OpenAI(base_url=session.base_url(server.url), api_key="sk-secret-do-not-store", max_retries=0, **kw)


def collect_stream(stream):
    """Reassemble a streamed chat completion: (role, content, reasoning, tool_calls, finish, usage, chunks)."""
    role, content, reasoning, calls, finish, usage, chunks = None, "", "", {}, None, None, []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            role = d.role or role
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for tc in d.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.type == "function" and tc.function.name and tc.function.arguments == ""
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and not tc.function.name
                    calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return role, content, reasoning, [calls[i] for i in sorted(calls)], finish, usage, chunks


def test_non_streaming_chat_is_recorded_token_exactly(server, episode, tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo 世界 🎉"}]
    resp = client_for(server, episode).chat.completions.create(model="qwen", messages=msgs, temperature=0.5)
    msg = resp.choices[0].message
    assert msg.role == "assistant" and msg.content == "Echo: héllo 世界 🎉"
    assert resp.choices[0].finish_reason == "stop" and resp.object == "chat.completion"
    (rec,) = episode.calls
    assert tokenizer.decode(rec.prompt_token_ids) == render_prompt_text(tokenizer, msgs)
    assert tokenizer.decode(rec.output_token_ids) == assistant_text(msg.content)
    assert len(rec.output_logprobs) == len(rec.output_token_ids)
    assert resp.usage.prompt_tokens == len(rec.prompt_token_ids)
    assert resp.usage.completion_tokens == len(rec.output_token_ids)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert rec.dialect == "openai_chat" and rec.stream is False and rec.call_index == 0
    assert rec.request["messages"] == msgs and rec.sampling["temperature"] == 0.5
    assert rec.response_message == {"role": "assistant", "content": msg.content}
    assert rec.policy_name == "echo-script" and rec.policy_version == 3
    assert {"render_s", "generate_s", "total_s"} <= set(rec.timings)
    assert rec.headers["user-agent"].startswith("OpenAI/Python")
    assert "sk-secret-do-not-store" not in rec.model_dump_json()


def test_streaming_content_and_reasoning_deltas(server, episode, tokenizer):
    msgs = [{"role": "user", "content": "THINK: naïve 世界 🎉 streaming"}]
    stream = client_for(server, episode).chat.completions.create(model="qwen", messages=msgs, stream=True)
    role, content, reasoning, calls, finish, usage, chunks = collect_stream(stream)
    assert role == "assistant" and finish == "stop" and not calls and usage is None
    assert content == "Echo: THINK: naïve 世界 🎉 streaming"
    assert reasoning == "Thinking about naïve 世界 🎉 streaming 🤔"
    assert len(chunks) > 10 and all(c.object == "chat.completion.chunk" for c in chunks)
    for c in chunks:  # never half a character
        for ch in c.choices:
            assert "\ufffd" not in (ch.delta.content or "")
    (rec,) = episode.calls
    assert rec.stream is True
    assert tokenizer.decode(rec.output_token_ids) == assistant_text(content, reasoning=reasoning)
    assert rec.response_message["content"] == content and rec.response_message["reasoning_content"] == reasoning


def test_stream_include_usage_chunk(server, episode):
    stream = client_for(server, episode).chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "count me"}], stream=True,
        stream_options={"include_usage": True})
    *_, usage, chunks = collect_stream(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage == usage
    rec = episode.calls[0]
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(rec.prompt_token_ids), len(rec.output_token_ids))


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_then_tool_result(server, episode, policy, tokenizer, stream):
    client = client_for(server, episode)
    msgs = [{"role": "user", "content": "read my notes"}]
    if stream:
        _, content, _, calls, finish, _, _ = collect_stream(
            client.chat.completions.create(model="qwen", messages=msgs, tools=TOOLS, stream=True))
    else:
        resp = client.chat.completions.create(model="qwen", messages=msgs, tools=TOOLS, tool_choice="auto")
        m, finish = resp.choices[0].message, resp.choices[0].finish_reason
        content = m.content
        calls = [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments} for t in m.tool_calls]
    assert finish == "tool_calls" and not content and len(calls) == 1
    call = calls[0]
    assert call["name"] == "read_file" and json.loads(call["arguments"]) == policy.tool_args
    rec = episode.calls[0]
    assert tokenizer.decode(rec.prompt_token_ids) == render_prompt_text(tokenizer, msgs, TOOLS)
    assert tokenizer.decode(rec.output_token_ids) == assistant_text(
        tool_calls=[(call["name"], json.loads(call["arguments"]))])
    assert rec.finish_reason == "tool_calls" and rec.response_message["tool_calls"][0]["id"] == call["id"]
    assert policy.seen[-1][2].tools == TOOLS and policy.seen[-1][2].task == {"id": "t1"}

    follow = msgs + [
        {"role": "assistant", "content": None, "reasoning_content": "I should read it.",
         "tool_calls": [{"id": call["id"], "type": "function",
                         "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": [{"type": "text", "text": "buy milk"}]}]
    resp = client.chat.completions.create(model="qwen", messages=follow, tools=TOOLS)
    assert resp.choices[0].message.content == "Tool said: buy milk"
    assert resp.choices[0].finish_reason == "stop"
    rec2 = episode.calls[1]
    assert rec2.call_index == 1
    prompt = tokenizer.decode(rec2.prompt_token_ids)
    # token in, token out: the assistant turn is the sampled ids, not a re-rendering of what the client sent
    assert rec2.token_exact and rec2.token_exact_reason is None
    head = rec.prompt_token_ids + rec.output_token_ids
    assert rec2.prompt_token_ids[:len(head)] == head
    assert "<tool_response>\nbuy milk\n</tool_response>" in prompt and "I should read it." not in prompt

    # an assistant turn the policy never sampled is rendered from its text (reasoning included), flagged
    forged = [msgs[0], {"role": "assistant", "content": "Sure.", "reasoning_content": "I should read it."},
              {"role": "user", "content": "and now?"}]
    client.chat.completions.create(model="qwen", messages=forged, tools=TOOLS)
    rec3 = episode.calls[2]
    assert not rec3.token_exact and "match no sampled output" in rec3.token_exact_reason
    assert tokenizer.decode(rec3.prompt_token_ids) == render_prompt_text(tokenizer, forged, TOOLS)


def test_tool_choice_none_hides_tools_and_images_become_placeholders(server, episode, tokenizer, policy):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "look: "},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    resp = client_for(server, episode).chat.completions.create(model="qwen", messages=msgs, tools=TOOLS,
                                                               tool_choice="none")
    assert resp.choices[0].message.tool_calls is None and resp.choices[0].finish_reason == "stop"
    prompt = tokenizer.decode(episode.calls[0].prompt_token_ids)
    assert "read_file" not in prompt and "look: [image]" in prompt and policy.seen[-1][2].tools == []


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_truncate_tokens(server, episode, tokenizer, stream):
    client = client_for(server, episode)
    msgs = [{"role": "user", "content": "alpha beta STOP gamma delta"}]
    resp = client.chat.completions.create(model="qwen", messages=msgs, stop=["STOP", "never"], stream=stream)
    if stream:
        _, content, _, _, finish, _, _ = collect_stream(resp)
    else:
        content, finish = resp.choices[0].message.content, resp.choices[0].finish_reason
    assert finish == "stop" and content.startswith("Echo: alpha beta") and "STOP" not in content
    rec = episode.calls[0]
    text = tokenizer.decode(rec.output_token_ids)
    assert IM_END not in text and parse_assistant(text).content == content
    assert rec.sampling["stop"] == ["STOP", "never"] and rec.finish_reason == "stop"


def test_max_tokens_gives_length(server, episode, tokenizer):
    client = client_for(server, episode)
    resp = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "a long answer"}],
                                          max_tokens=3)
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 3
    rec = episode.calls[0]
    assert len(rec.output_token_ids) == 3 and rec.sampling["max_tokens"] == 3
    assert tokenizer.decode(rec.output_token_ids) == resp.choices[0].message.content
    resp = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "x"}],
                                          max_completion_tokens=2, max_tokens=50)
    assert resp.usage.completion_tokens == 2


def test_sampling_overrides_win(server):
    session = server.open_episode(sampling={"temperature": 0.0, "max_tokens": 4, "seed": 7})
    try:
        resp = client_for(server, session).chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "override me please now"}], temperature=1.3,
            max_tokens=100, seed=1)
        assert resp.choices[0].finish_reason == "length"
        assert session.calls[0].sampling == {"max_tokens": 4, "temperature": 0.0, "top_p": 1.0, "stop": [],
                                             "seed": 7}
    finally:
        server.close_episode(session.token)
    with pytest.raises(ProxyError):
        server.open_episode(sampling={"frequency_penalty": 1.0})


def test_models_healthz_and_logprobs(server, episode):
    client = client_for(server, episode)
    assert [m.id for m in client.models.list().data] == ["echo-script"]
    assert httpx.get(server.url + "/healthz").json()["status"] == "ok"
    resp = client.chat.completions.create(model="q", messages=[{"role": "user", "content": "lp"}], logprobs=True)
    entries = resp.choices[0].logprobs.content
    assert len(entries) == len(episode.calls[0].output_token_ids) and all(e.logprob == 0.0 for e in entries)
    assert b"".join(bytes(e.bytes) for e in entries).decode() == assistant_text("Echo: lp")


def test_serve_proxy_foreground(policy, tmp_path):
    stop, lines = threading.Event(), []
    th = threading.Thread(target=lambda: lines.append(serve_proxy(
        policy, port=0, calls_out=tmp_path / "calls.jsonl", announce=lines.append, stop_event=stop)))
    th.start()
    deadline = time.monotonic() + 30
    while not lines and time.monotonic() < deadline:
        time.sleep(0.05)
    base = lines[0].split("base URL ")[1].split()[0]
    r = httpx.post(base + "/chat/completions", json={"messages": [{"role": "user", "content": "fg"}]})
    assert r.json()["choices"][0]["message"]["content"] == "Echo: fg"
    stop.set()
    th.join(30)
    assert len(lines[-1]) == 1 and (tmp_path / "calls.jsonl").read_text().count("\n") == 1


def test_unknown_token_is_openai_404(server, episode):
    bad = OpenAI(base_url=f"{server.url}/ep/not-a-token/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        bad.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 404
    r = httpx.post(f"{server.url}/ep/not-a-token/v1/chat/completions", json={"messages": []})
    err = r.json()["error"]
    assert r.status_code == 404 and set(err) == {"message", "type", "param", "code"}
    r = httpx.get(f"{server.url}/nowhere")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(episode.base_url(server.url) + "/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


GOOD = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}
BAD_BODIES = [
    ({"model": "qwen"}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "out"}]}, "messages[1].tool_call_id"),
    ({**GOOD, "temperature": "hot"}, "temperature"),
    ({**GOOD, "temperature": 2.5}, "temperature"),
    ({**GOOD, "top_p": -0.1}, "top_p"),
    ({**GOOD, "max_tokens": 0}, "max_tokens"),
    ({**GOOD, "max_completion_tokens": -3}, "max_completion_tokens"),
    ({**GOOD, "n": 2}, "n"),
    ({**GOOD, "stop": 7}, "stop"),
    ({**GOOD, "stream": "yes"}, "stream"),
    ({**GOOD, "tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
    ({**GOOD, "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]},
     "messages[0].tool_calls[0].function.name"),
]


@pytest.mark.parametrize("body,field", BAD_BODIES)
def test_malformed_bodies_are_400_naming_the_field(server, episode, body, field):
    r = httpx.post(episode.base_url(server.url) + "/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == field and field in err["message"]
    assert episode.calls == []


def test_sampled_tool_call_with_empty_name_is_accepted_back(server, episode):
    """A tiny policy can sample ``{"name": ""}``; the harness sends it back and must not get a 400."""
    body = {"messages": [{"role": "user", "content": "q"},
                         {"role": "assistant", "content": "", "tool_calls": [
                             {"id": "c1", "type": "function", "function": {"name": "", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "error: unknown tool ''"}]}
    r = httpx.post(episode.base_url(server.url) + "/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert len(episode.calls) == 1


@pytest.mark.parametrize("content,ctype,needle", [
    (b"{not json", "application/json", "JSON"),
    (b"[1, 2]", "application/json", "JSON object"),
    (b"", "application/json", "empty"),
    (b'{"messages": [], "temperature": NaN}', "application/json", "JSON"),
    (b"\xff\xfe", "application/json", "JSON"),
    (json.dumps(GOOD).encode(), "text/plain", "content-type"),
])
def test_raw_bad_requests_are_400(server, episode, content, ctype, needle):
    r = httpx.post(episode.base_url(server.url) + "/chat/completions", content=content,
                   headers={"content-type": ctype})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_policy_failure_is_502_json(server, episode):
    with pytest.raises(openai.APIStatusError) as info:
        client_for(server, episode).chat.completions.create(model="q", messages=[{"role": "user", "content": FAIL}])
    assert info.value.status_code == 502 and "scripted failure" in info.value.message
    assert episode.calls == []


def test_prompt_longer_than_context_is_400(policy):
    with ProxyServer(policy, max_context_tokens=32) as srv:
        session = srv.open_episode()
        with pytest.raises(openai.BadRequestError) as info:
            client_for(srv, session).chat.completions.create(
                model="q", messages=[{"role": "user", "content": "word " * 100}])
        assert "maximum context" in info.value.message and info.value.code == "context_length_exceeded"


def test_episodes_are_isolated_and_close_forgets_the_token(server):
    a, b = server.open_episode("iso-a"), server.open_episode("iso-b")
    assert a.token != b.token
    client_for(server, a).chat.completions.create(model="q", messages=[{"role": "user", "content": "from a"}])
    client_for(server, b).chat.completions.create(model="q", messages=[{"role": "user", "content": "from b"}])
    client_for(server, b).chat.completions.create(model="q", messages=[{"role": "user", "content": "b again"}])
    calls_a = server.close_episode(a.token)
    assert [c.episode_id for c in calls_a] == ["iso-a"] and calls_a[0].request["messages"][0]["content"] == "from a"
    with pytest.raises(openai.NotFoundError):
        client_for(server, a).chat.completions.create(model="q", messages=[{"role": "user", "content": "late"}])
    with pytest.raises(ProxyError):
        server.close_episode(a.token)
    calls_b = server.close_episode(b.token)
    assert [c.call_index for c in calls_b] == [0, 1] and {c.episode_id for c in calls_b} == {"iso-b"}


def test_concurrent_clients_are_served_in_parallel(tokenizer):
    slow = EchoScriptPolicy(tokenizer, delay_s=0.4)
    with ProxyServer(slow) as srv:
        sessions = [srv.open_episode(f"conc-{i}") for i in range(6)]
        answers: dict[int, str] = {}

        def worker(i: int) -> None:
            resp = client_for(srv, sessions[i]).chat.completions.create(
                model="q", messages=[{"role": "user", "content": f"client {i}"}], stream=i % 2 == 0)
            answers[i] = collect_stream(resp)[1] if i % 2 == 0 else resp.choices[0].message.content

        t0 = time.monotonic()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        [t.start() for t in threads]
        [t.join(30) for t in threads]
        assert answers == {i: f"Echo: client {i}" for i in range(6)}
        assert time.monotonic() - t0 < 6 * 0.4  # overlapped, not serialised
        for i, s in enumerate(sessions):
            (rec,) = srv.close_episode(s.token)
            assert rec.request["messages"][0]["content"] == f"client {i}"


def test_unix_socket_serves_the_same_app(server, episode):
    transport = httpx.HTTPTransport(uds=str(server.socket_path))
    with httpx.Client(transport=transport) as http:
        client = OpenAI(base_url=f"http://proxy/ep/{episode.token}/v1", api_key="x", max_retries=0, http_client=http)
        resp = client.chat.completions.create(model="q", messages=[{"role": "user", "content": "via socket"}])
    assert resp.choices[0].message.content == "Echo: via socket" and len(episode.calls) == 1


def test_start_stop_idempotent_and_failed_start_leaks_nothing(policy):
    srv = ProxyServer(policy)
    srv.start()
    srv.start()
    path, url = srv.socket_path, srv.url
    assert path.is_socket() and httpx.get(url + "/healthz").status_code == 200
    srv.stop()
    srv.stop()
    assert not path.exists() and not path.parent.exists() and not srv.running
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/healthz")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        failing = ProxyServer(policy, port=busy.getsockname()[1])
        with pytest.raises(ProxyError):
            failing.start()
        assert failing.socket_path is None and not failing.running and failing._sockets == []


@pytest.mark.parametrize("text", [
    assistant_text("plain ünïcode 世界"),
    assistant_text("", reasoning="hmm", tool_calls=[("f", {"a": "é"}), ("g", '{"b": 1}')]),
    "<think>\nr</think>\n\n  x <tool_call>\nnot json\n</tool_call> y \n" + IM_END,
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><|endoftext|>",
])
def test_stream_segmentation_matches_parse_assistant(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    for cut in range(len(ids) + 1):
        pieces = token_pieces(tokenizer, ids[:cut])
        joined = "".join(pieces)
        assert joined == tokenizer.decode(ids[:cut])
        seg, ref = segment(joined), parse_assistant(joined)
        parsed = seg.parsed()
        assert (parsed.content, parsed.reasoning, parsed.errors) == (ref.content, ref.reasoning, ref.errors)
        assert [(c["name"], c["arguments"]) for c in parsed.tool_calls] == \
            [(c["name"], c["arguments"]) for c in ref.tool_calls]
        deltas = list(iter_deltas(pieces, seg))
        assert "".join(d.text for d in deltas if d.kind == "content") == parsed.content
        for i, call in enumerate(parsed.tool_calls):
            assert "".join(d.text for d in deltas if d.kind == "tool_args" and d.index == i) == call["arguments"]
    pieces = token_pieces(tokenizer, ids)
    joined = "".join(pieces)
    for at in range(0, len(joined) - 2, 3):
        stop = joined[at:at + 3]
        keep = stop_cut(pieces, [stop, "absent"])
        kept = tokenizer.decode(ids[:keep])
        assert joined.startswith(kept) and stop not in kept and len(kept) <= joined.find(stop)
        assert "\ufffd" not in kept
    assert stop_cut(pieces, ["absent"]) is None
