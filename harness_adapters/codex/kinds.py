"""How Codex marks its own calls: every request says what it is for in a header Codex writes.

Evidence (captured from the pinned release, ``codex exec`` through the proxy, Responses dialect): each request
carries ``x-codex-turn-metadata``, a JSON object with (among others) ``request_kind`` and ``agent_name``:

* **Main agent**: ``request_kind = "turn"``, ``agent_name = "/root"``.
* **Compaction** (auto-compact with a small ``model_auto_compact_token_limit``): Codex does not fall back to a
  Responses compaction endpoint here; it sends an ordinary request on the same route with
  ``request_kind = "compaction"`` (and a ``compaction`` object: trigger, reason, phase), no tools, the history
  plus a final user message asking for a handoff summary. The main agent then goes on in a new context window
  (``window_number`` + 1) opened by that summary.
* **Subagents** (``multi_agent_v1``): offered as a namespace tool, which the proxy does not put in the policy's
  template, so no subagent call was seen; a request whose ``agent_name`` is not ``/root`` is left to the
  structural default.
* **Side calls**: none seen in ``exec`` mode.

Invariants: :func:`codex_kinds` never raises and answers for every call; it reads only the header (the model
cannot set request headers); a missing or malformed header leaves the call to the structural default (None).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import KindVerdict, verdicts_per_call
from clawgym_env.jsontypes import JSONObject

METADATA_HEADER = "x-codex-turn-metadata"
ROOT_AGENT = "/root"


def turn_metadata(headers: Mapping[str, Any] | None) -> JSONObject | None:
    """The parsed ``x-codex-turn-metadata`` header, or None when absent or not a JSON object."""
    if not isinstance(headers, Mapping):
        return None
    raw = next((v for k, v in headers.items() if isinstance(k, str) and k.lower() == METADATA_HEADER), None)
    if not isinstance(raw, str) or len(raw) > 64_000:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def codex_kind(call: CallRecord) -> KindVerdict:
    """The kind of one Codex call, with its evidence (see the module doc)."""
    meta = turn_metadata(call.headers)
    if meta is None:
        return None
    kind, agent = meta.get("request_kind"), meta.get("agent_name")
    if kind == "compaction":
        how = meta.get("compaction")
        trigger = f" ({how.get('trigger')}, {how.get('reason')})" if isinstance(how, dict) else ""
        return "compaction", f"{METADATA_HEADER} request_kind=compaction{trigger}"[:200]
    if kind == "turn" and agent == ROOT_AGENT:
        return "main", f"{METADATA_HEADER} request_kind=turn, agent_name={ROOT_AGENT}"
    return None


def codex_kinds(calls: Sequence[CallRecord]) -> list[KindVerdict]:
    """Per call, :func:`codex_kind`; a call it cannot read is left to the default (None). Never raises."""
    return verdicts_per_call(calls, codex_kind)
