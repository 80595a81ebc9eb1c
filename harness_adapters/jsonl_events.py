"""Reading a harness's JSON-lines output: one JSON event per stdout line, anything else passed over.

Several harnesses print their run as JSON events, one per line (OpenCode, pi, Qwen Code, Claude Code), mixed
with what else reaches stdout (a warning, a crash trace, a tail cut mid-line). Each adapter's own module says
what its events mean; this one only finds them.

Invariants: neither function raises on any text (None reads as empty); a line counts only when, stripped of
surrounding white space, it opens with ``{`` and parses as one JSON object; lines keep their order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from clawgym_env.jsontypes import JSONObject


def json_objects(stdout: str | None) -> Iterator[JSONObject]:
    """The JSON objects on ``stdout``, one per line, in order, skipping every other line."""
    for line in (stdout or "").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            yield obj


def typed_events(stdout: str | None) -> list[JSONObject]:
    """The JSON object lines of ``stdout`` that carry a string ``type`` (the event's name), in order."""
    return [obj for obj in json_objects(stdout) if isinstance(obj.get("type"), str)]
