"""example-agent: a small tool-using agent that speaks OpenAI chat completions over plain HTTP.

It runs as its own process inside the sandbox and imports nothing but the standard library (no client
SDK, nothing of ClawGym), so any Python the sandbox can see runs it. Tools: ``shell`` (run a command in
the workspace), ``write`` and ``read`` (a file by path relative to the workspace). The loop ends when the
model answers without a tool call (that text is the final answer) or after ``--max-turns`` turns.

It speaks one of two wires: ``chat`` (OpenAI chat completions, ``POST {base}/chat/completions``) or
``example`` (this package's own dialect, :mod:`clawgym_example_plugins.dialect`: ``POST {root}/example/v1/turn``,
where ``root`` is the base URL without ``/v1``). The conversation is kept in chat shape and converted per call.

Usage: ``python3 agent.py --base-url URL --model NAME --task-file F [--max-turns N] [--wire chat|example]``
(API key from ``OPENAI_API_KEY``). The last stdout line is
``{"type": "final", "final_message": str | null, "turns": int}``.
Exit codes: 0 final answer given, 3 turn limit reached, 2 the model API failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

JSONObject = dict[str, Any]
"""A JSON object on the wire (the agent runs alone in the sandbox and imports nothing of ClawGym)."""

SYSTEM = ("You are example-agent. Work in the current directory (the task workspace) with the tools; when the "
          "task is done, reply with a short final answer and no tool call.")
TOOLS: list[JSONObject] = [
    {"type": "function", "function": {
        "name": "shell", "description": "Run a shell command in the workspace; returns its exit code and output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "write", "description": "Write a text file (path relative to the workspace).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "read", "description": "Read a text file (path relative to the workspace).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]
MAX_OUTPUT = 8000


def run_tool(name: str, raw_args: str) -> str:
    """One tool call's result as text; a bad call is an error message for the model, never a crash."""
    try:
        args = json.loads(raw_args or "{}")
        if name == "shell":
            done = subprocess.run(["bash", "-c", str(args["command"])], capture_output=True, timeout=60)
            out = (done.stdout + done.stderr).decode("utf-8", errors="replace")
            return f"exit code {done.returncode}\n{out[-MAX_OUTPUT:]}"
        if name == "write":
            path = Path(str(args["path"]))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(str(args["content"]), encoding="utf-8")
            return f"wrote {len(str(args['content']))} characters to {path}"
        if name == "read":
            return Path(str(args["path"])).read_text(encoding="utf-8", errors="replace")[:MAX_OUTPUT]
        return f"error: unknown tool {name!r}; the tools are shell, write and read"
    except Exception as exc:  # noqa: BLE001 - the model sees its tool error as text and goes on
        return f"error: {type(exc).__name__}: {exc}"


def post(url: str, api_key: str, body: JSONObject) -> Any:
    """POST ``body`` as JSON and return the response's JSON."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def ask_chat(base_url: str, api_key: str, model: str, messages: list[JSONObject]) -> JSONObject:
    """One call on the ``chat`` wire; returns the assistant message (chat shape)."""
    reply = post(f"{base_url.rstrip('/')}/chat/completions", api_key,
                 {"model": model, "messages": messages, "tools": TOOLS})
    return reply["choices"][0]["message"]


def ask_example(base_url: str, api_key: str, model: str, messages: list[JSONObject]) -> JSONObject:
    """One call on the ``example`` wire: the chat-shaped conversation as turns, the answer back in chat shape."""
    turns: list[JSONObject] = []
    for m in messages:
        if m["role"] == "tool":
            turns.append({"from": "tool", "call_id": m["tool_call_id"], "text": m["content"]})
            continue
        turn: JSONObject = {"from": {"assistant": "agent"}.get(m["role"], m["role"]), "text": m.get("content")}
        turn["calls"] = [{"id": c["id"], "tool": c["function"]["name"], "args": c["function"]["arguments"]}
                         for c in m.get("tool_calls") or []]
        turns.append(turn)
    tools = [{"name": t["function"]["name"], "about": t["function"]["description"],
              "params": t["function"]["parameters"]} for t in TOOLS]
    root = base_url.rstrip("/").removesuffix("/v1")
    answer = post(f"{root}/example/v1/turn", api_key, {"model": model, "turns": turns, "tools": tools})["turn"]
    calls = [{"id": c["id"], "type": "function", "function": {"name": c["tool"], "arguments": c["args"]}}
             for c in answer.get("calls") or []]
    return {"role": "assistant", "content": answer.get("text"), **({"tool_calls": calls} if calls else {})}


def main() -> int:
    """Run the loop (module docstring); returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", default="clawgym-policy")
    ap.add_argument("--task-file", required=True)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--wire", choices=("chat", "example"), default="chat")
    args = ap.parse_args()
    ask = ask_example if args.wire == "example" else ask_chat
    messages: list[JSONObject] = [{"role": "system", "content": SYSTEM},
                                         {"role": "user", "content": Path(args.task_file).read_text("utf-8")}]
    final, code, turns = None, 3, 0
    while turns < args.max_turns:
        turns += 1
        try:
            message = ask(args.base_url, os.environ.get("OPENAI_API_KEY", "none"), args.model, messages)
        except (urllib.error.URLError, OSError, KeyError, IndexError, TypeError, ValueError) as exc:
            print(f"model API error: {exc}", file=sys.stderr)
            final, code = None, 2
            break
        calls = message.get("tool_calls") or []
        messages.append({"role": "assistant", "content": message.get("content"),
                         **({"tool_calls": calls} if calls else {})})
        if not calls:
            final, code = message.get("content"), 0
            break
        for call in calls:
            fn = call.get("function") or {}
            messages.append({"role": "tool", "tool_call_id": call.get("id"),
                             "content": run_tool(str(fn.get("name")), str(fn.get("arguments") or "{}"))})
    print(json.dumps({"type": "final", "final_message": final, "turns": turns}))
    return code


if __name__ == "__main__":
    sys.exit(main())
