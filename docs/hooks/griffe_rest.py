"""Griffe extension for the API reference: this project's reST-flavoured docstrings as Markdown.

The docstrings are prose (no Google/NumPy sections), rendered by mkdocstrings as Markdown
(``docstring_style: null``). Four reST habits would show literally, so they are rewritten on the
docstring's text when Griffe loads it (the source files are not touched):

* simple reST tables (``=====  =====`` borders) become Markdown tables;
* roles such as ``:class:`Task``` or ``:func:`~pkg.mod.fn``` become code spans (```Task```, ```fn```);
* a paragraph ending in ``::`` (a reST literal block follows) ends in ``:`` instead;
* ``<name>`` placeholders outside code spans are escaped, so Markdown does not take them for HTML tags.

Code spans (````code```` and ```code```) are left as they are: Markdown reads both the same way.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"(?<=\S)::$", re.M)
_SPAN = re.compile(r"(``.+?``|`[^`\n]+`)", re.S)
_TAG = re.compile(r"<(/?[A-Za-z][^<>\n]*)>")
_FENCE = re.compile(r"^(\s*)(```|~~~)")
_BORDER = re.compile(r"^\s*=+(?:\s+=+)+\s*$")


def _cells(line: str, starts: list[int]) -> list[str]:
    bounds = [*starts[1:], None]
    return [line[a:b].strip() for a, b in zip(starts, bounds)]


def _table(lines: list[str]) -> list[str]:
    """A simple reST table (its lines, borders included) as Markdown table lines."""
    border = lines[0]
    starts = [m.start() for m in re.finditer(r"=+", border)]
    seps = [i for i, line in enumerate(lines) if _BORDER.match(line)]
    header_lines, body_lines = lines[seps[0] + 1:seps[1]], lines[seps[1] + 1:seps[-1]]

    def rows(block: list[str]) -> list[list[str]]:
        out: list[list[str]] = []
        for line in block:
            if not line.strip():
                continue
            cells = _cells(line, starts)
            if out and (not cells[0] or not any(cells[1:])):  # a continuation line: it joins the row above
                out[-1] = [f"{a} {b}".strip() for a, b in zip(out[-1], cells)]
            else:
                out.append(cells)
        return out

    def md(cells: list[str]) -> str:
        return "| " + " | ".join(_ROLE.sub(_role, c).replace("|", "\\|") for c in cells) + " |"

    head = rows(header_lines) or [[""] * len(starts)]
    out = [md(head[0]), "|" + "---|" * len(starts)]
    out += [md(r) for r in head[1:] + rows(body_lines)]
    return out


def _tables(text: str) -> str:
    """Every simple reST table of ``text`` (top border, header, border, rows, bottom border) as Markdown."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if _BORDER.match(lines[i]):
            borders = [j for j in range(i, len(lines)) if _BORDER.match(lines[j])][:3]
            if len(borders) == 3:
                out += ["", *_table(lines[i:borders[2] + 1]), ""]
                i = borders[2] + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def _role(m: re.Match[str]) -> str:
    target = m.group(1).strip()
    if "<" in target and target.endswith(">"):  # :class:`title <target>`
        target = target.split("<", 1)[0].strip()
    return f"``{target}``"


def _prose(text: str) -> str:
    """Escape ``<...>`` outside code spans of one paragraph-ish chunk."""
    parts = _SPAN.split(text)
    return "".join(p if i % 2 else _TAG.sub(r"&lt;\1&gt;", p) for i, p in enumerate(parts))


def rewrite(text: str) -> str:
    """The docstring ``text`` with roles, literal-block markers and bare tags made Markdown-safe."""
    text = _tables(text)
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(":", text)
    out, in_fence = [], False
    blocks = re.split(r"(\n\s*\n)", text)
    for block in blocks:
        lines = block.splitlines(keepends=True)
        if any(_FENCE.match(line) for line in lines):
            in_fence = in_fence ^ (sum(1 for line in lines if _FENCE.match(line)) % 2 == 1)
            out.append(block)
            continue
        indented = bool(lines) and all(line.startswith("    ") or not line.strip() for line in lines)
        out.append(block if in_fence or indented else _prose(block))
    return "".join(out)


class ReSTRoles(griffe.Extension):
    """Rewrites every loaded docstring with :func:`rewrite`."""

    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring as it is created."""
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
