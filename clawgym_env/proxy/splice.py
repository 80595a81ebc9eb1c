"""Token-in, token-out: reuse the exact sampled ids of assistant turns a harness sends back.

Harnesses send the whole history on every call, as text, and rewrite it (tool-call ids, argument
serialisation, dropped thinking, moved context messages, whitespace). Re-rendering and
re-tokenising that text would train on tokens the policy never sampled. Instead:

1. the request is rendered by the chat template as usual (context: system, user, tool results);
2. each assistant turn of the history is matched to a call of this episode whose response it was —
   by content and canonical tool calls (name + arguments as canonical JSON), ignoring tool-call ids,
   argument formatting and reasoning the harness may have dropped;
3. a matched turn's span in the rendering (from after ``<|im_start|>assistant\\n`` through
   ``<|im_end|>``) is replaced by that call's generation-prompt tail plus its exact sampled ids;
   the text between turns is tokenised on its own (segments start and end at special tokens,
   which the tokenizer never merges across, so no boundary changes tokenisation).

Invariant: when every assistant turn matches, ``prompt_ids`` contain each earlier output verbatim,
so a call that appends to the previous conversation extends ``prev.prompt_ids + prev.output_ids``
token for token. A turn that cannot be matched is rendered from text, and the call is recorded
as not token-exact with the reason.

:func:`splice_region` does steps 2-3 for any rendered region and may tokenise it apart at more cut
points just before a special token (the same ids); :mod:`clawgym_env.proxy.incremental` uses it to
render and tokenise only what a call appended. :func:`splice_prompt` is the full render it must equal.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.chat_format import content_to_text, render_prompt_text

if TYPE_CHECKING:
    from clawgym_env.policy.hf import Tokenizer

ASSISTANT_OPEN = "<|im_start|>assistant\n"
IM_END = "<|im_end|>"


def _canonical_args(args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return args.strip()
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def turn_key(message: JSONObject) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What identifies an assistant turn across a harness's rewrites."""
    calls = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function", tc)
        calls.append((str(fn.get("name", "")), _canonical_args(fn.get("arguments", "{}"))))
    return content_to_text(message.get("content")).strip(), tuple(calls)


def assistant_spans(text: str) -> list[tuple[int, int]]:
    """(start of content, end after ``<|im_end|>``) of every complete assistant turn in ``text``."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        start = text.find(ASSISTANT_OPEN, pos)
        if start < 0:
            return spans
        body = start + len(ASSISTANT_OPEN)
        end = text.find(IM_END, body)
        if end < 0:
            return spans  # the generation prompt at the end
        spans.append((body, end + len(IM_END)))
        pos = end + len(IM_END)


@dataclasses.dataclass(frozen=True)
class _Encoder:
    """A tokenizer's encoding without special tokens, and the ids splicing needs (made once per tokenizer)."""

    encode: Callable[[str], list[int]]
    opener: list[int]  # ``<|im_start|>assistant\n``
    im_end: int


def encoder(tokenizer: Tokenizer) -> _Encoder:
    """The tokenizer's ``encode(text, add_special_tokens=False)``; for a Rust-backed tokenizer without
    truncation or padding, its backend's encode, the same ids without the per-call wrapper."""
    try:
        return _cached_encoder(tokenizer)
    except TypeError:  # an unhashable tokenizer: made per call
        return _make_encoder(tokenizer)


@functools.lru_cache(maxsize=8)
def _cached_encoder(tokenizer: Tokenizer) -> _Encoder:
    return _make_encoder(tokenizer)


def _make_encoder(tokenizer: Tokenizer) -> _Encoder:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(backend, "truncation", 0) is None and getattr(backend, "padding", 0) is None:
        def encode(text: str) -> list[int]:
            return backend.encode(text, add_special_tokens=False).ids
    else:
        def encode(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))
    return _Encoder(encode, encode(ASSISTANT_OPEN), tokenizer.convert_tokens_to_ids(IM_END))


def _generation_tail(tokenizer: Tokenizer, prompt_ids: Sequence[int]) -> list[int]:
    """Ids after the last ``<|im_start|>assistant\\n`` of a prompt (e.g. an empty think block)."""
    opener = encoder(tokenizer).opener
    n = len(opener)
    for i in range(len(prompt_ids) - n, -1, -1):
        if list(prompt_ids[i:i + n]) == opener:
            return list(prompt_ids[i + n:])
    return []


TurnKey = tuple[str, tuple[tuple[str, str], ...]]


