"""Incremental prompts: a call costs what it appended to the conversation, not the whole history.

A harness resends the whole history on every call; rendering the chat template over it and
tokenising the result grows with the conversation. A :class:`PromptCache` (one per episode) keeps the
last few prompts it built — the normalised messages, tools and template flags, the spliced ids, and
the id offset where each message's turn starts — and, when a request repeats one of them as a prefix,
takes the ids of that prefix as they were and renders and tokenises only the rest.

Invariant: :meth:`PromptCache.prompt` returns exactly what
:func:`~clawgym_env.proxy.splice.splice_prompt` (full render, then splice) returns for the same
request and calls — ids, ``token_exact`` and reason. The reuse is taken only where that is certain:

* the template is one whose rendering of a message depends only on that message, its neighbours'
  roles, whether it is the last one, and where the last real user query is (Qwen3's: see
  ``LOCAL_TEMPLATES``); any other template always takes the full path;
* the ids are cut just before a turn's ``<|im_start|>`` (a special token, never merged with its
  neighbours, so tokenising on either side of it changes no id), never inside a tool-response group;
* the turn before the cut renders the same in both conversations (a tool response is closed the
  same way, an assistant turn is the last one in both or in neither), and no assistant turn before it
  whose ids come from its text changes how it renders because the last real user query moved (Qwen3
  drops the reasoning of turns before it; a spliced turn's ids do not depend on its text);
* no call that only one of the two splices saw (recorded since the kept prompt was built, or, for
  a request that raced ahead, recorded before it but missing from the request's snapshot) sampled
  a turn equal to an assistant turn before the cut with other ids (splicing takes the latest such
  call: a repeated identical turn changes nothing, the same turn with other reasoning does).

The rest is rendered by the same template, as the messages after the cut preceded by one stand-in
user turn that keeps the last real query where it was, and that stand-in is cut off. Anything else
(an edited or compacted history, changed tools or system prompt, a template that is not local, a
request that cannot be aligned) takes the full path. Memory: at most ``max_states`` prompts per
episode, dropped with the session.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.chat_format import content_to_text, render_prompt_text
from clawgym_env.proxy.splice import (
    TurnKey,
    assistant_spans,
    misaligned_reason,
    missed_reason,
    splice_region,
    turn_ids,
    turn_key,
)

if TYPE_CHECKING:
    from clawgym_env.policy.hf import Tokenizer

IM_START = "<|im_start|>"
# sha256 of chat templates whose per-message rendering is local in the sense above (Qwen3's).
LOCAL_TEMPLATES = frozenset({"87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"})
_ROLES = ("system", "user", "assistant", "tool")
_QUERY_STANDIN = "x"  # a real user query
_NO_QUERY_STANDIN = "<tool_response>\n</tool_response>"  # a user turn the template does not count as a query


@dataclasses.dataclass(frozen=True)
class PromptIds:
    """A prompt's ids as :func:`~clawgym_env.proxy.splice.splice_prompt` gives them, and how many were reused."""

    ids: list[int]
    token_exact: bool
    reason: str | None
    reused: int = 0  # leading ids taken from an earlier call's prompt without rendering them again


@dataclasses.dataclass(frozen=True)
class _Prompt:
    """One built prompt, kept to be extended: never mutated after it is made."""

    messages: list[JSONObject]
    tools: list[JSONObject] | None
    enable_thinking: bool | None
    last_query: int | None
    ids: list[int]
    starts: dict[int, int]  # message index -> id offset where its turn starts; len(messages): the generation prompt
    turns: list[tuple[int, TurnKey, Any]]  # (message index, key, call spliced from or None) per assistant turn
    missed: list[int]  # ordinals of the assistant turns rendered from text
    calls_seen: int  # how many recorded calls the splice looked at


