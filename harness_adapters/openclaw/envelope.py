"""Reading the ``openclaw agent exec --json`` envelope from a finished process's stdout.

The envelope is one JSON object (``ok``, ``status``, ``final``, ``payloads``, ``usage``,
``assistantTurns``, ``toolSummary``, ``model``, ``provider``, ``sessionId``; failed runs add
``error: {message, kind}``). OpenClaw reserves stdout for it under ``--json``, but anything else a
plugin prints there is tolerated: the last top-level JSON object carrying ``status`` wins.

Invariant: :func:`parse_envelope` never raises; the final answer is the envelope's non-empty
``final`` string of a run whose status is ``ok``, else None.
"""

from __future__ import annotations

import json

from clawgym_env.harness import HarnessOutput
from clawgym_env.jsontypes import JSONObject


def find_envelope(stdout: str) -> JSONObject | None:
    """The last JSON object in ``stdout`` that looks like an agent-exec envelope (has ``status``)."""
    decoder = json.JSONDecoder()
    found = None
    i = stdout.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(stdout, i)
        except ValueError:
            i = stdout.find("{", i + 1)
            continue
        if isinstance(obj, dict) and "status" in obj:
            found = obj
        i = stdout.find("{", end)
    return found


def parse_envelope(stdout: str) -> HarnessOutput:
    """Final answer and a transcript (the assistant payloads, then the envelope's run summary)."""
    env = find_envelope(stdout or "")
    if env is None:
        return HarnessOutput(final_message=None)
    transcript: list[JSONObject] = []
    for p in env.get("payloads") or []:
        if isinstance(p, dict) and isinstance(p.get("text"), str):
            transcript.append({"role": "assistant", "content": p["text"]})
    keys = ("status", "assistantTurns", "toolSummary", "usage", "model", "provider", "sessionId", "error")
    summary: JSONObject = {k: env.get(k) for k in keys if k in env}
    transcript.append({"role": "harness", "type": "openclaw_summary", **summary})
    final = env.get("final")
    ok = env.get("status") == "ok" and env.get("ok", True) is not False
    if not ok or not isinstance(final, str) or not final.strip():
        final = None
    return HarnessOutput(final_message=final, transcript=transcript)
