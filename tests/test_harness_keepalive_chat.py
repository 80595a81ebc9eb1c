"""Chat keep-alives through real harnesses (issue 13 part 6): a slow policy behind the proxy, every call streamed
in the OpenAI chat dialect, keep-alives sent while the slow call runs.

The chat keep-alive is an empty ``chat.completion.chunk`` of the answer (``"choices": []``, see
:mod:`~clawgym_env.proxy.stream.keepalive`), sent before the role chunk. Each harness here parses it as a chunk and
must skip it: the episode is solved, no call is re-sent, and the keep-alives did go out (counted at the
proxy). Harnesses covered: the mini agent streaming (the official ``openai`` Python SDK, raw chunks) and
OpenClaw's ``openai-completions`` transport (the pi-derived client over the ``openai`` Node SDK). Qwen Code,
whose stream idle guard the keep-alives must reset, is in ``tests/test_harness_idle.py``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from clawgym_env.episodes.run import run_episode
from clawgym_env.plugins import make_harness
from clawgym_env.policy.scripted import ScriptedPolicy
from clawgym_env.proxy.dialects.openai_chat import dialect as openai_chat
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.task import Task
from clawgym_env.testing import SlowPolicy
from harness_adapters.openclaw import OpenClawAdapter

try:
    from helpers_claude_codex import installed
except ImportError:  # tests run as a package
    from tests.helpers_claude_codex import installed

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")]

TASK = "json_merge_config"  # four calls: read, read, write, answer
SLOW_S = 3.0  # the slow call (the 2nd)
KEEPALIVE_S = 0.5  # well below SLOW_S: several keep-alives before the answer


@pytest.fixture
def task(builtin_suite) -> Task:
    return builtin_suite.get(TASK)


@pytest.fixture
def ticks(monkeypatch) -> Iterator[list[str]]:
    """Every chat keep-alive the proxy sends (the proxy runs in this process)."""
    sent: list[str] = []
    tick = openai_chat.ChatKeepAlive.tick

    def counted(self) -> str:
        line = tick(self)
        sent.append(line)
        return line

    monkeypatch.setattr(openai_chat.ChatKeepAlive, "tick", counted)
    yield sent


def _solved_with_keepalives(task: Task, adapter, tokenizer, tmp_path, ticks: list[str]):
    slow = SlowPolicy(ScriptedPolicy("expert", tokenizer=tokenizer), SLOW_S, calls={1})
    with ProxyServer(slow, keepalive_s=KEEPALIVE_S) as proxy:
        res = run_episode(task, adapter, proxy, out_dir=tmp_path / "episodes")
    rec = res.record
    logs = rec.logs.get("stdout", "") + rec.logs.get("stderr", "")
    assert rec.status == "ok" and rec.reward == 1.0, (rec.status, rec.error, logs[-3000:])
    assert [(d.call, d.retried, d.held_s >= SLOW_S) for d in slow.delayed] == [(1, False, True)]
    assert all(c.stream and c.dialect == "openai_chat" for c in res.calls)
    prompts = [tuple(c.prompt_token_ids) for c in res.calls]
    assert len(set(prompts)) == len(prompts), "a call was re-sent"
    assert all(c.discarded_by is None for c in res.calls)
    assert ticks, "the slow call got no keep-alive"
    assert all(t.startswith('data: {"id": "chatcmpl-') and '"choices": [], "usage": null}' in t for t in ticks)
    return res


def test_mini_streaming_skips_keepalive_chunks(task, tokenizer, tmp_path, ticks):
    _solved_with_keepalives(task, make_harness("mini", stream=True), tokenizer, tmp_path, ticks)


def test_openclaw_chat_skips_keepalive_chunks(task, tokenizer, tmp_path, ticks):
    _solved_with_keepalives(task, installed(OpenClawAdapter("openai-completions")), tokenizer, tmp_path, ticks)
