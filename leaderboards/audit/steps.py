"""An adversary's actions as scripted steps: the :class:`AuditScript` record and shell helpers.

An :class:`AuditScript` is what :class:`~leaderboards.audit.policy.AuditPolicy` plays in one episode:
tool steps in the scripted-policy format (``{"tool": "bash", "command"}``, ...) and a final answer.

Adversaries write many files through a few ``bash`` steps. A step is one model answer, and harnesses
cap an answer's tokens (``mini``: 4,096), so a command is built from self-contained *fragments* (each a
complete piece of shell, no state shared between them) that :func:`bash_steps` packs into steps of at
most :data:`STEP_CHARS` characters of text — base64, which tokenises about three times worse, weighs
three times its length. :func:`write_fragments` writes one file byte-exactly: plain text as quoted
here-documents or ``printf`` (cheap in tokens), bytes that are not UTF-8 text as base64, a large file
in pieces appended in order.
"""

from __future__ import annotations

import base64
import dataclasses
import posixpath
import shlex

from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.scripted import NOOP_ANSWER

HEREDOC_END = "CLAWGYM_AUDIT_EOF"
STEP_CHARS = 6000
"""Characters of shell text per step at most (about 2,000 tokens: half of ``mini``'s answer cap)."""
PIECE_CHARS = 4000
"""Characters of file content per fragment at most."""


@dataclasses.dataclass(frozen=True)
class AuditScript:
    """Tool steps then a final answer. ``final=None``: the answer is the last tool result the harness
    returned (its ``exit code: N`` line left out), so a replayed solution reports what it computed."""

    steps: tuple[JSONObject, ...] = ()
    final: str | None = NOOP_ANSWER

    def as_steps(self) -> list[JSONObject]:
        """The scripted-policy step list (a JSON file of it plays the same with ``scripted:file:PATH``;
        an adaptive final is written as the do-nothing answer there)."""
        return [*self.steps, {"final": self.final if self.final is not None else NOOP_ANSWER}]


NOOP = AuditScript()
"""The do-nothing agent: no tool call, the answer ``I am done.`` (as ``scripted:noop``)."""


def bash(command: str) -> JSONObject:
    """One ``bash`` step."""
    return {"tool": "bash", "command": command}


def _weight(fragment: str) -> int:
    return len(fragment) * (3 if "| base64 -d" in fragment else 1)


def _text_pieces(text: str) -> list[str]:
    pieces, cur = [], ""
    for line in text.splitlines(keepends=True):
        while len(line) > PIECE_CHARS:  # one very long line: cut it
            if cur:
                pieces.append(cur)
                cur = ""
            pieces.append(line[:PIECE_CHARS])
            line = line[PIECE_CHARS:]
        if len(cur) + len(line) > PIECE_CHARS:
            pieces.append(cur)
            cur = ""
        cur += line
    return pieces + ([cur] if cur else [])


def write_fragments(path: str, data: bytes | str, *, mode: str | None = None) -> list[str]:
    """Shell fragments writing ``data`` to the workspace path ``path`` byte-exactly, in order (folders made
    first, ``chmod mode`` last when given)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    q = shlex.quote(path)
    parent = posixpath.dirname(path)
    head = f"mkdir -p {shlex.quote(parent)}\n" if parent else ""
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    out: list[str] = []
    if not raw:
        out.append(f": > {q}\n")
    elif text is None or "\x00" in text:
        payload = base64.b64encode(raw).decode("ascii")
        size = PIECE_CHARS // 3 // 4 * 4
        for i in range(0, len(payload), size):
            out.append(f"printf '%s' '{payload[i:i + size]}' | base64 -d {'>' if i == 0 else '>>'} {q}\n")
    else:
        for i, piece in enumerate(_text_pieces(text)):
            redirect = ">" if i == 0 else ">>"
            if piece.endswith("\n") and "\r" not in piece and HEREDOC_END not in piece:
                out.append(f"cat {redirect} {q} <<'{HEREDOC_END}'\n{piece}{HEREDOC_END}\n")
            else:
                out.append(f"printf '%s' {shlex.quote(piece)} {redirect} {q}\n")
    out[0] = head + out[0]
    if mode:
        out[-1] += f"chmod {mode} {q}\n"
    return out


def write_command(path: str, data: bytes | str, *, mode: str | None = None) -> str:
    """:func:`write_fragments` as one piece of shell."""
    return "".join(write_fragments(path, data, mode=mode))


def script_lines(*parts: str) -> str:
    """Shell fragments joined as one script (each ends a line; a failed line never stops the next)."""
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts if p)


def bash_steps(*fragments: str, budget: int = STEP_CHARS) -> tuple[JSONObject, ...]:
    """The fragments packed, in order, into as few ``bash`` steps as fit ``budget`` each (a fragment is
    never split; one larger than the budget gets a step of its own)."""
    steps, cur, weight = [], "", 0
    for fragment in fragments:
        if not fragment:
            continue
        fragment = fragment if fragment.endswith("\n") else fragment + "\n"
        w = _weight(fragment)
        if cur and weight + w > budget:
            steps.append(bash(cur))
            cur, weight = "", 0
        cur += fragment
        weight += w
    if cur:
        steps.append(bash(cur))
    return tuple(steps)
