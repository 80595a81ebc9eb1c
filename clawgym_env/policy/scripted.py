"""Scripted policies: decide what to say from a script, emit it as a Qwen3 model would.

A :class:`ScriptedPolicy` follows a list of steps (a task's ``expert.json`` ``steps`` or ``wrong``,
or any JSON file of the same format). Each step is ``{"tool": "write_file", "path", "content"}``,
``{"tool": "bash", "command"}`` or ``{"tool": "read_file", "path"}``, and the last one is
``{"final": "answer text"}``; paths are relative to the workspace (the harness's cwd).

Invariants:

* Stateless: the step taken is the number of assistant messages already in ``ctx.messages``, so
  concurrent episodes and retried requests get the same answer for the same conversation.
* Each step is expressed with a tool the harness actually offered in ``ctx.tools`` (see
  :data:`KNOWN_TOOLS` and :func:`resolve_tools`); a step no offered tool can express is skipped
  (the step list is filtered as a function of the offered tools only, which keeps indexing stable).
  With no tool offered, or after the steps, the reply is the final answer without a tool call, except
  where the harness ends only on a submit command (:data:`SUBMIT_SENTINELS`): then it is that shell call.
* The reply text is :func:`~clawgym_env.policy.chat_format.assistant_text` (``<|im_end|>`` included);
  ``token_ids`` are its encoding by the real tokenizer and decode back to it exactly; every logprob
  is 0.0; ``max_tokens`` truncates the ids with ``finish_reason == "length"``.
* A missing task or script is a record, not a crash: the reply is a final answer saying so.
  A malformed script file is bad input and raises :class:`PolicyError` naming the file.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import posixpath
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawgym_env.errors import PolicyError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams
from clawgym_env.policy.chat_format import assistant_text
from clawgym_env.task import Task

if TYPE_CHECKING:
    from clawgym_env.policy.hf import Tokenizer

NOOP_ANSWER = "I am done."
PATH_ARGS = ("path", "file_path", "absolute_path", "filePath", "filename", "file")
CONTENT_ARGS = ("content", "contents", "file_text", "text")
COMMAND_ARGS = ("command", "cmd", "script")
ABSOLUTE_ARGS = ("file_path", "absolute_path", "filePath")

# name → (kind, {role: argument name}, wants absolute paths). The offered schema's properties
# override the argument names when they disagree (see resolve_tools).
KNOWN_TOOLS: dict[str, tuple[str, dict[str, str], bool]] = {
    # the reference harness ``mini``
    "bash": ("shell", {"command": "command"}, False),
    "write_file": ("write", {"path": "path", "content": "content"}, False),
    "read_file": ("read", {"path": "path"}, False),
    # Claude Code
    "Bash": ("shell", {"command": "command"}, False),
    "Write": ("write", {"path": "file_path", "content": "content"}, True),
    "Read": ("read", {"path": "file_path"}, True),
    # OpenClaw
    "exec": ("shell", {"command": "command"}, False),
    "write": ("write", {"path": "path", "content": "content"}, False),
    "read": ("read", {"path": "path"}, False),
    # Codex (``shell`` takes an argv array in older releases)
    "exec_command": ("shell", {"command": "cmd"}, False),
    "shell": ("shell", {"command": "command"}, False),
    # Qwen Code / Gemini CLI
    "run_shell_command": ("shell", {"command": "command"}, False),
    "write_to_file": ("write", {"path": "path", "content": "content"}, False),
}
SUBMIT_SENTINELS = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",)  # mini-swe-agent
"""Harnesses whose instructions say they end only when a command prints one of these lines first (the rest of
that output is the answer): there the final answer is a shell call (see :func:`submit_command`)."""
_HEURISTIC_NAMES = {"shell": re.compile(r"bash|shell|exec|command|terminal", re.I),
                    "write": re.compile(r"write|create_file", re.I),
                    "read": re.compile(r"read|view(?!_?image)|cat", re.I)}  # an image viewer cannot read text


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """How to express one kind of step ("shell" | "write" | "read") with an offered tool."""

    name: str
    kind: str
    args: dict[str, str]  # role ("command" | "path" | "content") → argument name
    absolute: bool = False
    argv: bool = False  # the command argument is an array (``["bash", "-lc", cmd]``)


def _function_schema(tool: JSONObject) -> tuple[str | None, JSONObject]:
    fn = tool.get("function", tool) if isinstance(tool, dict) else {}
    params = fn.get("parameters") or fn.get("input_schema") or {}
    props = params.get("properties") if isinstance(params, dict) else None
    return fn.get("name"), props if isinstance(props, dict) else {}


def _pick(role: str, default: str | None, props: JSONObject) -> str | None:
    candidates = {"command": COMMAND_ARGS, "path": PATH_ARGS, "content": CONTENT_ARGS}[role]
    if not props:
        return default
    if default in props:
        return default
    return next((c for c in candidates if c in props), None)


def _spec(name: str, kind: str, defaults: dict[str, str], absolute: bool, props: JSONObject) -> ToolSpec | None:
    roles = {"shell": ("command",), "write": ("path", "content"), "read": ("path",)}[kind]
    args = {}
    for role in roles:
        arg = _pick(role, defaults.get(role), props)
        if arg is None:
            return None
        args[role] = arg
    if "path" in args:
        desc = str((props.get(args["path"]) or {}).get("description", "")).lower()
        absolute = absolute or args["path"] in ABSOLUTE_ARGS or "absolute" in desc
    argv = kind == "shell" and (props.get(args["command"]) or {}).get("type") == "array"
    return ToolSpec(name=name, kind=kind, args=args, absolute=absolute, argv=argv)


def resolve_tools(tools: list[JSONObject] | None) -> dict[str, ToolSpec]:
    """Offered OpenAI function tools → the tool to use for each step kind ("shell", "write", "read").

    Known names (:data:`KNOWN_TOOLS`) win over the name/schema heuristic; the first match wins.
    """
    known: dict[str, ToolSpec] = {}
    guessed: dict[str, ToolSpec] = {}
    for tool in tools or []:
        name, props = _function_schema(tool)
        if not isinstance(name, str):
            continue
        if name in KNOWN_TOOLS:
            kind, defaults, absolute = KNOWN_TOOLS[name]
            spec = _spec(name, kind, defaults, absolute, props)
            if spec and kind not in known:
                known[kind] = spec
            continue
        for kind, pattern in _HEURISTIC_NAMES.items():
            if kind not in guessed and pattern.search(name):
                spec = _spec(name, kind, {}, False, props) if props else None
                if spec:
                    guessed[kind] = spec
                    break
    return {**guessed, **known}


def shell_write_command(path: str, content: str) -> str:
    """A POSIX shell command writing ``content`` to ``path`` byte-exactly (base64, so no quoting hazards)."""
    payload = base64.b64encode(content.encode("utf-8")).decode("ascii")
    parent = posixpath.dirname(path)
    mkdir = f"mkdir -p {shlex.quote(parent)} && " if parent else ""
    return f"{mkdir}printf '%s' '{payload}' | base64 -d > {shlex.quote(path)}"


def _path_for(spec: ToolSpec, path: str, mount_dir: str) -> str:
    if spec.absolute and not posixpath.isabs(path):
        return posixpath.normpath(posixpath.join(mount_dir, path))
    return path


def _shell_call(spec: ToolSpec, command: str) -> tuple[str, JSONObject]:
    value: Any = ["bash", "-lc", command] if spec.argv else command
    return spec.name, {spec.args["command"]: value}


def plan_call(step: JSONObject, specs: dict[str, ToolSpec], mount_dir: str) -> tuple[str, JSONObject] | None:
    """One script step → ``(tool name, arguments)`` with the offered tools, or None if none can express it."""
    kind, shell = step.get("tool"), specs.get("shell")
    if kind == "write_file":
        if "write" in specs:
            spec = specs["write"]
            return spec.name, {spec.args["path"]: _path_for(spec, step["path"], mount_dir),
                               spec.args["content"]: step["content"]}
        return _shell_call(shell, shell_write_command(step["path"], step["content"])) if shell else None
    if kind == "read_file":
        if "read" in specs:
            spec = specs["read"]
            return spec.name, {spec.args["path"]: _path_for(spec, step["path"], mount_dir)}
        return _shell_call(shell, "cat " + shlex.quote(step["path"])) if shell else None
    if kind == "bash":
        return _shell_call(shell, step["command"]) if shell else None
    return None


def submit_command(messages: list[JSONObject], answer: str) -> str | None:
    """The shell command that submits ``answer`` when the conversation's system or user text names one of
    :data:`SUBMIT_SENTINELS` (the sentinel line, then the answer verbatim), else None."""
    for m in messages:
        if m.get("role") not in ("system", "user"):
            continue
        content = m.get("content")
        parts = content if isinstance(content, list) else [content]
        text = "".join(p if isinstance(p, str) else str(p.get("text", "")) if isinstance(p, dict) else ""
                       for p in parts)
        sentinel = next((s for s in SUBMIT_SENTINELS if s in text), None)
        if sentinel is not None:
            return f"echo {sentinel} && printf '%s' {shlex.quote(answer)}"
    return None


_REQUIRED = {"write_file": ("path", "content"), "bash": ("command",), "read_file": ("path",)}


def validate_steps(steps: Any, source: str) -> list[JSONObject]:
    """Check a script: a list of tool steps ending with ``{"final": text}``. Raises PolicyError."""
    if not isinstance(steps, list) or not steps:
        raise PolicyError(f"{source}: the script must be a non-empty list of steps ending with {{'final': text}}")
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if not isinstance(step, dict):
            raise PolicyError(f"{source}: step {i} is not an object")
        if last:
            if not isinstance(step.get("final"), str):
                raise PolicyError(f"{source}: the last step must be {{\"final\": \"answer text\"}}, got {step}")
            continue
        tool = step.get("tool")
        need = _REQUIRED.get(tool) if isinstance(tool, str) else None
        if need is None:
            raise PolicyError(f"{source}: step {i} has tool {step.get('tool')!r}; use write_file, bash or read_file")
        for field in need:
            if not isinstance(step.get(field), str):
                raise PolicyError(f"{source}: step {i} ({step['tool']}) needs a string {field!r}")
    return steps


def load_script(path: str | Path, key: str = "steps") -> list[JSONObject] | None:
    """The validated ``key`` list of a script file (a bare list is taken as the steps); None if absent."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PolicyError(f"cannot read the script {path}: {exc}") from exc
    if isinstance(data, list) and key == "steps":
        return validate_steps(data, str(path))
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: expected an object with a {key!r} list")
    if key not in data:
        return None
    return validate_steps(data[key], f"{path} [{key}]")


