"""mini: ClawGym's reference harness — a small, honest agent loop.

It runs as its own process inside the sandbox and talks to the model only over HTTP with the
official ``openai`` client: the same black-box contract as the real harnesses. Tools: ``bash``
(run a shell command in the workspace), ``read_file`` and ``write_file``. The loop ends when the
model answers without a tool call (that text is the final answer) or at the turn limit. Command
output and files that are not UTF-8 reach the model with replacement characters (U+FFFD), and a
tool's error is text: no output and no argument can end the episode.

Usage: ``python3 agent.py --base-url URL --model NAME --instruction-file F [--max-turns N] [--stream]``
(API key from ``OPENAI_API_KEY``). The last stdout line is a JSON object
``{"type": "final", "final_message": str | null, "turns": int, "transcript": [...]}``.
Exit codes: 0 final answer given, 3 turn limit reached, 2 model API error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: A JSON object on the model API's wire (``clawgym_env.jsontypes.JSONObject``, spelled out: this script runs
#: in the sandbox as its own process, importing nothing of the library).
JSONObject = dict[str, Any]

SYSTEM_PROMPT = (
    "You are mini, a careful software agent working in a Linux shell. Your current working directory is "
    "the task workspace; all relative paths refer to it. Use the tools to inspect and change files and to "
    "run commands. When the task is complete, reply with your final answer as plain text and no tool call."
)
TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a bash command in the workspace; returns exit code and output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file (path relative to the workspace).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file",
        "description": "Write a text file, creating parent folders (path relative to the workspace).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
]
MAX_OUTPUT = 16_000


def _clip(text: str) -> str:
    return text if len(text) <= MAX_OUTPUT else text[:MAX_OUTPUT // 2] + "\n[...clipped...]\n" + text[-MAX_OUTPUT // 2:]


def _text(data: bytes) -> str:
    """Command output as text: bytes that are not UTF-8 become U+FFFD (a binary ``cat`` is fine);
    line ends are translated as a text-mode pipe does (``\\r\\n`` and ``\\r`` become ``\\n``)."""
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def run_tool(name: str, raw_args: str, cmd_timeout: float) -> str:
    """Run one tool call and return its result text (errors become text, never exceptions); the
    text is always valid UTF-8 (a lone surrogate from the model's arguments is replaced), so it
    can go back to the model."""
    out = _run_tool(name, raw_args, cmd_timeout)
    return out.encode("utf-8", errors="replace").decode("utf-8")


def _run_tool(name: str, raw_args: str, cmd_timeout: float) -> str:
    try:
        args = json.loads(raw_args or "{}")
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
    except ValueError as exc:
        return f"error: invalid arguments: {exc}"
    try:
        if name == "bash":
            proc = subprocess.run(["bash", "-c", str(args["command"])], capture_output=True, timeout=cmd_timeout)
            return _clip(f"exit code: {proc.returncode}\n{_text(proc.stdout)}{_text(proc.stderr)}")
        if name == "read_file":
            return _clip(Path(args["path"]).read_text(errors="replace"))
        if name == "write_file":
            path = Path(args["path"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(str(args["content"]))
            return f"wrote {len(str(args['content']))} characters to {path}"
        return f"error: unknown tool {name!r}; available: bash, read_file, write_file"
    except KeyError as exc:
        return f"error: missing argument {exc}"
    except subprocess.TimeoutExpired:
        return f"error: command timed out after {cmd_timeout:.0f} s"
    except (OSError, ValueError) as exc:  # ValueError: e.g. a path or content the file system cannot encode
        return f"error: {exc}"


def _complete(client, model: str, messages: list, stream: bool):
    """One model call; returns (content, tool_calls as plain dicts)."""
    if not stream:
        msg = client.chat.completions.create(model=model, messages=messages, tools=TOOLS).choices[0].message
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                 for c in (msg.tool_calls or [])]
        return msg.content or "", calls
    content = ""
    slots: dict[int, JSONObject] = {}
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True,
                                                stream_options={"include_usage": True}):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            slot = slots.setdefault(tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            slot["id"] = tc.id or slot["id"]
            if tc.function is not None:
                slot["function"]["name"] += tc.function.name or ""
                slot["function"]["arguments"] += tc.function.arguments or ""
    return content, [slots[i] for i in sorted(slots)]


def main(argv: list[str] | None = None) -> int:
    """The agent loop; prints the final JSON line and returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", default="clawgym-policy")
    ap.add_argument("--instruction-file", required=True)
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--command-timeout", type=float, default=120.0)
    ap.add_argument("--stream", action="store_true")
    args = ap.parse_args(argv)

    from openai import OpenAI  # imported late so --help works without it

    client = OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=0)
    task = Path(args.instruction_file).read_text()
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}]
    final, code = None, 3
    for turn in range(1, args.max_turns + 1):  # noqa: B007 - read after the loop: the turns used
        try:
            content, calls = _complete(client, args.model, messages, args.stream)
        except Exception as exc:  # noqa: BLE001 - the harness reports any API failure and stops
            print(f"mini: model call failed: {exc}", file=sys.stderr)
            code = 2
            break
        msg: dict = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        messages.append(msg)
        if not calls:
            final, code = content, 0
            break
        for call in calls:
            out = run_tool(call["function"]["name"], call["function"]["arguments"], args.command_timeout)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
    print(json.dumps({"type": "final", "final_message": final, "turns": turn, "transcript": messages[1:]}))
    return code


if __name__ == "__main__":
    sys.exit(main())
