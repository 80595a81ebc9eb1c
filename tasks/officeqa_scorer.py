"""OfficeQA answer scorer: standard library only, self-contained.

This one file is both the library scorer (``tasks.officeqa`` imports it) and, copied verbatim as
``reward/check.py``, the hermetic verifier of every OfficeQA task (see :func:`main`). It must never
import anything outside the Python standard library.

``score_answer(gold, pred, tolerance=0.0)`` returns 1.0 or 0.0 by these rules, applied in order:

1. **Extraction.** The answer is the text of the LAST ``<FINAL_ANSWER>…</FINAL_ANSWER>`` pair
   (tag names case-insensitive), stripped; when the reply holds no such pair, the whole reply.
   An empty answer scores 0.
2. **Direct answer only.** The answer is rejected (0) when it has more than one non-empty line,
   is longer than 250 characters, or contains markup (an HTML/XML tag such as ``<b>``).
3. **Normalisation** (gold and answer alike): Unicode minus signs become ``-``; accounting
   parentheses mean negative (``(1,234)``, ``($1,234)`` and ``$(1,234)`` are ``-1234``; a bare year in
   parentheses such as ``(1977)`` is left alone); currency signs (``$ £ € ¥ ₹ ¢ ₩ ₽``) are dropped;
   thousands separators are removed (only well-formed groups: ``1,234,567``; ``44.00,231.52`` is
   two numbers); a percent sign or the word ``percent`` after a number is dropped (``12.5%`` ==
   ``12.5``; no scaling by 100).
4. **Units.** A unit word right after a number — thousand, million, billion, trillion (singular or
   plural, any case) or the abbreviations k, m, mn, b, bn, tn — is attached to that number and is
   NEVER multiplied out: ``36,080 million`` is the number 36080 with unit million, so it does not
   equal ``36080000000``. Two numbers agree on units when both state the same unit or when either
   states none; two different stated units disagree (``997.3 billion`` vs ``997.3 million``).
5. **Number count.** A year-like number is four plain digits from 1900 to 2100 with no unit or
   percent. When no gold number is year-like, year-like numbers in the answer are ignored
   (``507 in FY 1934`` answers ``507``). After that, the answer must hold exactly as many numbers
   as the gold answer — a bracketed gold list may instead be matched by a comma segmentation of
   the answer into that many numbers (``[8,152,260]`` answers ``[8, 152260]``). Otherwise 0.
6. **Number match.** Two numbers match when their units agree and ``|pred - gold| <= tolerance *
   |gold|`` (exact decimal arithmetic; ``tolerance`` 0.0 means equal values; a gold 0 needs
   exactly 0). Every gold number must be matched: in order for a gold answer that is one bracketed
   list (``[a, b, c]``), otherwise one-to-one in any order.
7. **Text parts.** The words left in the gold answer after removing numbers, unit and percent
   words and punctuation (e.g. the month of ``March 3, 1977``, or ``surplus`` in ``[0.012,
   surplus]``) must appear, as a contiguous run of words and case-insensitively, among the words
   left in the answer.
8. **Text-only gold.** A gold answer with no number needs an answer with no number whose
   normalised text is equal: case-folded, parenthetical asides removed, punctuation dropped,
   whitespace collapsed.

Invariants: the result is exactly 0.0 or 1.0; malformed *answers* never raise (they score 0);
a bad ``tolerance`` (outside [0, 1]) or an empty gold answer raises ``ValueError`` — those are the
caller's bugs, not the agent's.
"""

from __future__ import annotations

import json
import os
import re
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path

MAX_ANSWER_CHARS = 250
GOLD_FILE = "gold.json"
PAYLOAD_ENV = "OPENCLAW_REWARD_PAYLOAD"

_TAG_PAIR = re.compile(r"<FINAL_ANSWER>(.*?)</FINAL_ANSWER>", re.IGNORECASE | re.DOTALL)
_MARKUP = re.compile(r"</?[A-Za-z][\w:-]*(?:\s[^<>]*)?/?>")
_MINUS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})
_CURRENCY = "$£€¥₹¢₩₽"
_BODY = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_ACCOUNTING = re.compile(rf"([{_CURRENCY}])?\s*\(\s*([{_CURRENCY}])?\s*({_BODY})\s*\)")
_UNITS = {"thousand": "thousand", "thousands": "thousand", "k": "thousand",
          "million": "million", "millions": "million", "m": "million", "mn": "million",
          "billion": "billion", "billions": "billion", "b": "billion", "bn": "billion",
          "trillion": "trillion", "trillions": "trillion", "tn": "trillion"}
_UNIT_ALT = "|".join(sorted(_UNITS, key=len, reverse=True))
_NUMBER = re.compile(
    rf"(?P<sign>(?<![\w)])-)?(?<![\d.])(?P<body>{_BODY})"
    rf"(?P<pct>\s?%|\s*(?:percent|per\s+cent)\b)?"
    rf"(?:\s*(?P<unit>{_UNIT_ALT})\b)?", re.IGNORECASE)