def template_is_local(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer's chat template is one the incremental path is proven for."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and _template_hash(template) in LOCAL_TEMPLATES


@functools.lru_cache(maxsize=8)
def _template_hash(template: str) -> str:
    return hashlib.sha256(template.encode()).hexdigest()


@functools.lru_cache(maxsize=16)
def _standin_text(template: str, content: str, tokenizer: Any) -> str:
    """How the template renders the stand-in user turn alone (cached per template)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=False)
    return text if isinstance(text, str) else ""


def last_query(messages: Sequence[JSONObject]) -> int | None:
    """Index of the last user message that is not only a ``<tool_response>`` (None: there is none)."""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.get("role") == "user":
            content = content_to_text(msg.get("content"))
            if not (content.startswith("<tool_response>") and content.endswith("</tool_response>")):
                return i
    return None


def _quoted(msg: JSONObject) -> int | None:
    """How many ``<|im_start|>`` the template copies from this message's own strings into its turn
    (None: not certain, e.g. quoted in reasoning the template may drop)."""
    content = content_to_text(msg.get("content"))
    n = content.count(IM_START)
    if msg.get("role") != "assistant":
        return n
    reasoning = msg.get("reasoning_content")
    if (IM_START in str(reasoning or "")) or (n and reasoning is None and "</think>" in content):
        return None
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function", tc)
        args = fn.get("arguments")
        n += str(fn.get("name")).count(IM_START)
        n += (args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)).count(IM_START)
    return n


def _turns(messages: Sequence[JSONObject], first: int,
           tools: list[JSONObject] | None) -> list[tuple[int, int]] | None:
    """(message index, ``<|im_start|>`` quoted inside) of every turn from ``first`` on, in order (-1: the
    tools header; ``len(messages)``: the generation prompt). None when a role renders nothing or a
    count is not certain."""
    out: list[tuple[int, int]] = []
    if tools:
        out.append((-1, json.dumps(tools, ensure_ascii=False).count(IM_START)))
    for i in range(first, len(messages)):
        role = messages[i].get("role")
        quoted = _quoted(messages[i])
        if role not in _ROLES or quoted is None:
            return None
        in_header = i == 0 and role == "system" and bool(tools)
        continued = role == "tool" and i > 0 and messages[i - 1].get("role") == "tool"
        if (in_header or continued) and out:
            out[-1] = (out[-1][0], out[-1][1] + quoted)  # inside the tools header / the same tool-response turn
        else:
            out.append((i, quoted))
    out.append((len(messages), 0))
    return out


def _cuts(text: str, turns: list[tuple[int, int]] | None) -> tuple[list[int], list[int]]:
    """(message indices, text offsets) where the turns start, or nothing when ``text`` does not hold the
    ``<|im_start|>`` the template writes plus those the messages quote."""
    if turns is None:
        return [], []
    offsets, pos = [], text.find(IM_START)
    while pos >= 0:
        offsets.append(pos)
        pos = text.find(IM_START, pos + len(IM_START))
    if len(offsets) != sum(1 + quoted for _, quoted in turns):
        return [], []
    indices, cuts, k = [], [], 0
    for i, quoted in turns:
        if i >= 0:
            indices.append(i)
            cuts.append(offsets[k])
        k += 1 + quoted
    return indices, cuts


def _moved(state: _Prompt, messages: list[JSONObject], query: int | None) -> list[int]:
    """Assistant turns whose ids may change because the last query moved: those between the two queries
    that were rendered from text, or whose text could shift the alignment of the rendered turns."""
    queries = [q for q in (query, state.last_query) if q is not None]
    low, high = min(queries), (max(queries) if len(queries) == 2 else len(messages))
    from_text = {state.turns[k][0] for k in state.missed}
    out = []
    for i, _, _ in state.turns:
        if low < i <= high:
            msg = messages[i] if i < len(messages) else state.messages[i]
            if i in from_text or "<|im_" in content_to_text(msg.get("content")) + str(msg.get("reasoning_content")):
                out.append(i)
    return out


def _same_ids(tokenizer: Tokenizer, old: Any, new: Any) -> bool:
    """Whether splicing from call ``new`` instead of ``old`` gives the same ids (None: rendered from text)."""
    if old is new:
        return True
    return old is not None and new is not None and turn_ids(tokenizer, old) == turn_ids(tokenizer, new)


def _common_prefix(a: Sequence[JSONObject], b: Sequence[JSONObject]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PromptCache:
    """One episode's recent prompts and the turn keys of its calls (thread safe)."""

    def __init__(self, max_states: int = 4) -> None:
        self.max_states = max_states
        self._states: list[_Prompt] = []  # most recently used first
        self._keys: list[TurnKey | None] = []  # per recorded call: its turn key (None: no sampled ids)
        self._where: dict[TurnKey, list[int]] = {}  # turn key -> indices of the calls with it, ascending
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every kept prompt (the turn keys of the calls stay valid)."""
        with self._lock:
            self._states = []

    def prompt(self, tokenizer: Tokenizer, messages: list[JSONObject], tools: list[JSONObject] | None,
               enable_thinking: bool | None, previous_calls: Sequence[Any]) -> PromptIds:
        """What :func:`~clawgym_env.proxy.splice.splice_prompt` returns, reusing a kept prefix when certain.

        ``messages`` as :func:`~clawgym_env.policy.chat_format.normalize_messages` gives them (other
        shapes are still exact, only never reused)."""
        calls = list(previous_calls)
        tools = tools or None
        with self._lock:
            self._learn(calls)
            states = list(self._states)
        local = template_is_local(tokenizer)
        if messages and local:
            query = last_query(messages)
            for state, cut, whole in self._candidates(tokenizer, states, messages, tools, enable_thinking, query,
                                                      calls):
                built = self._extend(tokenizer, state, cut, whole, messages, enable_thinking, query, calls)
                if built is not None:
                    return built
        return self._full(tokenizer, messages, tools, enable_thinking, calls, keep=local)

    # -- the calls' turn keys -------------------------------------------------------------------

    def _learn(self, calls: list[Any]) -> None:
        for i in range(len(self._keys), len(calls)):  # calls are append-only: only the new ones
            key = turn_key(calls[i].response_message) if calls[i].output_token_ids else None
            self._keys.append(key)
            if key is not None:
                self._where.setdefault(key, []).append(i)

    def _resolver(self, calls: list[Any]) -> Callable[[TurnKey], Any]:
        n = len(calls)

        def resolve(key: TurnKey) -> Any:
            with self._lock:
                where = self._where.get(key)
                k = bisect.bisect_left(where, n) - 1 if where else -1
                return calls[where[k]] if where and k >= 0 else None

        return resolve

    # -- the full path --------------------------------------------------------------------------

    def _full(self, tokenizer: Tokenizer, messages: list[JSONObject], tools: list[JSONObject] | None,
              enable_thinking: bool | None, calls: list[Any], keep: bool) -> PromptIds:
        text = render_prompt_text(tokenizer, messages, tools, enable_thinking)
        assistants = [m for m in messages if m.get("role") == "assistant"]
        indices, cuts = _cuts(text, _turns(messages, 0, tools))
        spliced = splice_region(tokenizer, text, assistants, self._resolver(calls), cuts)
        if spliced is None:  # nothing kept: its ids were not spliced
            return PromptIds(list(tokenizer.encode(text, add_special_tokens=False)), False,
                             misaligned_reason(len(assistants), len(assistant_spans(text))))
        starts = {i: mark for i, mark in zip(indices, spliced.marks) if mark is not None}
        turns = [(i, turn_key(m), call) for (i, m), call in
                 zip(((i, m) for i, m in enumerate(messages) if m.get("role") == "assistant"), spliced.used)]
        if keep:
            self._keep(_Prompt(messages, tools, enable_thinking, last_query(messages), spliced.ids, starts, turns,
                               spliced.missed, len(calls)))
        reason = missed_reason(spliced.missed, len(assistants))
        return PromptIds(spliced.ids, reason is None, reason)

    def _keep(self, state: _Prompt, replaces: _Prompt | None = None) -> None:
        """Keep ``state`` first, dropping ``replaces`` (a kept prompt whose messages it all repeats)."""
        if not state.starts:
            return
        with self._lock:
            rest = [s for s in self._states if s is not replaces]
            self._states = [state] + rest[: self.max_states - 1]

    # -- the incremental path -------------------------------------------------------------------

    def _candidates(self, tokenizer: Tokenizer, states: list[_Prompt], messages: list[JSONObject],
                    tools: list[JSONObject] | None, enable_thinking: bool | None, query: int | None,
                    calls: list[Any]) -> list[tuple[_Prompt, int, bool]]:
        """Kept prompts this request extends: (prompt, message index to cut at, whether the request repeats
        all its messages), longest reuse first."""
        found = []
        n_calls = len(calls)
        for state in states:
            if state.enable_thinking != enable_thinking or state.tools != tools:
                continue
            limit = _common_prefix(state.messages, messages)
            whole = limit == len(state.messages)
            if query != state.last_query:  # turns between the two queries may render otherwise
                limit = min([limit] + _moved(state, messages, query))
            with self._lock:  # calls one of the two splices saw and the other did not (either way round)
                seen = range(min(state.calls_seen, n_calls), max(state.calls_seen, n_calls))
                fresh = {self._keys[i] for i in seen} - {None}
            if fresh:
                resolve = self._resolver(calls)
                limit = min([limit] + [i for i, key, used in state.turns
                                       if key in fresh and not _same_ids(tokenizer, used, resolve(key))])
            cut = self._cut(state, messages, limit)
            if cut > 0:
                found.append((state, cut, whole))
                if whole:
                    break  # the request extends all of it (the latest of its conversation)
        return sorted(found, key=lambda sc: -sc[1])

    @staticmethod
    def _cut(state: _Prompt, messages: list[JSONObject], limit: int) -> int:
        """The largest message index <= ``limit`` where both conversations can be cut (0: none)."""
        kept = state.messages
        for j in range(limit, 0, -1):
            if j not in state.starts:
                continue
            role = messages[j - 1].get("role")
            after_kept = kept[j].get("role") if j < len(kept) else None
            after_new = messages[j].get("role") if j < len(messages) else None
            if after_new == "tool" and role == "tool":
                continue  # inside a tool-response turn
            if role == "tool" and (after_kept == "tool") != (after_new == "tool"):
                continue  # that turn is closed in one and continued in the other
            if role == "assistant" and (after_kept is None) != (after_new is None):
                continue  # the last message in one, not in the other
            return j
        return 0

    def _extend(self, tokenizer: Tokenizer, state: _Prompt, cut: int, whole: bool, messages: list[JSONObject],
                enable_thinking: bool | None, query: int | None, calls: list[Any]) -> PromptIds | None:
        standin = {"role": "user", "content": _QUERY_STANDIN if query is not None and query < cut
                   else _NO_QUERY_STANDIN}
        rest = messages[cut:]
        head = _standin_text(tokenizer.chat_template, standin["content"], tokenizer)
        text = render_prompt_text(tokenizer, [standin, *rest], None, enable_thinking)
        if not head or not text.startswith(head):
            return None
        text = text[len(head):]
        turns_after = _turns(messages, cut, None)
        if turns_after is not None and turns_after[0][0] != cut:
            return None  # the cut is not where a turn starts
        indices, cuts = _cuts(text, turns_after)
        assistants = [m for m in rest if m.get("role") == "assistant"]
        spliced = splice_region(tokenizer, text, assistants, self._resolver(calls), cuts)
        if spliced is None:
            return None  # the full path says why
        base = state.starts[cut]
        ids = state.ids[:base] + spliced.ids
        before = sum(1 for i, _, _ in state.turns if i < cut)
        missed = [k for k in state.missed if k < before] + [before + k for k in spliced.missed]
        starts_out = {i: at for i, at in state.starts.items() if i <= cut}
        starts_out.update({i: base + mark for i, mark in zip(indices, spliced.marks) if mark is not None})
        turns = [turn for turn in state.turns if turn[0] < cut]
        turns += [(i, turn_key(m), call) for (i, m), call in
                  zip(((i, m) for i, m in enumerate(messages) if i >= cut and m.get("role") == "assistant"),
                      spliced.used)]
        self._keep(_Prompt(messages, state.tools, enable_thinking, query, ids, starts_out, turns, missed, len(calls)),
                   replaces=state if whole else None)
        reason = missed_reason(missed, before + len(assistants))
        return PromptIds(ids, reason is None, reason, reused=base)
