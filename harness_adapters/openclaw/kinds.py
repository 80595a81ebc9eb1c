"""How OpenClaw marks its own calls: the main agent's turns and its compaction (summary) calls.

Evidence (captured from the pinned release, ``openclaw agent exec`` through the proxy, OpenAI chat dialect):

* **Main agent**: the first message is the system prompt OpenClaw writes, opening with
  :data:`MAIN_MARK` (an HTML comment naming the attempt) and ``You are a personal assistant running inside
  OpenClaw``; the agent's tools are offered.
* **Compaction** (when a prompt outgrows the context: the proxy refused it as too long, or usage crossed
  ``contextWindow`` minus the reserve): a separate request whose system prompt opens with
  :data:`SUMMARY_OPENING`, offering no tools, with one user message holding the serialised conversation. After
  it the main agent goes on with the summary in place of the older turns.
* **Subagents** (``sessions_spawn``): not reachable headless. ``agent exec`` runs without a gateway and the spawn
  fails (``published reply runtime missing``), so no subagent call was seen; such calls are left to the
  structural default.
* **Side calls**: none seen.
* **A retry after an aborted request** (``models.providers.<id>.timeoutSeconds`` expired): not the same
  request again. Every agent request ends with a transient user message (:data:`INTERNAL_CONTEXT_OPENING`,
  dropped from the next request); the retry sends the interrupted request's messages without it, then a user
  note (``[<time>] <turn_aborted>`` ... ``</turn_aborted>``, :data:`ABORTED_OPENING`), a "Continue the current
  task ..." user turn and a fresh transient message. The abandoned answer is in no later request.
  :func:`openclaw_discarded` marks the abandoned call dead (its ``discarded_by``).

Invariants: :func:`openclaw_kinds` never raises and answers for every call; it reads only the system message at
position 0 and whether tools are offered (OpenClaw writes both; what a model says lands in later messages).
A call matching neither shape is left to the structural default (None). The Anthropic dialect's ``system``
field is read the same way.

:func:`openclaw_discarded` never raises and marks call ``X`` as retried by call ``Y`` only when all hold: both
are agent calls (:func:`openclaw_kind` says ``main``); ``Y`` started after ``X``; ``Y``'s messages (its
transient last message aside) are ``X``'s messages (ditto) followed only by plain user text messages, one of
which opens with the aborted note; and no call's messages hold ``X``'s messages followed by anything but plain
user text (nothing went on from an answer to ``X``). A model's words reach requests only as assistant messages
and tool results, never as plain user text, so a model cannot forge the note.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from clawgym_env.capture.records import CallRecord
from clawgym_env.harness import KindVerdict, verdicts_per_call

MAIN_MARK = "<!-- openclaw:attempt:"
MAIN_OPENING = "You are a personal assistant running inside OpenClaw."
SUMMARY_OPENING = "You are a context summarization assistant."
INTERNAL_CONTEXT_OPENING = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
"""Opens the transient user message OpenClaw appends to every agent request (and drops from the next one)."""
ABORTED_OPENING, ABORTED_CLOSING = "<turn_aborted>", "</turn_aborted>"
"""The note OpenClaw inserts (after a ``[<time>] `` stamp) when it retries an interrupted turn."""
_STAMP = re.compile(r"\[[^\]\n]{1,64}\] ")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, Mapping) and isinstance(b.get("text"), str))
    return ""


def system_prompt(request: Mapping[str, Any]) -> str | None:
    """The system prompt OpenClaw sent: the first message when it is ``system``/``developer`` (chat), the
    ``system`` field (Anthropic) or ``instructions`` (Responses); None when there is none."""
    for key in ("system", "instructions"):
        if request.get(key):
            return _text(request[key])
    for key in ("messages", "input"):
        items = request.get(key)
        if isinstance(items, list) and items and isinstance(items[0], Mapping) \
                and items[0].get("role") in ("system", "developer"):
            return _text(items[0].get("content"))
    return None


def openclaw_kind(call: CallRecord) -> KindVerdict:
    """The kind of one OpenClaw call, with its evidence (see the module doc)."""
    request = call.request if isinstance(call.request, Mapping) else {}
    system = system_prompt(request)
    if system is None:
        return None
    tools = request.get("tools")
    has_tools = isinstance(tools, list) and bool(tools)
    head = system.lstrip()[:400]
    if head.startswith(SUMMARY_OPENING) and not has_tools:
        return "compaction", "OpenClaw's summarisation system prompt, no tools offered"
    if (head.startswith(MAIN_MARK) or head.startswith(MAIN_OPENING)) and MAIN_OPENING in head and has_tools:
        return "main", "OpenClaw's agent system prompt with the agent's tools"
    return None


def openclaw_kinds(calls: Sequence[CallRecord]) -> list[KindVerdict]:
    """Per call, :func:`openclaw_kind`; a call it cannot read is left to the default (None). Never raises."""
    return verdicts_per_call(calls, openclaw_kind)


def _plain_user_text(item: Any) -> str | None:
    """The text of a user message made of text only (a string, or ``text``/``input_text`` blocks), else None
    (a tool result, in any dialect, is never plain user text)."""
    if not isinstance(item, Mapping) or item.get("role") != "user" or item.get("type", "message") != "message":
        return None
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(b, Mapping) and b.get("type") in ("text", "input_text") and isinstance(b.get("text"), str)
            for b in content):
        return "".join(b["text"] for b in content)
    return None


def _is_aborted_note(item: Any) -> bool:
    text = _plain_user_text(item)
    if text is None:
        return False
    stamp = _STAMP.match(text)
    body = text[stamp.end():] if stamp else text
    return body.startswith(ABORTED_OPENING) and ABORTED_CLOSING in body


def history(request: Mapping[str, Any]) -> list[Any] | None:
    """The conversation a request carries, without OpenClaw's transient last message: the messages (chat,
    Anthropic) or input items (Responses), led by the Anthropic ``system`` / Responses ``instructions`` field
    when set. None when the request has no list of messages."""
    items = request.get("messages", request.get("input"))
    if not isinstance(items, list):
        return None
    items = list(items)
    if items:
        last = _plain_user_text(items[-1])
        if last is not None and last.lstrip().startswith(INTERNAL_CONTEXT_OPENING):
            items.pop()
    head = [{"system": request[k]} for k in ("system", "instructions") if request.get(k)]
    return head + items


def _key(items: Sequence[Any]) -> bytes:
    return hashlib.blake2b(json.dumps(list(items), sort_keys=True, default=str).encode(), digest_size=16).digest()


def openclaw_discarded(calls: Sequence[CallRecord]) -> dict[int, int]:
    """``{call_index of X: call_index of Y}`` for every agent call ``X`` that OpenClaw abandoned and retried as
    ``Y`` with an aborted note (the first such ``Y``, by request start; see the module invariants). Never
    raises: a call it cannot read takes no part."""
    entries: list[tuple[float, int, list[Any]]] = []  # (started_at, call_index, history) of the agent calls
    for c in calls:
        try:
            request = c.request if isinstance(c.request, Mapping) else {}
            items = history(request)
            verdict = openclaw_kind(c)
            if items is not None and verdict is not None and verdict[0] == "main":
                entries.append((c.started_at, c.call_index, items))
        except Exception:  # noqa: BLE001 - a malformed record takes no part
            continue
    entries.sort(key=lambda e: (e[0], e[1]))
    continued: set[bytes] = set()  # histories some call went on from (an answer or a tool result after them)
    for _, _, items in entries:
        for i, item in enumerate(items):
            if _plain_user_text(item) is None:
                continued.add(_key(items[:i]))
    latest: dict[bytes, int] = {}  # history -> call_index of the latest call (so far, by start) that sent it
    out: dict[int, int] = {}
    for _, index, items in entries:
        tail = len(items)
        while tail > 0 and _plain_user_text(items[tail - 1]) is not None:
            tail -= 1  # items[tail:] is the trailing run of plain user messages
        for cut in range(len(items) - 1, tail - 1, -1):  # the longest prefix first: the latest abandoned turn
            if not any(_is_aborted_note(m) for m in items[cut:]):
                continue
            key = _key(items[:cut])
            abandoned = latest.get(key)
            if abandoned is not None and key not in continued and abandoned not in out:
                out[abandoned] = index
                break
        latest[_key(items)] = index
    return out