_FILLER_WORDS = re.compile(r"\b(?:percent|percentage|per\s+cent|hundreds?|thousands?|millions?|billions?"
                           r"|trillions?)\b", re.IGNORECASE)
_MAX_LIST_CHUNKS = 64


class Num:
    """One number of an answer: exact value, attached unit (or None), year-likeness."""

    __slots__ = ("value", "unit", "year_like")

    def __init__(self, value: Decimal, unit: str | None, year_like: bool) -> None:
        self.value, self.unit, self.year_like = value, unit, year_like

    def __repr__(self) -> str:
        return f"Num({self.value}{' ' + self.unit if self.unit else ''})"


def extract_final_answer(reply: str) -> str:
    """Rule 1: the last FINAL_ANSWER pair's text, else the whole reply (stripped)."""
    pairs = _TAG_PAIR.findall(reply or "")
    return (pairs[-1] if pairs else (reply or "")).strip()


def _normalise(text: str) -> str:
    text = text.translate(_MINUS)

    def accounting(m: re.Match) -> str:
        body = m.group(3)
        if not (m.group(1) or m.group(2)) and re.fullmatch(r"(19\d\d|20\d\d|2100)", body):
            return m.group(0)  # "(1977)" is a year aside, not a negative number
        return f"-{body}"

    text = _ACCOUNTING.sub(accounting, text)
    text = re.sub(f"[{_CURRENCY}]", "", text)
    return re.sub(r"\s+", " ", text).strip()


def parse_answer(text: str) -> tuple[list[Num], list[str]]:
    """Rules 3–4: the numbers of ``text`` (in order) and its leftover words (lower case)."""
    norm = _normalise(text)
    nums: list[Num] = []
    for m in _NUMBER.finditer(norm):
        body = m.group("body")
        try:
            value = Decimal(body.replace(",", ""))
        except InvalidOperation:  # pragma: no cover - the pattern only admits valid decimals
            continue
        if m.group("sign"):
            value = -value
        unit = _UNITS[m.group("unit").lower()] if m.group("unit") else None
        year_like = (not m.group("sign") and unit is None and not m.group("pct")
                     and re.fullmatch(r"\d{4}", body) is not None and 1900 <= int(body) <= 2100)
        nums.append(Num(value, unit, year_like))
    rest = _FILLER_WORDS.sub(" ", _NUMBER.sub(" ", norm))
    words = re.sub(r"[^\w\s]|_", " ", rest.lower()).split()
    return nums, words


def _text_only_form(text: str) -> str:
    s = re.sub(r"\([^)]*\)", " ", text.translate(_MINUS).lower())
    return " ".join(re.sub(r"[^\w\s]|_", " ", s).split())


