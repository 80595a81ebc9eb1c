"""mini in a real episode (bubblewrap sandbox, proxy, scripted policy) when a command prints bytes
that are not UTF-8: the output reaches the model with replacement characters and the episode
goes on to its reward."""

from __future__ import annotations

import json

from clawgym_env.envs.runtime import Runtime
from clawgym_env.plugins import make_harness
from harness_adapters.mini.agent import run_tool

BAD_BYTES = r"printf 'before\xff\xfeafter\n'; head -c 64 /bin/true >/dev/null; printf 'bin:\x80\x81\n' >&2"


def test_invalid_utf8_output_is_replaced_and_the_episode_is_scored(builtin_suite, tmp_path):
    task = builtin_suite.get("write_greeting")
    expert = json.loads(task.expert_path.read_text())["steps"]
    script = tmp_path / "bytes.json"
    script.write_text(json.dumps({"steps": [{"tool": "bash", "command": BAD_BYTES},
                                            {"tool": "bash", "command": "cat /bin/true | head -c 4096"},
                                            *expert]}))
    with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "eps") as rt:
        res = rt.run(task, make_harness("mini"))
    rec = res.record
    assert rec.status == "ok", (rec.error, rec.logs)
    assert rec.reward == 1.0, (rec.reward_reason, rec.logs)
    tool_results = [m["content"] for m in res.calls[-1].request["messages"] if m.get("role") == "tool"]
    assert tool_results[0] == "exit code: 0\nbefore\ufffd\ufffdafter\nbin:\ufffd\ufffd\n"
    assert tool_results[1].startswith("exit code: 0\n\x7fELF") and "\ufffd" in tool_results[1]
    assert rec.final_message == expert[-1]["final"]


def test_tool_results_are_always_valid_utf8(tmp_path, monkeypatch):
    """A model's arguments may hold lone surrogates (valid JSON): an error text, never a crash,
    and nothing that cannot be encoded goes back to the model."""
    monkeypatch.chdir(tmp_path)
    out = run_tool("write_file", json.dumps({"path": "bad\ud800.txt", "content": "x"}), 5)
    assert out.startswith("error: ") and out.encode("utf-8")
    out = run_tool("bash", json.dumps({"command": "printf 'a\\r\\nb\\xff'"}), 5)
    assert out == "exit code: 0\na\nb\ufffd"