class ScriptedPolicy(PolicyBackend):
    """A policy that follows a script. ``mode``: ``expert`` | ``wrong`` | ``noop`` | ``file:PATH``.

    ``think=True`` adds a short ``<think>`` block to each turn (unless the prompt already closed an
    empty one, as Qwen3's template does with thinking disabled).
    """

    def __init__(self, mode: str = "expert", tokenizer: Tokenizer = None, *, think: bool = False) -> None:
        self.mode = mode
        self.think = think
        self._tokenizer = tokenizer
        self._file_steps: list[JSONObject] | None = None
        if mode.startswith("file:"):
            path = Path(mode[len("file:"):]).expanduser()
            if not path.is_file():
                raise PolicyError(f"scripted policy file {path} does not exist")
            self._file_steps = load_script(path)
            if self._file_steps is None:  # pragma: no cover - load_script returns a list or raises here
                raise PolicyError(f"{path}: no 'steps' list")
        elif mode not in ("expert", "wrong", "noop"):
            raise PolicyError(f"unknown scripted mode {mode!r}; use expert, wrong, noop or file:PATH")
        self.name = f"scripted:{mode}"
        self.version = 0

    @property
    def tokenizer(self) -> Tokenizer:
        """The real Qwen3 tokenizer, loaded on first use (the expert's turns are encoded with it)."""
        if self._tokenizer is None:
            from clawgym_env.policy.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer()
        return self._tokenizer

    def steps_for(self, task: Task | None) -> tuple[list[JSONObject] | None, str]:
        """The script for ``task`` and, when there is none, the reason (for the fallback answer)."""
        if self.mode == "noop":
            return [{"final": NOOP_ANSWER}], ""
        if self._file_steps is not None:
            return self._file_steps, ""
        key = "steps" if self.mode == "expert" else "wrong"
        if task is None:
            return None, f"No task was given, so no {self.mode} script is available; stopping without acting."
        path, task_id = task.expert_path, task.full_id
        if path is None:
            return None, f"No expert is available for task {task_id} (it ships no expert.json); stopping."
        steps = load_script(path, key)
        if steps is None:
            return None, f"No {key!r} script is available for task {task_id}; stopping."
        return steps, ""

    def decide(self, ctx: GenerationContext, prompt_ids: list[int] | None = None) -> str:
        """The assistant turn's text (``<|im_end|>`` included) for this point of the conversation."""
        steps, reason = self.steps_for(ctx.task)
        if steps is None:
            return assistant_text(reason, reasoning=self._reasoning("I cannot act.", prompt_ids))
        mount_dir = ctx.task.mount_dir if ctx.task is not None else "/"
        specs = resolve_tools(ctx.tools)
        calls = [c for c in (plan_call(s, specs, mount_dir) for s in steps[:-1]) if c is not None]
        turn = sum(1 for m in ctx.messages if m.get("role") == "assistant")
        if turn < len(calls):
            name, args = calls[turn]
            thought = f"Step {turn + 1} of {len(calls)}: call {name}."
            return assistant_text("", reasoning=self._reasoning(thought, prompt_ids), tool_calls=[(name, args)])
        final = steps[-1]["final"]
        submit = submit_command(ctx.messages, final) if "shell" in specs else None
        if submit is not None:  # the harness ends only on its submit command: the answer goes through it
            return assistant_text("", reasoning=self._reasoning("The work is done; I will submit.", prompt_ids),
                                  tool_calls=[_shell_call(specs["shell"], submit)])
        return assistant_text(final, reasoning=self._reasoning("The work is done; I will answer.", prompt_ids))

    def _reasoning(self, thought: str, prompt_ids: list[int] | None) -> str | None:
        if not self.think:
            return None
        if prompt_ids and self.tokenizer.decode(list(prompt_ids[-8:])).endswith("</think>\n\n"):
            return None  # the template already closed an (empty) think block: thinking is off
        return thought

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """The scripted turn (:meth:`decide`) as Qwen3 ids, cut at ``params.max_tokens`` (then
        ``finish_reason="length"``); logprobs are 0 (the script is deterministic)."""
        text = self.decide(ctx, prompt_ids)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        finish = "stop"
        if params.max_tokens is not None and len(ids) > params.max_tokens:
            ids, finish = ids[: max(int(params.max_tokens), 0)], "length"
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish,
                          policy_version=self.version)