def _contains_run(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


def _bracket_body(text: str) -> str | None:
    """The inside of the text's only ``[...]`` when nothing numeric lies outside it."""
    norm = text.translate(_MINUS)
    found = list(re.finditer(r"\[([^\[\]]*)\]", norm))
    if len(found) != 1:
        return None
    outside = norm[:found[0].start()] + norm[found[0].end():]
    return None if re.search(r"\d", outside) else found[0].group(1)


def _single_number(item: str) -> Num | None:
    nums, words = parse_answer(item)
    return nums[0] if len(nums) == 1 and not words else None


def _list_chunks(text: str) -> list[str] | None:
    """The comma chunks of the text's bracketed body (or of the whole text), if few enough."""
    body = _bracket_body(text)
    chunks = (body if body is not None else text).split(",")
    return chunks if len(chunks) <= _MAX_LIST_CHUNKS else None


def _segments(chunks: list[str], count: int, accept) -> bool:
    """True when ``chunks`` regroup, in order, into exactly ``count`` numbers, the k-th of which
    satisfies ``accept(k, num)`` (memoised over (chunk, item) positions: quadratic, not exponential).
    """
    memo: dict[tuple[int, int], bool] = {}

    def fits(start: int, k: int) -> bool:
        if k == count:
            return start == len(chunks)
        if (start, k) not in memo:
            memo[(start, k)] = False
            for end in range(start + 1, len(chunks) - (count - k - 1) + 1):
                num = _single_number(",".join(chunks[start:end]).strip())
                if num is not None and accept(k, num) and fits(end, k + 1):
                    memo[(start, k)] = True
                    break
        return memo[(start, k)]

    return count >= 2 and fits(0, 0)


def _num_match(gold: Num, pred: Num, tol: Decimal) -> bool:
    if gold.unit is not None and pred.unit is not None and gold.unit != pred.unit:
        return False
    if gold.value == 0:
        return pred.value == 0
    return abs(pred.value - gold.value) <= tol * abs(gold.value)


def _ordered_match(gold: list[Num], pred: list[Num], tol: Decimal) -> bool:
    return len(gold) == len(pred) and all(_num_match(g, p, tol) for g, p in zip(gold, pred))


def _one_to_one(gold: list[Num], pred: list[Num], tol: Decimal) -> bool:
    """A perfect matching of gold numbers onto distinct answer numbers (augmenting paths)."""
    owner: dict[int, int] = {}

    def place(gi: int, seen: set[int]) -> bool:
        for pi, p in enumerate(pred):
            if pi not in seen and _num_match(gold[gi], p, tol):
                seen.add(pi)
                if pi not in owner or place(owner[pi], seen):
                    owner[pi] = gi
                    return True
        return False

    return all(place(gi, set()) for gi in range(len(gold)))


def judge(gold: str, pred: str, tolerance: float = 0.0) -> tuple[float, str]:
    """(score, reason) for ``pred`` against ``gold``; the reason names the rule that decided."""
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError("the gold answer is empty; every OfficeQA question needs one")
    if isinstance(tolerance, bool) or not 0.0 <= float(tolerance) <= 1.0:
        raise ValueError(f"tolerance must be a relative error in [0, 1], got {tolerance!r}")
    tol = Decimal(str(float(tolerance)))
    answer = extract_final_answer(pred if isinstance(pred, str) else "")
    if not answer:
        return 0.0, "empty answer"
    if len([ln for ln in answer.splitlines() if ln.strip()]) > 1:
        return 0.0, "not a direct answer: more than one non-empty line"
    if len(answer) > MAX_ANSWER_CHARS:
        return 0.0, f"not a direct answer: longer than {MAX_ANSWER_CHARS} characters"
    if _MARKUP.search(answer):
        return 0.0, "not a direct answer: contains markup"
    g_nums, g_words = parse_answer(gold)
    p_nums, p_words = parse_answer(answer)
    if not g_nums:
        if p_nums:
            return 0.0, "gold is text-only but the answer holds numbers"
        ok = _text_only_form(gold) == _text_only_form(answer)
        return (1.0, "text match") if ok else (0.0, "text differs from the gold text")
    if not any(g.year_like for g in g_nums):
        p_nums = [p for p in p_nums if not p.year_like]
    is_list = len(g_nums) >= 2 and _bracket_body(gold) is not None
    chunks = _list_chunks(answer) if is_list else None
    if len(p_nums) != len(g_nums) and not (chunks and _segments(chunks, len(g_nums), lambda k, n: True)):
        return 0.0, f"number count differs: answer {len(p_nums)}, gold {len(g_nums)}"
    if is_list:
        ok = _ordered_match(g_nums, p_nums, tol) or bool(
            chunks and _segments(chunks, len(g_nums), lambda k, n: _num_match(g_nums[k], n, tol)))
    else:
        ok = len(p_nums) == len(g_nums) and _one_to_one(g_nums, p_nums, tol)
    if not ok:
        return 0.0, f"numbers differ: gold {g_nums}, answer {p_nums}"
    if g_words and not _contains_run(p_words, g_words):
        return 0.0, f"text part missing from the answer: {' '.join(g_words)!r}"
    return 1.0, "match"


def score_answer(gold: str, pred: str, tolerance: float = 0.0) -> float:
    """1.0 when ``pred`` answers ``gold`` under the rules of this module's docstring, else 0.0."""
    return judge(gold, pred, tolerance)[0]


def _final_message() -> str:
    path = os.environ.get(PAYLOAD_ENV)
    if not path:
        return ""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    msg = data.get("final_message") if isinstance(data, dict) else None
    return msg if isinstance(msg, str) else ""


def main(argv: list[str] | None = None) -> int:
    """Verifier entry point (as ``reward/check.py``): prints ``{"answer_correct": 0.0|1.0}``.

    Reads the agent's final message from the file named by ``OPENCLAW_REWARD_PAYLOAD`` and the
    gold answer from ``gold.json`` next to this file (``{"answer": str, "tolerance": float}``).
    A missing or broken gold file is the task's fault: it exits non-zero instead of scoring 0.
    """
    gold_path = Path(__file__).resolve().with_name(GOLD_FILE)
    try:
        gold = json.loads(gold_path.read_text(encoding="utf-8"))
        answer, tolerance = gold["answer"], float(gold.get("tolerance", 0.0))
        score, reason = judge(answer, _final_message(), tolerance)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"officeqa verifier: bad {gold_path}: {e}", file=sys.stderr)
        return 2
    # the rule only, never the gold numbers: verifier logs travel with the episode record
    print(f"officeqa verifier: {reason.split(':')[0]}", file=sys.stderr)
    print(json.dumps({"answer_correct": score}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
