"""OfficeQA answer scorer: standard library only, self-contained.

This one file is both the library scorer (``tasks.officeqa`` imports it) and, copied verbatim as
``reward/check.py``, the hermetic verifier of every OfficeQA task (see :func:`main`). It must never
import anything outside the Python standard library.

The reference is the official OfficeQA reward function, ``reward.py`` of databricks/officeqa
(``score_answer(ground_truth, predicted, tolerance)``). Scores must EQUAL what it gives; every rule
below restates upstream behaviour in our own words (our own implementation, not a copy).

``score_answer(gold, pred, tolerance=0.0)`` returns 1.0 or 0.0 by these rules, applied in order:

1. **Extraction** (upstream). The answer is the text of the LAST ``<FINAL_ANSWER>…</FINAL_ANSWER>``
   pair (tag names case-insensitive), stripped; when the reply holds no such pair, the whole reply.
   An empty answer scores 0.
2. **Direct answer only** (upstream). The answer is rejected (0) when it has more than one
   non-empty line or is longer than 250 characters. For a gold answer with numbers, it is also
   rejected when it contains anything shaped like a tag (``<`` … ``>``, e.g. ``<b>``).
3. **Normalisation** (upstream; gold and answer alike): the Unicode minus sign ``−`` becomes ``-``;
   whitespace is collapsed; accounting parentheses mean negative (``(1,234)`` and ``($1,234)`` are
   ``-1234``; a bare whole number from 1900 to 2100 in parentheses such as ``(1977)`` is left alone);
   currency signs (``$ £ € ¥ ₹ ¢ ₩ ₽``) are dropped; thousands separators are removed from
   well-formed groups only (``1,234,567``; ``44.00,231.52`` is two numbers). A number is an optional
   ``-`` directly before digits, with an optional decimal part and ``%``; the percent sign (and the
   word ``percent``) never scales the value (``12.5%`` == ``12.5``).
4. **Units** (upstream). Each number takes a unit from the 20 characters on either side of it (after
   the normalisation above): the first found of trillion(s); billion(s) or a standalone ``b``;
   million(s) or a standalone ``m``; thousand(s) or a standalone ``k`` (any case). Units are NEVER
   multiplied out (``36,080 million`` is 36080 and does not equal ``36080000000``). Two numbers
   agree on units when either has none or both have the same one (``997.3 billion`` vs ``997.3
   million`` disagree; ``$140.9B`` has no unit, since ``b`` there is not a separate word).
5. **Year-like numbers and number count** (upstream). A year-like number is a whole number from
   1900 to 2100 (``1934``, ``1934.0``, ``1,950``). Year-like numbers in the answer are ignored when the
   gold answer is one number that is neither year-like nor accompanied by text, or several numbers
   none of which is year-like (``507 in FY 1934`` answers ``507``; ``August 5, 1986`` does not answer
   ``August 5``). After that the answer must hold exactly as many numbers as the gold answer, except
   that a bracketed gold *list* (rule 6) may instead be matched by a comma segmentation of the
   answer into that many numbers (``[8,152,260]`` answers ``[8, 152260]``). Otherwise 0.
6. **Number match** (upstream). Two numbers match when their units agree and ``|pred - gold| /
   |gold| <= tolerance`` (floating point, as upstream; a gold 0 needs exactly 0). A gold answer is a
   *list* when it is one ``[...]`` with no digits outside it and at least two numbers, each of its
   comma-separated items being a plain number (e.g. ``[0.096, -184.143]``, but not ``[2.59%, 2.34%,
   Decreased]``). A list is matched in order, by the answer's numbers or by a comma segmentation of
   the answer. Otherwise, with several gold numbers, every gold number must equal SOME answer number
   (any order, and not one-to-one: ``5 and 5`` is answered by ``5 and 6``, the count rule still
   applies); with one gold number, the answer's number must match it.
7. **Text parts** (upstream; not checked for lists). The text of an answer is what is left after
   removing numbers, commas, the words trillion/billion/million/thousand/hundred (singular or plural),
   percent and percentage, and punctuation, lower-cased with whitespace collapsed; shorter than two
   characters counts as no text. When the gold answer has text, the answer must have text too, and
   one of the two texts must be a substring of the other (``Aug 1986`` answers ``August 1986``;
   ``April 3, 1977`` does not answer ``March 3, 1977``).
8. **Text-only gold** (upstream). A gold answer with no number needs an answer with no number whose
   normalised form is equal: stripped, lower-cased, surrounding double then single quotes removed,
   parenthetical asides removed, whitespace collapsed. Punctuation is kept (``Secretary.`` differs
   from ``Secretary``).
9. **Refusals** (upstream). An answer containing ``unable to determine`` (any case) scores 0.

Invariants: the result is exactly 0.0 or 1.0; malformed *answers* never raise (they score 0). A bad
``tolerance`` (outside [0, 1]) or an empty gold answer raises ``ValueError``: those are the caller's
bugs, not the agent's (upstream scores them 0; this is the one deliberate difference).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

MAX_ANSWER_CHARS = 250
GOLD_FILE = "gold.json"
PAYLOAD_ENV = "OPENCLAW_REWARD_PAYLOAD"
REFUSAL = "unable to determine"

_TAG_PAIR = re.compile(r"<FINAL_ANSWER>(.*?)</FINAL_ANSWER>", re.IGNORECASE | re.DOTALL)
_MARKUP = re.compile(r"<[^>]*>")
_CURRENCY = "$£€¥₹¢₩₽"
_PAREN_NUMBER = re.compile(rf"\(\s*([{_CURRENCY}])?\s*(\d{{1,3}}(?:,\d{{3}})*(?:\.\d+)?|\d+(?:\.\d+)?)\s*\)")
_GROUPED = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)")
_TOKEN = re.compile(r"-?\d+\.?\d*%?")
_LIST_ITEM = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?")
_UNIT_TESTS = (("trillion", re.compile(r"\btrillions?\b")),
               ("billion", re.compile(r"\bbillions?\b|\bb\b")),
               ("million", re.compile(r"\bmillions?\b|\bm\b")),
               ("thousand", re.compile(r"\bthousands?\b|\bk\b")))
_TEXT_FILLER = re.compile(r"\b(?:trillions?|billions?|millions?|thousands?|hundreds?|percent|percentage)\b")
_CONTEXT = 20

Num = tuple  # (value: float, unit: str | None)


def extract_final_answer(reply: str) -> str:
    """Rule 1: the last FINAL_ANSWER pair's text, else the whole reply (stripped)."""
    pairs = _TAG_PAIR.findall(reply or "")
    return (pairs[-1] if pairs else (reply or "")).strip()


