"""ScriptedPolicy: expert/wrong/noop/file scripts mapped onto the tools each harness offers."""

from __future__ import annotations

import base64
import json

import pytest

from clawgym_env.errors import PolicyError
from clawgym_env.policy import make_policy
from clawgym_env.policy.base import GenerationContext, SamplingParams
from clawgym_env.policy.chat_format import assistant_text, parse_assistant
from clawgym_env.policy.scripted import ScriptedPolicy, resolve_tools, shell_write_command
from clawgym_env.task import Task

MOUNT = "/root/.openclaw/workspace"
EXPERT = {
    "steps": [
        {"tool": "write_file", "path": "src/app.py", "content": "print('hi')\n# it's \"quoted\" $HOME\n"},
        {"tool": "bash", "command": "python src/app.py > out.txt"},
        {"tool": "read_file", "path": "out.txt"},
        {"final": "Wrote src/app.py and ran it."},
    ],
    "wrong": [
        {"tool": "bash", "command": "echo nope"},
        {"final": "Done (wrongly)."},
    ],
}


def fn_tool(name: str, **props: str) -> dict:
    properties = {k: {"type": "string", "description": d} for k, d in props.items()}
    return {"type": "function", "function": {"name": name, "description": name,
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": list(props)}}}


MINI_TOOLS = [fn_tool("bash", command="shell command"), fn_tool("write_file", path="path", content="text"),
              fn_tool("read_file", path="path")]
CLAUDE_TOOLS = [fn_tool("Bash", command="The command", description="what it does"),
                fn_tool("Write", file_path="The absolute path to the file", content="content"),
                fn_tool("Read", file_path="The absolute path to the file")]


@pytest.fixture()
def task(tmp_path):
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    (task_dir / "expert.json").write_text(json.dumps(EXPERT))
    return Task(id="demo", instruction="Write and run app.py", task_dir=task_dir, mount_dir=MOUNT)


def run(policy, task, tools, n_assistant=0, max_tokens=4096, tokenizer=None):
    messages = [{"role": "user", "content": "go"}]
    for _ in range(n_assistant):
        messages += [{"role": "assistant", "content": None, "tool_calls": []}, {"role": "tool", "content": "ok"}]
    ctx = GenerationContext(episode_id="e", messages=messages, tools=tools, task=task)
    gen = policy.generate([1, 2, 3], SamplingParams(max_tokens=max_tokens), ctx)
    return gen, ctx


def calls_of(tokenizer, gen):
    text = tokenizer.decode(gen.token_ids)
    parsed = parse_assistant(text)
    return parsed, [(c["name"], json.loads(c["arguments"])) for c in parsed.tool_calls]


def test_expert_with_mini_tools(tokenizer, task):
    pol = ScriptedPolicy("expert", tokenizer)
    expected = [("write_file", {"path": "src/app.py", "content": EXPERT["steps"][0]["content"]}),
                ("bash", {"command": "python src/app.py > out.txt"}),
                ("read_file", {"path": "out.txt"})]
    for turn, want in enumerate(expected):
        gen, _ = run(pol, task, MINI_TOOLS, n_assistant=turn)
        assert gen.finish_reason == "stop" and gen.logprobs == [0.0] * len(gen.token_ids)
        assert tokenizer.decode(gen.token_ids) == assistant_text("", tool_calls=[want])
        assert gen.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        parsed, calls = calls_of(tokenizer, gen)
        assert calls == [want] and parsed.content == "" and not parsed.errors
    gen, _ = run(pol, task, MINI_TOOLS, n_assistant=3)
    parsed, calls = calls_of(tokenizer, gen)
    assert calls == [] and parsed.content == "Wrote src/app.py and ran it."
    # stateless: a later (or retried) request at the same point answers the same
    assert run(pol, task, MINI_TOOLS, n_assistant=9)[0].token_ids == gen.token_ids


def test_claude_code_tools_use_absolute_paths(tokenizer, task):
    pol = ScriptedPolicy("expert", tokenizer)
    _, calls = calls_of(tokenizer, run(pol, task, CLAUDE_TOOLS)[0])
    assert calls == [("Write", {"file_path": f"{MOUNT}/src/app.py", "content": EXPERT["steps"][0]["content"]})]
    _, calls = calls_of(tokenizer, run(pol, task, CLAUDE_TOOLS, n_assistant=1)[0])
    assert calls == [("Bash", {"command": "python src/app.py > out.txt"})]
    _, calls = calls_of(tokenizer, run(pol, task, CLAUDE_TOOLS, n_assistant=2)[0])
    assert calls == [("Read", {"file_path": f"{MOUNT}/out.txt"})]


def test_other_harness_tables():
    specs = resolve_tools([fn_tool("exec_command", cmd="c"), fn_tool("write", path="p", content="c"),
                           fn_tool("read_file", absolute_path="The absolute path")])
    assert specs["shell"].name == "exec_command" and specs["shell"].args == {"command": "cmd"}
    assert specs["write"].args == {"path": "path", "content": "content"} and not specs["write"].absolute
    assert specs["read"].args == {"path": "absolute_path"} and specs["read"].absolute
    qwen = resolve_tools([fn_tool("run_shell_command", command="c"), fn_tool("write_file", file_path="p", content="c")])
    assert qwen["write"].args["path"] == "file_path" and qwen["write"].absolute
    argv = resolve_tools([{"type": "function", "function": {"name": "shell", "parameters": {
        "type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}}}])
    assert argv["shell"].argv
    assert resolve_tools([fn_tool("run_terminal", command="c")])["shell"].name == "run_terminal"


def test_bash_only_writes_through_the_shell(tokenizer, task, tmp_path):
    import subprocess

    pol = ScriptedPolicy("expert", tokenizer)
    tools = [fn_tool("bash", command="shell command")]
    _, calls = calls_of(tokenizer, run(pol, task, tools)[0])
    (name, args), = calls
    assert name == "bash" and base64.b64encode(EXPERT["steps"][0]["content"].encode()).decode() in args["command"]
    work = tmp_path / "ws"
    work.mkdir()
    subprocess.run(["bash", "-c", args["command"]], cwd=work, check=True)
    assert (work / "src" / "app.py").read_text() == EXPERT["steps"][0]["content"]
    _, calls = calls_of(tokenizer, run(pol, task, tools, n_assistant=2)[0])
    assert calls == [("bash", {"command": "cat out.txt"})]
    assert shell_write_command("a b.txt", "x").endswith("> 'a b.txt'")


def test_no_tools_answers_at_once(tokenizer, task):
    parsed, calls = calls_of(tokenizer, run(ScriptedPolicy("expert", tokenizer), task, [])[0])
    assert calls == [] and parsed.content == "Wrote src/app.py and ran it."


def test_noop_and_wrong(tokenizer, task):
    parsed, calls = calls_of(tokenizer, run(ScriptedPolicy("noop", tokenizer), task, MINI_TOOLS)[0])
    assert calls == [] and parsed.content == "I am done."
    wrong = make_policy("scripted:wrong", tokenizer=tokenizer)
    _, calls = calls_of(tokenizer, run(wrong, task, MINI_TOOLS)[0])
    assert calls == [("bash", {"command": "echo nope"})]
    parsed, _ = calls_of(tokenizer, run(wrong, task, MINI_TOOLS, n_assistant=1)[0])
    assert parsed.content == "Done (wrongly)."


def test_file_mode(tokenizer, task, tmp_path):
    script = tmp_path / "cheat.json"
    script.write_text(json.dumps({"steps": [
        {"tool": "write_file", "path": "reward/check.py", "content": "print(1.0)\n"},
        {"final": "All tests pass."}]}))
    pol = make_policy(f"scripted:file:{script}", tokenizer=tokenizer)
    _, calls = calls_of(tokenizer, run(pol, task, MINI_TOOLS)[0])
    assert calls == [("write_file", {"path": "reward/check.py", "content": "print(1.0)\n"})]
    parsed, _ = calls_of(tokenizer, run(pol, None, MINI_TOOLS, n_assistant=1)[0])
    assert parsed.content == "All tests pass."
    with pytest.raises(PolicyError):
        ScriptedPolicy(f"file:{tmp_path / 'missing.json'}", tokenizer)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"steps": [{"tool": "rm", "path": "x"}, {"final": "x"}]}))
    with pytest.raises(PolicyError, match="rm"):
        ScriptedPolicy(f"file:{bad}", tokenizer)


def test_no_expert_is_a_record_not_a_crash(tokenizer, tmp_path):
    pol = ScriptedPolicy("expert", tokenizer)
    parsed, calls = calls_of(tokenizer, run(pol, None, MINI_TOOLS)[0])
    assert calls == [] and "No task" in parsed.content
    bare = Task(id="bare", instruction="x", task_dir=tmp_path)
    parsed, _ = calls_of(tokenizer, run(pol, bare, MINI_TOOLS)[0])
    assert "No expert is available" in parsed.content


def test_max_tokens_truncates(tokenizer, task):
    pol = ScriptedPolicy("expert", tokenizer)
    full, _ = run(pol, task, MINI_TOOLS)
    cut, _ = run(pol, task, MINI_TOOLS, max_tokens=5)
    assert cut.finish_reason == "length" and cut.token_ids == full.token_ids[:5] and len(cut.logprobs) == 5


def test_think_option(tokenizer, task):
    pol = ScriptedPolicy("expert", tokenizer, think=True)
    parsed, calls = calls_of(tokenizer, run(pol, task, MINI_TOOLS)[0])
    assert parsed.reasoning and calls[0][0] == "write_file"
    closed = tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)
    ctx = GenerationContext(messages=[{"role": "user", "content": "go"}], tools=MINI_TOOLS, task=task)
    gen = pol.generate(closed, SamplingParams(), ctx)
    assert parse_assistant(tokenizer.decode(gen.token_ids)).reasoning is None
