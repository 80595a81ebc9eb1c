"""From sampled token ids to text pieces, a parsed assistant turn, and ordered stream deltas.

Dialect-neutral: the OpenAI chat, Anthropic Messages and Responses renderers all stream the same
:class:`Delta` sequence. The policy has already generated the whole continuation when these run, so
"incremental" means *token by token over a finished generation*, not overlapping with sampling.

Invariants:
  * :func:`token_pieces` returns one string per token and ``"".join(pieces)`` is the text of the
    ids (equal to ``tokenizer.decode(ids)``; if the byte-level fast path ever disagrees, the whole
    text is attributed to the last token instead). A multi-byte character is attributed to the token
    that completes it, so no piece ever holds half a character.
  * There is one assistant-text parser, :func:`clawgym_env.policy.chat_format.segment` (re-exported
    here); :func:`~clawgym_env.policy.chat_format.parse_assistant` reads the same spans this module
    streams from, so streamed and non-streamed answers parse alike.
  * For :func:`iter_deltas`: the concatenated ``content`` deltas equal the parsed content, the
    ``reasoning`` deltas the parsed reasoning, the ``tool_args`` deltas of call *i* its arguments,
    and every tool call's ``tool_start`` comes before its ``tool_args``. Deltas follow text order.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from clawgym_env.policy.chat_format import END_OF_TEXT, Segmentation, ToolCallSpan, segment

if TYPE_CHECKING:
    from clawgym_env.policy.hf import Tokenizer

__all__ = ["END_OF_TEXT", "Delta", "Segmentation", "ToolCallSpan", "iter_deltas", "piece_offsets", "segment",
           "stop_cut", "token_bytes", "token_pieces"]


# ----------------------------------------------------------------------------- decoding

@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of the byte-level BPE alphabet (printable stand-ins for the 256 byte values)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


_ADDED_CACHE: dict[int, tuple[Any, dict[int, str]]] = {}


def _added_tokens(tokenizer: Tokenizer) -> dict[int, str]:
    entry = _ADDED_CACHE.get(id(tokenizer))
    if entry is None or entry[0] is not tokenizer:
        added = {int(i): str(getattr(t, "content", t))
                 for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()}
        entry = (tokenizer, added)
        _ADDED_CACHE[id(tokenizer)] = entry
    return entry[1]


def token_bytes(tokenizer: Tokenizer, ids: Sequence[int]) -> list[bytes]:
    """The raw bytes each token stands for (added/special tokens: their literal UTF-8 text)."""
    added = _added_tokens(tokenizer)
    dec = _byte_decoder()
    toks = tokenizer.convert_ids_to_tokens([int(i) for i in ids])
    out: list[bytes] = []
    for tid, tok in zip(ids, toks):
        if int(tid) in added:
            out.append(added[int(tid)].encode("utf-8"))
        elif tok is None:
            out.append(b"")
        else:
            out.append(b"".join(bytes([dec[c]]) if c in dec else c.encode("utf-8") for c in tok))
    return out


def token_pieces(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """One text piece per token; see the module invariants. O(len(ids))."""
    ids = list(ids)
    if not ids:
        return []
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chunks = token_bytes(tokenizer, ids)
    pieces = [decoder.decode(b) for b in chunks]
    pieces[-1] += decoder.decode(b"", final=True)
    full = tokenizer.decode(ids, skip_special_tokens=False)
    if "".join(pieces) != full:
        pieces = [""] * (len(ids) - 1) + [full]
    return pieces


def piece_offsets(pieces: Sequence[str]) -> list[int]:
    """``ends[i]`` = character offset where token ``i`` ends in the joined text."""
    ends, pos = [], 0
    for p in pieces:
        pos += len(p)
        ends.append(pos)
    return ends


def stop_cut(pieces: Sequence[str], stops: Sequence[str]) -> int | None:
    """Tokens to keep so the text ends before the earliest stop string, or None if none occurs.

    Kept tokens lie wholly before the stop; a token straddling its start is dropped (so the kept ids
    decode exactly to the returned text), as are trailing tokens holding half a character.
    """
    text = "".join(pieces)
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    if not hits:
        return None
    at = min(hits)
    ends = piece_offsets(pieces)
    keep = 0
    while keep < len(pieces) and ends[keep] <= at:
        keep += 1
    while keep > 0 and pieces[keep - 1] == "":
        keep -= 1
    return keep


# ----------------------------------------------------------------------------- deltas

@dataclasses.dataclass
class Delta:
    """One streamed increment. ``kind``: "reasoning" | "content" | "tool_start" | "tool_args"."""

    kind: str
    text: str = ""
    index: int = 0  # tool call index (tool_start / tool_args)
    call_id: str = ""
    name: str = ""


def iter_deltas(pieces: Sequence[str], seg: Segmentation) -> Iterator[Delta]:
    """Deltas in text order, each token's share emitted as that token is reached."""
    regions: list[tuple[int, int, str, int]] = []  # (start, end, kind, tool index)
    if seg.reasoning_span and seg.reasoning_span[1] > seg.reasoning_span[0]:
        regions.append((*seg.reasoning_span, "reasoning", -1))
    regions += [(a, b, "content", -1) for a, b in seg.content_spans]
    regions += [(t.start, t.end, "tool", i) for i, t in enumerate(seg.tool_calls)]
    regions.sort()
    started: set[int] = set()
    done_args: set[int] = set()
    first = 0
    lo = 0
    total = sum(len(p) for p in pieces)
    for piece in pieces:
        hi = lo + len(piece)
        if hi == total:
            hi = max(hi, len(seg.text))
        r = first
        while r < len(regions) and regions[r][0] < hi:
            a, b, kind, idx = regions[r]
            if b > lo:
                yield from _region_share(seg, kind, idx, a, b, lo, hi, started, done_args)
            if b <= hi and r == first:
                first += 1
            r += 1
        lo = hi
    for i in range(len(seg.tool_calls)):  # safety net: regions unreachable through pieces
        t = seg.tool_calls[i]
        yield from _region_share(seg, "tool", i, t.start, t.end, t.start, t.end, started, done_args)


def _region_share(seg: Segmentation, kind: str, idx: int, a: int, b: int, lo: int, hi: int,
                  started: set[int], done_args: set[int]) -> Iterator[Delta]:
    if kind != "tool":
        text = seg.text[max(a, lo):min(b, hi)]
        if text:
            yield Delta(kind, text)
        return
    call = seg.tool_calls[idx]
    if idx not in started:
        started.add(idx)
        yield Delta("tool_start", index=idx, call_id=call.id, name=call.name)
    if idx in done_args:
        return
    if call.args_span is not None:
        s, e = call.args_span
        text = seg.text[max(s, lo):min(e, hi)]
        if text:
            yield Delta("tool_args", text, index=idx)
        if hi >= e:
            done_args.add(idx)
    elif hi >= b:
        done_args.add(idx)
        if call.arguments:
            yield Delta("tool_args", call.arguments, index=idx)