def _squash(text: str) -> str:
    return " ".join(text.replace("\u2212", "-").split())


def _is_year(value: float) -> bool:
    return math.isfinite(value) and 1900 <= value <= 2100 and value == int(value)


def _plain(text: str) -> str:
    """Rule 3: minus sign, whitespace, accounting parentheses, currency signs."""

    def accounting(m: re.Match) -> str:
        if m.group(1) is None and _is_year(float(m.group(2).replace(",", ""))):
            return m.group(0)  # "(1977)" is a year aside, not a negative number
        return "-" + m.group(2)

    return re.sub(f"[{re.escape(_CURRENCY)}]", "", _PAREN_NUMBER.sub(accounting, _squash(text)))


def _unit(context: str) -> str | None:
    return next((name for name, pattern in _UNIT_TESTS if pattern.search(context)), None)


def parse_numbers(text: str) -> list[Num]:
    """Rules 3–4: the numbers of ``text`` in order, each with the unit found around it."""
    s = _GROUPED.sub(lambda m: m.group().replace(",", ""), _plain(text))
    return [(float(m.group().rstrip("%")), _unit(s[max(0, m.start() - _CONTEXT):m.end() + _CONTEXT].lower()))
            for m in _TOKEN.finditer(s)]


def text_part(text: str) -> str:
    """Rule 7: the text left once numbers, unit words and punctuation are gone ('' when < 2 chars)."""
    s = _TOKEN.sub("", _squash(text).lower()).replace(",", "")
    s = " ".join(re.sub(r"[^\w\s]", " ", _TEXT_FILLER.sub("", s)).split())
    return s if len(s) >= 2 else ""


def _texts_agree(gold: str, answer: str) -> bool:
    g = text_part(gold)
    if not g:
        return True
    p = text_part(answer)
    return bool(p) and (g in p or p in g)


def _direct_text(text: str) -> str:
    """Rule 8's normal form (punctuation kept)."""
    s = text.strip().lower().strip('"').strip("'")
    return " ".join(re.sub(r"\([^)]*\)", "", s).split())


def _bracket_body(text: str) -> str | None:
    """The inside of the text's only ``[...]`` when no digit lies outside it."""
    s = _squash(text)
    found = list(re.finditer(r"\[([^\[\]]+)\]", s))
    if len(found) != 1:
        return None
    return None if re.search(r"\d", s[:found[0].start()] + s[found[0].end():]) else found[0].group(1)


def _list_item(raw: str) -> float | None:
    item = raw.strip()
    if not item or ("," in item and re.search(r"\s,|,\s", item)):
        return None
    item = _plain(item)
    return float(item.rstrip("%").replace(",", "")) if _LIST_ITEM.fullmatch(item) else None


