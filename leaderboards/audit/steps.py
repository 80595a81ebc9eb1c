"""An adversary's actions as scripted steps: the :class:`AuditScript` record and shell helpers.

An :class:`AuditScript` is what :class:`~leaderboards.audit.policy.AuditPolicy` plays in one episode:
tool steps in the scripted-policy format (``{"tool": "bash", "command"}``, ``{"tool": "write_file",
"path", "content"}``, ``{"tool": "read_file", "path"}``) and a final answer. Adversaries write many
files in one ``bash`` step (one model turn, whatever the harness's turn limit): :func:`write_command`
writes one file byte-exactly, as a quoted here-document when the content is plain text (cheap in
tokens) and as base64 otherwise.
"""

from __future__ import annotations

import base64
import dataclasses
import posixpath
import shlex
from typing import Any

from clawgym_env.policy.scripted import NOOP_ANSWER

HEREDOC_END = "CLAWGYM_AUDIT_EOF"


@dataclasses.dataclass(frozen=True)
class AuditScript:
    """Tool steps then a final answer. ``final=None``: the answer is the last tool result the harness
    returned (its ``exit code: N`` line left out), so a replayed solution reports what it computed."""

    steps: tuple[dict[str, Any], ...] = ()
    final: str | None = NOOP_ANSWER

    def as_steps(self) -> list[dict[str, Any]]:
        """The scripted-policy step list (a JSON file of it plays the same with ``scripted:file:PATH``;
        an adaptive final is written as the do-nothing answer there)."""
        return [*self.steps, {"final": self.final if self.final is not None else NOOP_ANSWER}]


NOOP = AuditScript()
"""The do-nothing agent: no tool call, the answer ``I am done.`` (as ``scripted:noop``)."""


def bash(command: str) -> dict[str, Any]:
    """One ``bash`` step."""
    return {"tool": "bash", "command": command}


def write_command(path: str, data: bytes | str, *, mode: str | None = None) -> str:
    """Shell lines writing ``data`` to the workspace path ``path`` byte-exactly (folders made first),
    then ``chmod mode`` when given."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    q = shlex.quote(path)
    parent = posixpath.dirname(path)
    lines = [f"mkdir -p {shlex.quote(parent)}"] if parent else []
    text = None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if (text is not None and text.endswith("\n") and "\x00" not in text and "\r" not in text
            and HEREDOC_END not in text):
        lines.append(f"cat > {q} <<'{HEREDOC_END}'\n{text}{HEREDOC_END}")
    else:
        payload = base64.b64encode(raw).decode("ascii")
        lines.append(f"printf '%s' '{payload}' | base64 -d > {q}")
    if mode:
        lines.append(f"chmod {mode} {q}")
    return "\n".join(lines) + "\n"


def script_lines(*parts: str) -> str:
    """Shell fragments joined as one script (each ends a line; a failed line never stops the next)."""
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts if p)
