"""What each captured call of an episode was for, and which calls the harness threw away.

A harness makes more calls than its agent's own turns: helper calls (title generation, summaries, safety or quota
probes, prompt suggestions), delegated agents (subagents) and context compaction. And when a call fails on the
client side (a read timeout, a dropped connection) the harness re-sends the same prompt: the first answer, which
the proxy did record, was discarded. Trainers must know both (the paper trains the main agent's own tokens only and
never a dead retry), so every call record is labelled at the end of its episode by :func:`classify_calls`:

* ``kind``: the adapter's verdict where its harness marks the call itself (:meth:`HarnessAdapter.call_kinds`:
  headers, system prompt, tool set, request shape), else the structural default of :func:`structural_kinds`;
  ``kind_reason`` says which, and on what evidence.
* ``discarded_by``: set by :func:`find_discarded`.

Invariants:
  * classification never raises on what an episode holds: an adapter that raises, or answers for the wrong number of
    calls, is ignored (every call then gets the structural default, and its reason says the adapter failed);
  * the records handed in are not modified: copies come back, in the same order, with only ``kind``,
    ``kind_reason`` and ``discarded_by`` changed; the token ids and logprobs are untouched;
  * the rule for a dead retry is the harness's own behaviour, not a guess about content: call ``j`` is discarded
    exactly when a call that *started* later (``started_at``: the request's arrival; an abandoned call often
    finishes after its retry, so ``call_index``, the finishing order, would pick the wrong one) has a prompt
    identical to ``j``'s, token for token, and either it answered exactly as ``j`` did (a copy: the tree keeps its
    tokens once, through the retry) or no call continues from ``j``'s answer (its prompt starts with ``j``'s
    prompt + output: nested subagents may send identical prompts and all be continued);
    ``discarded_by`` is the first such retry. Calls with an empty prompt are never matched.
  * a harness that retries in its own way (OpenClaw re-sends the interrupted turn with an aborted note, not the
    same prompt) marks those retries itself (``discarded_calls`` on the adapter, on evidence only the harness
    writes); its pairs fill in calls the identical-prompt rule left unmarked. An adapter answer that names an
    unknown call, a call retried by itself, or a retry that started before the call it retries is ignored whole
    (and the reasons say so), like a failing ``call_kinds``.
  * the structural default is deterministic and depends only on the calls' prompt ids and their order.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import Protocol

from clawgym_env.capture.records import CALL_KINDS, CallKind, CallRecord


class KindsAdapter(Protocol):
    """What classification needs of a harness adapter (:class:`clawgym_env.harness.HarnessAdapter` has it; the
    seam imports the records, so this module names only the method it calls). A ``discarded_calls(calls)``
    method, when the adapter has one, is called too (see the module invariants)."""

    name: str

    def call_kinds(self, calls: Sequence[CallRecord]) -> list[tuple[CallKind, str] | None]: ...  # noqa: D102

SAME_CONVERSATION_SHARE = 0.5
"""Two calls belong to one conversation when their prompts share a token prefix of at least this share of the
shorter prompt (the same system prompt, tools and opening turns; a helper call with its own system prompt shares
only the first few template tokens)."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (binary search over slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    a, b = list(a), list(b)
    if a[:hi] == b[:hi]:  # the usual case in one conversation: the shorter one is a prefix
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo]; the answer is in [lo, hi]
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _digest(ids: Sequence[int]) -> tuple[int, bytes]:
    """(length, 32-byte digest) of a token sequence: equal for equal sequences, and small to keep per call."""
    h = hashlib.blake2b(digest_size=32)
    h.update(array("q", ids).tobytes())
    return len(ids), h.digest()


def find_discarded(calls: Sequence[CallRecord]) -> dict[int, int]:
    """``{call_index of j: call_index of k}`` for every call ``j`` whose exact prompt a call ``k`` started later
    (the first one) sent again while nothing continued from ``j``'s answer: the harness discarded it and retried
    (see the module invariants)."""
    order = sorted(calls, key=lambda c: (c.started_at, c.call_index))  # request arrival, not completion
    last_seen: dict[tuple[int, bytes], CallRecord] = {}
    candidates: dict[int, tuple[CallRecord, int]] = {}
    for pos, c in enumerate(order):
        if not c.prompt_token_ids:
            continue
        key = _digest(c.prompt_token_ids)
        earlier = last_seen.get(key)
        if earlier is not None:
            candidates[earlier.call_index] = (earlier, pos)
        last_seen[key] = c
    out: dict[int, int] = {}
    for j, (rec, pos) in candidates.items():
        if list(rec.output_token_ids) == list(order[pos].output_token_ids):  # the same answer again: a copy of it
            out[j] = order[pos].call_index
            continue
        seq = list(rec.prompt_token_ids) + list(rec.output_token_ids)
        continued = rec.output_token_ids and any(
            len(c.prompt_token_ids) >= len(seq) and c.prompt_token_ids[:len(seq)] == seq for c in order)
        if not continued:
            out[j] = order[pos].call_index
    return out