def latest_by_key(previous_calls: Sequence[Any]) -> dict[TurnKey, Any]:
    """Each turn key's latest call among ``previous_calls`` that sampled ids (what a turn is spliced from)."""
    by_key: dict[TurnKey, Any] = {}
    for call in previous_calls:
        if call.output_token_ids:
            by_key[turn_key(call.response_message)] = call  # the latest call with that response wins
    return by_key


@dataclasses.dataclass
class Spliced:
    """The ids of one rendered region with the matched assistant turns spliced in.

    ``missed``: ordinals (within the region) of the assistant turns rendered from text; ``marks[i]``:
    the id offset at ``cuts[i]``, or None where that cut fell inside a spliced turn; ``used``: per
    assistant turn, the call it was spliced from (None: rendered from text).
    """

    ids: list[int]
    missed: list[int]
    marks: list[int | None]
    used: list[Any]


def turn_ids(tokenizer: Tokenizer, call: Any) -> list[int]:
    """The ids a spliced turn takes from ``call`` after ``<|im_start|>assistant\\n``: its generation-prompt
    tail, its sampled ids, and ``<|im_end|>`` when the output was cut off."""
    im_end = encoder(tokenizer).im_end
    ids = _generation_tail(tokenizer, call.prompt_token_ids) + list(call.output_token_ids)
    if call.output_token_ids[-1] != im_end:
        ids.append(im_end)  # a cut-off output: the turn is closed as context
    return ids


def splice_region(tokenizer: Tokenizer, text: str, assistants: Sequence[JSONObject],
                  resolve: Callable[[TurnKey], Any], cuts: Sequence[int] = ()) -> Spliced | None:
    """Tokenise ``text`` (a rendering holding exactly the turns ``assistants``) with matched turns spliced.

    ``resolve`` maps a turn key to the call to splice from (None: render from text). ``cuts`` are
    ascending offsets just before a special token; the text is also tokenised apart there, which
    changes no id. None when the rendered assistant turns cannot be aligned with ``assistants``.
    """
    spans = assistant_spans(text) if assistants else []
    if len(spans) != len(assistants):
        return None
    enc = encoder(tokenizer)
    ids: list[int] = []
    marks: list[int | None] = [None] * len(cuts)
    missed: list[int] = []
    used: list[Any] = []
    state = {"cut": 0}

    def emit(start: int, stop: int) -> None:
        while state["cut"] < len(cuts) and cuts[state["cut"]] <= stop:
            at = cuts[state["cut"]]
            if at >= start:
                if at > start:
                    ids.extend(enc.encode(text[start:at]))
                    start = at
                marks[state["cut"]] = len(ids)
            state["cut"] += 1
        if stop > start:
            ids.extend(enc.encode(text[start:stop]))

    pos = 0
    for k, (msg, (body, end)) in enumerate(zip(assistants, spans)):
        call = resolve(turn_key(msg))
        used.append(call)
        if call is None:
            missed.append(k)
            continue
        emit(pos, body - len(ASSISTANT_OPEN))
        ids.extend(enc.opener)
        ids.extend(turn_ids(tokenizer, call))
        pos = end
    emit(pos, len(text))
    return Spliced(ids, missed, marks, used)


def misaligned_reason(assistants: int, spans: int) -> str:
    """The reason recorded when the rendered assistant turns cannot be aligned with the messages."""
    return f"could not align {assistants} assistant turns with {spans} rendered turns"


def missed_reason(missed: Sequence[int], assistants: int) -> str | None:
    """The reason recorded when some assistant turns were rendered from text (None when none were)."""
    if not missed:
        return None
    return (f"assistant turn(s) {list(missed)} of {assistants} match no sampled output of this episode; "
            "rendered from text")


def splice_prompt(tokenizer: Tokenizer, messages: list[JSONObject], tools: list[JSONObject] | None,
                  enable_thinking: bool | None, previous_calls: Sequence[Any]) -> tuple[list[int], bool, str | None]:
    """Prompt ids for ``messages`` with earlier sampled assistant turns spliced in (the full render).

    Returns ``(prompt_ids, token_exact, reason)``; ``previous_calls`` are this episode's
    :class:`~clawgym_env.capture.records.CallRecord` so far (in order).
    :mod:`clawgym_env.proxy.incremental` gives the same ids at the cost of what a call appended.
    """
    text = render_prompt_text(tokenizer, messages, tools, enable_thinking)
    assistants = [m for m in messages if m.get("role") == "assistant"]
    spliced = splice_region(tokenizer, text, assistants, latest_by_key(previous_calls).get)
    if spliced is None:
        return (list(tokenizer.encode(text, add_special_tokens=False)), False,
                misaligned_reason(len(assistants), len(assistant_spans(text))))
    reason = missed_reason(spliced.missed, len(assistants))
    return spliced.ids, reason is None, reason
