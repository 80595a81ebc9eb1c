"""Attacks on the serving proxy, each run from inside a real episode (mini harness, bwrap sandbox, proxy).

* Socket tampering: an agent that ``chmod 000``s (and tries to remove) the proxy socket it was given
  cuts off nobody but, at most, itself: concurrent episodes finish all their calls.
* Leaked tokens: an agent holding another live episode's token (as if it leaked into its workspace)
  cannot call the model as that episode through its own socket — every route answers as for an
  unknown token (404), and nothing is recorded into the victim's calls or failures.
* Disclosure: ``/healthz`` seen from inside a sandbox says ``{"status": "ok"}`` and nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import openai
import pytest

from clawgym_env.envs.runtime import RolloutPool, Runtime
from clawgym_env.plugins import make_harness
from clawgym_env.sandbox.base import SandboxSpec
from clawgym_env.sandbox.bwrap.sandbox import PROXY_SOCK

PORT = next(f.default for f in dataclasses.fields(SandboxSpec) if f.name == "proxy_port")
FAILED = ("harness_error", "infra_error")

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def _task_with_inputs(base, tmp_path: Path, name: str, files: dict[str, str]):
    """A copy of task folder ``base`` (under ``tmp_path``) whose input files also hold ``files``."""
    root = tmp_path / f"task-{name}"
    shutil.copytree(base.task_dir, root, symlinks=True)
    moved = {key: root / Path(getattr(base, key)).relative_to(base.task_dir)
             for key in ("input_dir", "reward_dir") if getattr(base, key) is not None}
    inputs = moved.setdefault("input_dir", root / "input_files")
    inputs.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (inputs / rel).write_text(text)
    return base.model_copy(update={"id": f"{base.id}-{name}", "task_dir": root, **moved}, deep=True)


def _script(tmp_path: Path, steps: list[dict]) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"steps": steps}))
    return path


def _tool_outputs(result) -> str:
    """Everything the harness sent back to the model in its last call (tool results included)."""
    return json.dumps(result.calls[-1].request) if result.calls else ""


def test_chmod_of_the_proxy_socket_cuts_off_no_other_episode(builtin_suite, tmp_path):
    base = builtin_suite.tasks[0]
    attack = (f"if [ -f ATTACKER ]; then chmod 000 {PROXY_SOCK}; echo CHMOD_RC=$?; "
              f"rm -f {PROXY_SOCK}; echo RM_RC=$?; printf 'ATTACK_%s=%s\\n' AT $(date +%s.%N); fi; sleep 3; echo one")
    script = _script(tmp_path, [{"tool": "bash", "command": attack},
                                {"tool": "bash", "command": "sleep 1; echo two"},
                                {"final": "done"}])
    tasks = [_task_with_inputs(base, tmp_path, "attacker", {"ATTACKER": "1"}),
             _task_with_inputs(base, tmp_path, "victim1", {}),
             _task_with_inputs(base, tmp_path, "victim2", {})]
    with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "eps") as rt:
        results = RolloutPool(rt, concurrency=3, progress=False).run(tasks, make_harness("mini"))
    attacker, victims = results[0], results[1:]
    seen = json.dumps([c.request for c in attacker.calls])
    assert "ATTACK_AT=" in seen, (attacker.record.status, attacker.record.error, attacker.record.logs)
    attack_at = float(seen.split("ATTACK_AT=")[1].split("\\")[0])
    # the socket is immutable from inside: neither chmod nor rm succeeds on it
    assert "CHMOD_RC=" in seen and "CHMOD_RC=0" not in seen and "RM_RC=" in seen and "RM_RC=0" not in seen
    for v in victims:
        assert v.record.status not in FAILED, (v.record.status, v.record.error, v.record.logs)
        assert v.record.num_calls == 3, (v.record.num_calls, v.record.error)
        assert v.calls[-1].started_at > attack_at, "the victim's last call came before the attack: no test"


def test_a_leaked_token_is_useless_from_another_sandbox(builtin_suite, tmp_path):
    base = builtin_suite.tasks[0]
    probe = ("import json, sys, urllib.request, urllib.error\n"
             f"tok = open('VICTIM_TOKEN').read().strip(); url = 'http://127.0.0.1:{PORT}'\n"
             "def go(method, path, body=None):\n"
             "    req = urllib.request.Request(url + path, method=method, data=None if body is None else "
             "json.dumps(body).encode(),\n"
             "        headers={'content-type': 'application/json', 'authorization': 'Bearer ' + tok})\n"
             "    try:\n"
             "        r = urllib.request.urlopen(req, timeout=20); return r.status, r.read().decode()\n"
             "    except urllib.error.HTTPError as e:\n"
             "        return e.code, e.read().decode()\n"
             "chat = {'model': 'm', 'messages': [{'role': 'user', 'content': 'STOLEN CALL'}]}\n"
             "for name, (m, p, b) in {'chat': ('POST', f'/ep/{tok}/v1/chat/completions', chat),\n"
             "    'messages': ('POST', f'/ep/{tok}/v1/messages', dict(chat, max_tokens=8)),\n"
             "    'responses': ('POST', f'/ep/{tok}/v1/responses', {'model': 'm', 'input': 'STOLEN CALL'}),\n"
             "    'models': ('GET', f'/ep/{tok}/v1/models', None), 'healthz': ('GET', '/healthz', None)}.items():\n"
             "    code, text = go(m, p, b); print(f'PROBE_{name}={code}', text[:120].replace(tok, 'TOKEN'))\n")
    script = _script(tmp_path, [{"tool": "bash", "command": f"python3 - <<'EOF'\n{probe}EOF"},
                                {"final": "done"}])
    with Runtime(f"scripted:file:{script}", out_dir=tmp_path / "eps") as rt:
        server = rt.proxy
        victim = server.open_episode("victim-episode")
        try:
            client = openai.OpenAI(base_url=victim.base_url(server.url), api_key="x", max_retries=0)
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "legit"}])
            task = _task_with_inputs(base, tmp_path, "thief", {"VICTIM_TOKEN": victim.token})
            res = rt.run(task, make_harness("mini"))
        finally:
            victim_calls = server.close_episode(victim.token)
    seen = _tool_outputs(res)
    assert "PROBE_chat=" in seen, (res.record.status, res.record.error, res.record.logs)
    probes = re.findall(r"PROBE_\w+=\d+", seen)
    for name in ("chat", "messages", "responses", "models"):
        assert f"PROBE_{name}=404" in probes, probes
    assert 'PROBE_healthz=200 {\\"status\\":\\"ok\\"}' in seen, seen[seen.find("PROBE_healthz"):][:300]
    # the victim's capture is unchanged: its one legit call, no failure charged to it
    assert [c.request["messages"][-1]["content"] for c in victim_calls] == ["legit"]
    assert victim.failures == []