def conversations(calls: Sequence[CallRecord]) -> list[int]:
    """Per call, the position of its conversation (0, 1, ... in order of first appearance). A call joins the first
    conversation whose opening call shares a prompt prefix of at least :data:`SAME_CONVERSATION_SHARE` of the
    shorter prompt with it; otherwise it opens a new one. An empty prompt opens a conversation of its own."""
    openers: list[Sequence[int]] = []
    out: list[int] = []
    for c in calls:
        prompt = c.prompt_token_ids
        found = -1
        if prompt:
            for k, opener in enumerate(openers):
                shorter = min(len(prompt), len(opener))
                if shorter and common_prefix(prompt, opener) >= SAME_CONVERSATION_SHARE * shorter:
                    found = k
                    break
        if found < 0:
            openers.append(prompt if prompt else [-1])  # [-1] never shares a prefix with token ids
            found = len(openers) - 1
        out.append(found)
    return out


def structural_kinds(calls: Sequence[CallRecord]) -> list[tuple[CallKind, str]]:
    """The default kind of every call, from the prompts' shape alone.

    The main conversation is the one with the most calls (ties: the one holding the earliest call); a call of
    another conversation is ``side`` when its conversation has one call and ``subagent`` when it has several.
    Compaction is never inferred here (a summary request extends the main conversation): adapters mark it.
    """
    if not calls:
        return []
    conv = conversations(calls)
    sizes: dict[int, int] = {}
    for k in conv:
        sizes[k] = sizes.get(k, 0) + 1
    main = max(sizes, key=lambda k: (sizes[k], -k))  # most calls; ties: opened first
    out: list[tuple[CallKind, str]] = []
    for k in conv:
        if k == main:
            out.append(("main", f"structural: the main conversation ({sizes[k]} calls)"))
        elif sizes[k] == 1:
            out.append(("side", "structural: a one-call conversation apart from the main one"))
        else:
            out.append(("subagent", f"structural: a conversation of {sizes[k]} calls apart from the main one"))
    return out


def _adapter_verdicts(calls: Sequence[CallRecord], adapter: KindsAdapter | None) -> tuple[list, str | None]:
    if adapter is None:
        return [None] * len(calls), None
    name = getattr(adapter, "name", type(adapter).__name__)
    try:
        verdicts = list(adapter.call_kinds(calls))
    except Exception as exc:  # noqa: BLE001 - an adapter bug must not lose the episode; the reason records it
        return [None] * len(calls), f"{name}.call_kinds raised {type(exc).__name__}: {exc}"[:300]
    if len(verdicts) != len(calls):
        return [None] * len(calls), f"{name}.call_kinds answered for {len(verdicts)} of {len(calls)} calls"
    for v in verdicts:
        if v is not None and not (isinstance(v, tuple) and len(v) == 2 and v[0] in CALL_KINDS
                                  and isinstance(v[1], str)):
            return [None] * len(calls), f"{name}.call_kinds returned {v!r}, not (kind, reason) or None"[:300]
    return verdicts, None


def _adapter_discards(calls: Sequence[CallRecord], adapter: KindsAdapter | None) -> tuple[dict[int, int], str | None]:
    """The adapter's own retry pairs (``discarded_calls``, when it has one), checked; ({}, why) when unusable."""
    method = getattr(adapter, "discarded_calls", None)
    if method is None:
        return {}, None
    name = getattr(adapter, "name", type(adapter).__name__)
    try:
        pairs = dict(method(calls))
    except Exception as exc:  # noqa: BLE001 - an adapter bug must not lose the episode; the reason records it
        return {}, f"{name}.discarded_calls raised {type(exc).__name__}: {exc}"[:300]
    start = {c.call_index: (c.started_at, c.call_index) for c in calls}
    for j, k in pairs.items():
        if not (isinstance(j, int) and isinstance(k, int) and j in start and k in start and j != k
                and start[j] < start[k]):
            return {}, f"{name}.discarded_calls paired {j!r} with {k!r}: not a call and a later one"[:300]
    return pairs, None


def classify_calls(calls: Sequence[CallRecord], adapter: KindsAdapter | None = None) -> list[CallRecord]:
    """Copies of ``calls`` (one episode, in ``call_index`` order) with ``kind``, ``kind_reason`` and
    ``discarded_by`` set (see the module docstring)."""
    calls = list(calls)
    verdicts, failure = _adapter_verdicts(calls, adapter)
    default = structural_kinds(calls)
    own, discard_failure = _adapter_discards(calls, adapter)
    discarded = {**own, **find_discarded(calls)}  # the identical-prompt rule first; the adapter's fill in
    name = getattr(adapter, "name", "adapter")
    out: list[CallRecord] = []
    for c, verdict, (kind, reason) in zip(calls, verdicts, default):
        if verdict is not None:
            kind, reason = verdict[0], f"{name}: {verdict[1]}"
        elif failure is not None:
            reason = f"{reason} (adapter ignored: {failure})"
        if discard_failure is not None:
            reason = f"{reason} (adapter's retries ignored: {discard_failure})"
        out.append(c.model_copy(update={"kind": kind, "kind_reason": reason,
                                        "discarded_by": discarded.get(c.call_index)}))
    return out
