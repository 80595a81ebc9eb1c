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
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from clawgym_env.policy.chat_format import content_to_text, render_prompt_text

ASSISTANT_OPEN = "<|im_start|>assistant\n"
IM_END = "<|im_end|>"


def _canonical_args(args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return args.strip()
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def turn_key(message: dict[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What identifies an assistant turn across a harness's rewrites."""
    calls = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function", tc)
        calls.append((str(fn.get("name", "")), _canonical_args(fn.get("arguments", "{}"))))
    return content_to_text(message.get("content")).strip(), tuple(calls)


def _assistant_spans(text: str) -> list[tuple[int, int]]:
    """(start of content, end after ``<|im_end|>``) of every complete assistant turn in ``text``."""
    spans, pos = [], 0
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


def _generation_tail(tokenizer, prompt_ids: Sequence[int]) -> list[int]:
    """Ids after the last ``<|im_start|>assistant\\n`` of a prompt (e.g. an empty think block)."""
    opener = tokenizer.encode(ASSISTANT_OPEN, add_special_tokens=False)
    n = len(opener)
    for i in range(len(prompt_ids) - n, -1, -1):
        if list(prompt_ids[i:i + n]) == opener:
            return list(prompt_ids[i + n:])
    return []


def splice_prompt(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  enable_thinking: bool | None, previous_calls: Sequence[Any]) -> tuple[list[int], bool, str | None]:
    """Prompt ids for ``messages`` with earlier sampled assistant turns spliced in.

    Returns ``(prompt_ids, token_exact, reason)``; ``previous_calls`` are this episode's
    :class:`~clawgym_env.capture.records.CallRecord` so far (in order).
    """
    text = render_prompt_text(tokenizer, messages, tools, enable_thinking)
    assistants = [m for m in messages if m.get("role") == "assistant"]
    if not assistants:
        return list(tokenizer.encode(text, add_special_tokens=False)), True, None
    spans = _assistant_spans(text)
    if len(spans) != len(assistants):
        return (list(tokenizer.encode(text, add_special_tokens=False)), False,
                f"could not align {len(assistants)} assistant turns with {len(spans)} rendered turns")
    by_key: dict[tuple, Any] = {}
    for call in previous_calls:
        if call.output_token_ids:
            by_key[turn_key(call.response_message)] = call  # the latest call with that response wins
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    ids: list[int] = []
    missed: list[int] = []
    pos = 0
    for k, (msg, (body, end)) in enumerate(zip(assistants, spans)):
        call = by_key.get(turn_key(msg))
        if call is None:
            missed.append(k)
            continue
        opener_end = body - len(ASSISTANT_OPEN)
        ids += tokenizer.encode(text[pos:opener_end], add_special_tokens=False)
        ids += tokenizer.encode(ASSISTANT_OPEN, add_special_tokens=False)
        ids += _generation_tail(tokenizer, call.prompt_token_ids)
        ids += list(call.output_token_ids)
        if call.output_token_ids[-1] != im_end:
            ids.append(im_end)  # a cut-off output: the turn is closed as context
        pos = end
    ids += tokenizer.encode(text[pos:], add_special_tokens=False)
    if missed:
        return ids, False, (f"assistant turn(s) {missed} of {len(assistants)} match no sampled output of this "
                            "episode; rendered from text")
    return ids, True, None
