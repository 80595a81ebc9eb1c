"""The conformance check: on mini end to end, and on synthetic traffic with OpenClaw-style rewrites."""

from __future__ import annotations

import json

import pytest

from clawgym_env.capture.records import CallRecord, EpisodeRecord
from clawgym_env.policy.chat_format import assistant_text, parse_assistant, render_prompt_ids
from harness_adapters.check import analyze, check_harness, network_attempts

TOOLS = [{"type": "function", "function": {"name": "exec", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}]
CONTEXT = {"role": "user", "content": "<<<BEGIN_INTERNAL_CONTEXT>>> Active sessions: none"}


def test_check_mini_end_to_end():
    report = check_harness("mini")
    assert report.status == "ok" and report.reward == 1.0
    assert report.dialects == ["openai_chat"] and report.streaming is False
    assert report.tools_offered == ["bash", "read_file", "write_file"]
    assert report.num_calls >= 3 and report.side_calls == 0
    assert all(report.extends_by_messages) and all(report.extends_by_tokens)
    assert report.rewrites == {} and report.network_attempts == [] and report.token_exact_share == 1.0
    assert report.startup_s is not None and 0 < report.startup_s < report.wall_s
    assert "extends previous call, by token ids" in report.render()


def _record(tokenizer, i, messages, text):
    body = {"model": "m", "messages": messages, "tools": TOOLS, "stream": True}
    prompt = render_prompt_ids(tokenizer, messages, TOOLS)
    msg = parse_assistant(text).to_openai_message()
    for k, tc in enumerate(msg.get("tool_calls") or []):
        tc["id"] = f"call_ab_{i}_{k}"
    return CallRecord(episode_id="e", call_index=i, dialect="openai_chat", path="/v1/chat/completions", stream=True,
                      request=body, prompt_token_ids=prompt, output_token_ids=tokenizer.encode(text),
                      output_logprobs=[0.0] * len(tokenizer.encode(text)), finish_reason="stop",
                      response_message=msg, started_at=100.0 + i)


def test_openclaw_style_rewrites_are_detected(tokenizer):
    system = {"role": "system", "content": "You are a claw."}
    user = {"role": "user", "content": "make a file"}
    t1 = assistant_text("", reasoning="plan", tool_calls=[("exec", {"command": "touch a"})])
    c1 = _record(tokenizer, 0, [system, user, CONTEXT], t1)
    # OpenClaw sends the turn back with underscores stripped from the id, compact arguments, no thinking,
    # and moves its trailing context message behind the new tool result.
    back = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "callab00", "type": "function", "function": {"name": "exec", "arguments": '{"command":"touch a"}'}}]}
    m2 = [system, user, back, {"role": "tool", "tool_call_id": "callab00", "content": "ok"}, CONTEXT]
    c2 = _record(tokenizer, 1, m2, assistant_text("Done."))
    side = _record(tokenizer, 2, [{"role": "system", "content": "Summarise."}, {"role": "user", "content": "x"}],
                   assistant_text("Title"))
    rec = EpisodeRecord(episode_id="e", task_id="t", harness="openclaw", policy="p", status="ok", reward=1.0,
                        wall_s=5.0, resources={"harness_started_at": 97.5})
    report = analyze("openclaw", rec, [c1, c2, side])
    assert report.side_calls == 1 and report.num_calls == 3
    assert report.extends_by_messages == [False] and report.extends_by_tokens == [False]
    for key in ("tool_call_ids", "argument_serialisation", "thinking_dropped", "trailing_context_message_moved"):
        assert report.rewrites.get(key) == 1, (key, report.rewrites)
    assert report.startup_s == 2.5
    json.dumps(report.as_dict())


def test_network_attempts_from_strace_lines():
    query = r"4\304\1\0\0\1\0\0\0\0\0\0\3api\tanthropic\3com\0\0\34\0\1"
    trace = "\n".join([
        '5 connect(3, {sa_family=AF_INET, sin_port=htons(18080), sin_addr=inet_addr("127.0.0.1")}, 16) = 0',
        '5 connect(4, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.0.0.53")}, 16) = -1',
        '5 connect(4, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("127.0.0.1")}, 16) = 0',
        f'5 sendto(4, "{query}", 35, MSG_NOSIGNAL, NULL, 0) = 35',
        '5 connect(5, {sa_family=AF_INET, sin_port=htons(443), sin_addr=inet_addr("1.2.3.4")}, 16) = -1',
        '5 connect(6, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = -1'])
    assert network_attempts(trace) == ["dns via 10.0.0.53", "dns api.anthropic.com", "connect 1.2.3.4:443"]
    assert network_attempts("") == []


def test_probe_sees_a_dns_lookup_inside_the_sandbox(tmp_path):
    """A harness that tries to reach the internet is reported, with the name it looked up."""
    import json as _json

    from clawgym_env.envs.runtime import Runtime
    from clawgym_env.plugins import make_harness
    from tasks import resolve_task

    script = tmp_path / "phone_home.json"
    script.write_text(_json.dumps({"steps": [
        {"tool": "bash", "command": "python3 -c \"import socket\ntry: socket.getaddrinfo('telemetry.example.com', 443)"
                                    "\nexcept OSError: pass\""}, {"final": "done"}]}))
    with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "eps") as rt:
        res = rt.run(resolve_task("builtin/csv_total"), make_harness("mini"), trace_network=True)
    report = analyze("mini", res.record, res.calls)
    assert "dns telemetry.example.com" in report.network_attempts


# What the harnesses' own documentation of their traffic says (see the harness notes in the project
# docs): dialect, streaming, whether calls extend each other, and which history rewrites they make.
EXPECTED = {
    "claude-code": dict(dialect="anthropic_messages", extends=True, rewrites={"raw_history_reserialised"}),
    "codex": dict(dialect="openai_responses", extends=True, rewrites=set()),
    "qwen-code": dict(dialect="openai_chat", extends=True, rewrites={"argument_serialisation"}),
    "openclaw": dict(dialect="openai_chat", extends=False,
                     rewrites={"tool_call_ids", "argument_serialisation", "trailing_context_message_moved"}),
}


@pytest.mark.parametrize("harness", sorted(EXPECTED))
def test_conformance_report_matches_the_known_behaviour(harness):
    from clawgym_env.errors import HarnessError

    want = EXPECTED[harness]
    try:
        report = check_harness(harness)
    except HarnessError as exc:
        pytest.skip(f"cannot install {harness}: {exc}")
    assert report.status == "ok" and report.reward == 1.0, report.render()
    assert report.dialects == [want["dialect"]] and report.streaming is True
    assert report.side_calls == 0 and report.num_calls >= 3
    assert all(report.extends_by_messages) is want["extends"] and any(report.extends_by_messages) is want["extends"]
    assert set(report.rewrites) == want["rewrites"], report.rewrites
    assert report.network_attempts == []
    assert report.token_exact_share >= 0.95 and report.first_prompt_tokens > 1000
    assert report.startup_s is not None and report.peak_memory_mb
