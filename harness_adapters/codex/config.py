"""Codex's ``config.toml`` for one episode, and reading ``codex exec --json`` events.

The config points a custom model provider at the episode's base URL with the Responses wire API
(the only one Codex still accepts), turns off approvals (our bubblewrap sandbox is the sandbox, so
Codex's own is ``danger-full-access``), analytics, the update check, plugins/apps, and its own
retries (a failed call is recorded once, never silently replayed).

Invariants:
  * :func:`render_toml` emits only top-level scalars and one level of tables, strings as TOML basic
    strings (JSON string escapes are valid TOML); it rejects values it cannot express;
  * :func:`parse_events` never raises: non-JSON lines are skipped; the final answer is the text of
    the last completed ``agent_message`` item of a turn that did not fail, else ``None``.
"""

from __future__ import annotations

import json
from typing import Any

from clawgym_env.errors import HarnessError
from clawgym_env.jsontypes import JSONObject

PROVIDER = "clawgym"
KEY_ENV = "CLAWGYM_CODEX_API_KEY"


def codex_config(base_url: str, model: str, *, context_window: int | None = None,
                 extra: JSONObject | None = None) -> JSONObject:
    """The config as a dict: ``{key: scalar, table: {key: scalar}}`` (``extra`` merged on top)."""
    cfg: JSONObject = {
        "model": model,
        "model_provider": PROVIDER,
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "check_for_update_on_startup": False,
        "analytics": {"enabled": False},
        "features": {"plugins": False, "apps": False},
        f"model_providers.{PROVIDER}": {
            "name": PROVIDER, "base_url": base_url, "env_key": KEY_ENV, "wire_api": "responses",
            "request_max_retries": 0, "stream_max_retries": 0,
        },
    }
    if context_window:
        cfg["model_context_window"] = int(context_window)
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def _scalar(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v, where) for v in value) + "]"
    raise HarnessError(f"codex config value at {where} has unsupported type {type(value).__name__}; "
                       "use strings, numbers, booleans or lists of them")


def render_toml(cfg: JSONObject) -> str:
    """``cfg`` as TOML: scalars first, then one ``[table]`` per dict value (dotted names allowed)."""
    lines = [f"{k} = {_scalar(v, k)}" for k, v in cfg.items() if not isinstance(v, dict)]
    for table, body in cfg.items():
        if isinstance(body, dict):
            lines += ["", f"[{table}]"]
            lines += [f"{k} = {_scalar(v, f'{table}.{k}')}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def parse_events(stdout: str) -> tuple[str | None, list[JSONObject], JSONObject]:
    """``(final answer or None, transcript, summary)`` from ``codex exec --json`` stdout.

    The transcript is the completed items in order (``agent_message``, ``reasoning``,
    ``command_execution``, ``file_change``, ``error``...) plus ``turn.failed``/``error`` events as
    ``{"type": "error", "message": ...}``. ``summary`` has ``thread_id``, ``usage`` and ``failed``.
    """
    final: str | None = None
    transcript: list[JSONObject] = []
    summary: JSONObject = {"failed": False}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict):
            continue
        kind = ev.get("type")
        if kind == "thread.started":
            summary["thread_id"] = ev.get("thread_id")
        elif kind == "item.completed" and isinstance(ev.get("item"), dict):
            item = ev["item"]
            transcript.append(item)
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                final = item["text"]
        elif kind == "turn.completed":
            summary["usage"] = ev.get("usage")
        elif kind in ("turn.failed", "error"):
            err = ev.get("error") if kind == "turn.failed" else ev
            message = err.get("message") if isinstance(err, dict) else str(err)
            transcript.append({"type": "error", "message": message})
            if kind == "turn.failed":
                summary["failed"] = True
                final = None
    return final, transcript, summary