def _segments(text: str, count: int, accept) -> bool:
    """True when the comma chunks of the text's bracketed body (or of the whole text) regroup, in
    order, into exactly ``count`` plain numbers, the k-th of which satisfies ``accept(k, value)``
    (memoised over (chunk, item) positions: polynomial, not exponential)."""
    if count < 2:
        return False
    body = _bracket_body(text)
    chunks = (body if body is not None else _squash(text)).split(",")
    if len(chunks) < count:
        return False
    memo: dict[tuple[int, int], bool] = {}

    def fits(start: int, k: int) -> bool:
        if k == count:
            return start == len(chunks)
        if (start, k) not in memo:
            memo[(start, k)] = False
            for end in range(start + 1, len(chunks) - (count - k - 1) + 1):
                value = _list_item(",".join(chunks[start:end]))
                if value is not None and accept(k, value) and fits(end, k + 1):
                    memo[(start, k)] = True
                    break
        return memo[(start, k)]

    return fits(0, 0)


def _is_gold_list(gold: str, g_nums: list[Num]) -> bool:
    body = _bracket_body(gold)
    values = [v for v, _ in g_nums]
    return len(values) >= 2 and body is not None and _segments(body, len(values), lambda k, v: v == values[k])


def _drop_years(gold: str, g_nums: list[Num], p_nums: list[Num]) -> list[Num]:
    if len(g_nums) == 1:
        keep = _is_year(g_nums[0][0]) or bool(text_part(gold))
    else:
        keep = any(_is_year(v) for v, _ in g_nums)
    return p_nums if keep else [p for p in p_nums if not _is_year(p[0])]


def _num_match(gold: Num, pred: Num, tol: float) -> bool:
    (g, g_unit), (p, p_unit) = gold, pred
    if g_unit is not None and p_unit is not None and g_unit != p_unit:
        return False
    if g == 0:
        return p == 0
    return abs(g - p) / abs(g) <= tol


def _judge(gold: str, answer: str, tol: float) -> tuple[float, str]:
    g_nums, p_all = parse_numbers(gold), parse_numbers(answer)
    if not g_nums:
        if p_all:
            return 0.0, "gold is text-only but the answer holds numbers"
        if _direct_text(gold) != _direct_text(answer):
            return 0.0, "text differs from the gold text"
        if REFUSAL in answer.lower():
            return 0.0, "refusal: unable to determine"
        return 1.0, "text match"
    is_list = _is_gold_list(gold, g_nums)
    p_nums = _drop_years(gold, g_nums, p_all)
    if len(p_nums) != len(g_nums) and not (is_list and _segments(answer, len(g_nums), lambda k, v: True)):
        return 0.0, f"number count differs: answer {len(p_nums)}, gold {len(g_nums)}"
    if _MARKUP.search(answer):
        return 0.0, "not a direct answer: contains markup"
    if REFUSAL in answer.lower():
        return 0.0, "refusal: unable to determine"
    if is_list:
        ok = _segments(answer, len(g_nums), lambda k, v: _num_match(g_nums[k], (v, None), tol)) or (
            len(p_nums) == len(g_nums) and all(_num_match(g, p, tol) for g, p in zip(g_nums, p_nums)))
        return (1.0, "list match") if ok else (0.0, "numbers differ from the gold list")
    if not all(any(_num_match(g, p, tol) for p in p_nums) for g in g_nums):
        return 0.0, "numbers differ from the gold numbers"
    if not _texts_agree(gold, answer):
        return 0.0, "text part differs from the gold text"
    return 1.0, "match"


def judge(gold: str, pred: str, tolerance: float = 0.0) -> tuple[float, str]:
    """(score, reason) for ``pred`` against ``gold``; the reason names the rule that decided."""
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError("the gold answer is empty; every OfficeQA question needs one")
    if isinstance(tolerance, bool) or not 0.0 <= float(tolerance) <= 1.0:
        raise ValueError(f"tolerance must be a relative error in [0, 1], got {tolerance!r}")
    answer = extract_final_answer(pred if isinstance(pred, str) else "")
    if not answer:
        return 0.0, "empty answer"
    if len([ln for ln in answer.splitlines() if ln.strip()]) > 1:
        return 0.0, "not a direct answer: more than one non-empty line"
    if len(answer) > MAX_ANSWER_CHARS:
        return 0.0, f"not a direct answer: longer than {MAX_ANSWER_CHARS} characters"
    try:
        return _judge(gold, answer, float(tolerance))
    except (ValueError, OverflowError, ArithmeticError):  # upstream scores unparsable input 0
        return 0.0, "unparsable answer"


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
