"""The echo harness: the smallest real harness, for testing a policy or a trainer end to end.

:class:`EchoHarness` is a :class:`~clawgym_env.harness.HarnessAdapter` whose process, inside the
sandbox like any harness, sends the task's instruction to the serving proxy *once* (OpenAI Chat
Completions, through the official ``openai`` SDK or, with ``client="http"``, plain ``urllib``),
writes the answer to ``answer_file`` in the workspace and prints it. No install, no tools, no
loop: an episode costs one model call, so a test of your policy, grader or trainer does not need a
real harness installed.

Invariants: the process's last stdout line is ``{"type": "final", "final_message": str | null,
"transcript": [...]}`` and :meth:`EchoHarness.read_output` reads exactly that line (no such line:
no final answer); the instruction travels as a file in the sandbox's HOME, never on the command
line; the process needs only the sandbox's Python (and the ``openai`` package for ``client="openai"``), launched
as :func:`sandbox_python` names it, so the echo harness runs from a virtual environment as from a system Python.

Usage::

    from clawgym_env import Runtime
    from clawgym_env.testing import EchoHarness, EchoScriptPolicy, echo_suite

    suite = echo_suite(tmp_path / "suite")
    with Runtime(EchoScriptPolicy(), out_dir=tmp_path / "eps") as rt:
        result = rt.run(suite.get("say-hello"), EchoHarness())
    assert result.record.reward == 1.0 and len(result.calls) == 1

Register it by name for code that looks harnesses up (``make_harness``, ``gym.make(..., harness=)``)::

    with clawgym_env.plugins.harnesses.registered("echo", EchoHarness): ...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Literal

from clawgym_env.harness import Endpoint, HarnessAdapter, HarnessOutput, LaunchSpec
from clawgym_env.task import Task

AGENT = r'''
import json, os, sys
base_url, model, instruction_file, answer_file, client, timeout = sys.argv[1:7]
with open(instruction_file, encoding="utf-8") as fh:
    instruction = fh.read()
messages = [{"role": "user", "content": instruction}]
key = os.environ.get("OPENAI_API_KEY", "")
if client == "openai":
    import openai
    api = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=float(timeout))
    answer = api.chat.completions.create(model=model, messages=messages).choices[0].message.content
else:
    import urllib.request
    request = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions", method="POST",
        data=json.dumps({"model": model, "messages": messages}).encode("utf-8"),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    with urllib.request.urlopen(request, timeout=float(timeout)) as response:
        answer = json.load(response)["choices"][0]["message"]["content"]
if answer_file:
    with open(answer_file, "w", encoding="utf-8") as fh:
        fh.write(answer or "")
transcript = messages + [{"role": "assistant", "content": answer}]
print(json.dumps({"type": "final", "final_message": answer, "transcript": transcript}))
'''


def sandbox_python() -> str:
    """This interpreter's path as a sandbox sees it: ``sys.executable`` under the *real* path of ``sys.prefix``.

    A sandbox binds this interpreter's prefix (and base prefix) read-only by its real path (symlinks
    resolved), and nothing else of the host's folders above it. A virtual environment reached through a
    symlinked folder (``~/proj -> /data/proj``, a linked ``.venv``) therefore has no ``sys.executable``
    inside; its real path does. The venv's own ``bin/python`` is kept (not the base interpreter it links
    to), so ``pyvenv.cfg`` still puts the venv's ``site-packages`` on the path inside. An interpreter outside
    its prefix is named by its real path."""
    exe = Path(os.path.abspath(sys.executable))
    prefix = Path(os.path.abspath(sys.prefix))
    try:
        rel = exe.relative_to(prefix)
    except ValueError:
        return os.path.realpath(exe)
    return str(Path(os.path.realpath(prefix)) / rel)


class EchoHarness(HarnessAdapter):
    """One model call with the task's instruction; the answer is the final message (see the module doc)."""

    name = "echo"
    dialect = "openai_chat"

    def __init__(self, client: Literal["openai", "http"] = "openai", answer_file: str | None = "answer.txt") -> None:
        if client not in ("openai", "http"):
            raise ValueError(f"client must be 'openai' or 'http', got {client!r}")
        self.client = client
        """``openai``: the official SDK; ``http``: plain ``urllib`` (no package needed in the sandbox)."""
        self.answer_file = answer_file
        """Where in the workspace the answer is written (None: nowhere)."""

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """This Python (:func:`sandbox_python`) running the one-call agent, the instruction as a file in ``home``."""
        instruction = f"{home}/.echo/instruction.txt"
        argv = [sandbox_python(), "-c", AGENT, endpoint.base_url, endpoint.model, instruction,
                self.answer_file or "", self.client, str(task.limits.timeout_s)]
        return LaunchSpec(argv=argv, env={"OPENAI_API_KEY": endpoint.api_key}, files={instruction: task.instruction},
                          cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The answer from the last ``{"type": "final", ...}`` line of stdout (None without one)."""
        for line in reversed(stdout.strip().splitlines()):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "final":
                return HarnessOutput(final_message=obj.get("final_message"), transcript=obj.get("transcript") or [])
        return HarnessOutput(final_message=None)
