"""Per-call prompt cost in the proxy: full render + splice vs incremental, by prompt length.

    python bench/bench_proxy_tokenize.py [--repeats 5] [--episode-calls 100]

A call here is what the proxy does before the policy sees a prompt: render the Qwen3 chat template,
tokenise, splice earlier sampled turns back in (``splice_prompt``), or the same through an episode's
:class:`~clawgym_env.proxy.incremental.PromptCache`, which renders and tokenises only what the
call appended. Conversations are agent-like: a system prompt and tools, then turns of one tool call
(sampled ids, spliced) and one tool result. Rows:

* ``1K``/``20K``/``64K``: a prompt of about that many tokens that appended one sampled turn and a
  tool result, ~500 tokens together, to the previous call's conversation (the cache holds that
  call); the last column is the floor: tokenising just the appended messages' text;
* ``episode``: a 100-call episode whose prompt grows by ~480 tokens a call from ~6K; per-call median
  and max (the first call has nothing to reuse), and the whole episode's total.

``--calls calls.jsonl`` also replays a captured episode (e.g. a real harness's), each call
against a cache that holds the call before it.

Both paths include ``normalize_messages`` over the request (the proxy does it first) and their ids
are checked equal on every call. Figures: min / median over ``--repeats`` runs (episodes:
``--episode-repeats``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import time
from types import SimpleNamespace

from clawgym_env.policy.chat_format import assistant_text, normalize_messages, parse_assistant
from clawgym_env.policy.tokenizer import load_tokenizer
from clawgym_env.proxy.incremental import PromptCache
from clawgym_env.proxy.splice import encoder, splice_prompt

WORDS = ("def", "return", "self", "value", "index", "path", "print(", "import", "os", "json", "=", "+", "(", ")",
         "{", "}", "[", "]", "for", "in", "if", "else", "True", "None", "données", "Größe", "数据", "résultat",
         "rows", "total", "config", "0", "1", "42", "3.14", "'name'", "\"key\"", "# note", "->", "::")
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name}: " + " ".join(WORDS[:30]),
    "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "the argument"}},
                   "required": ["arg"]}}} for name in ("Bash", "Read", "Write", "Edit", "Grep", "Glob")]


def filler(rng: random.Random, tokens: int) -> str:
    """Code-like text of roughly ``tokens`` tokens: keywords and fresh identifiers (a tokenizer's word
    cache would make a few repeated words unrealistically cheap)."""
    out, line = [], []
    for _ in range(tokens):
        if rng.random() < 0.5:
            line.append(rng.choice(WORDS))
        else:
            line.append("".join(rng.choice(string.ascii_letters + "_") for _ in range(rng.randint(3, 9))))
        if len(line) >= 12:
            out.append(" ".join(line))
            line = []
    return "\n".join(out + [" ".join(line)])


class Conversation:
    """An agent conversation and the calls that sampled its assistant turns."""

    def __init__(self, tokenizer, rng: random.Random, system_tokens: int) -> None:
        self.tok = tokenizer
        self.rng = rng
        self.messages: list[dict] = [{"role": "system", "content": filler(rng, system_tokens)},
                                     {"role": "user", "content": "Fix the failing test in this repository."}]
        self.calls: list[SimpleNamespace] = []

    def step(self, prompt_ids: list[int], result_tokens: int) -> None:
        """The policy answers the last prompt with one tool call; the harness appends it and its result."""
        n = len(self.calls)
        text = assistant_text("", None, [("Bash", {"arg": f"python3 step_{n}.py --verbose"})])
        out = self.tok.encode(text, add_special_tokens=False)
        message = parse_assistant(text).to_openai_message()
        self.calls.append(SimpleNamespace(prompt_token_ids=prompt_ids[-64:], output_token_ids=out,
                                          response_message=message))
        sent = json.loads(json.dumps(message))
        sent["tool_calls"][0]["id"] = f"toolu_{n}"
        self.messages += [sent, {"role": "tool", "tool_call_id": f"toolu_{n}",
                                 "content": filler(self.rng, result_tokens)}]


def full(tok, conv: Conversation) -> list[int]:
    ids, _, _ = splice_prompt(tok, normalize_messages(conv.messages), TOOLS, None, conv.calls)
    return ids


def incremental(tok, cache: PromptCache, conv: Conversation) -> list[int]:
    return cache.prompt(tok, normalize_messages(conv.messages), TOOLS, None, conv.calls).ids


def timed(fn, *args) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    ids = fn(*args)
    return (time.perf_counter() - t0) * 1e3, ids


def one_append(tok, target: int, repeats: int) -> tuple[list[float], list[float], list[float], int, int]:
    """(full ms, incremental ms, floor ms, prompt tokens, appended tokens) for a call appending ~500 tokens;
    the floor: tokenising the appended messages' text alone, nothing else."""
    rng = random.Random(target)
    conv = Conversation(tok, rng, min(2000, target // 8))
    builder = PromptCache()
    ids = incremental(tok, builder, conv)
    while len(ids) < target - 600:
        conv.step(ids, min(400, target - 600 - len(ids)) or 1)
        ids = incremental(tok, builder, conv)
    before = len(ids)
    conv.step(ids, 170)
    appended = "".join(str(m.get("content") or "") + json.dumps(m.get("tool_calls") or "") for m in conv.messages[-2:])
    encode = encoder(tok).encode
    full_ms, inc_ms, floor_ms = [], [], []
    for _ in range(repeats):
        ms, want = timed(full, tok, conv)
        full_ms.append(ms)
        primed = PromptCache()
        conv.messages, last = conv.messages[:-2], conv.messages[-2:]
        incremental(tok, primed, conv)
        conv.messages += last
        ms, got = timed(incremental, tok, primed, conv)
        assert got == want, "incremental ids differ from the full render"
        inc_ms.append(ms)
        floor_ms.append(timed(encode, appended)[0])
    return full_ms, inc_ms, floor_ms, len(want), len(want) - before


def episode(tok, calls: int, seed: int) -> tuple[list[float], list[float], int, int]:
    """Per-call ms of a ``calls``-call episode, full and incremental, and the first and last prompts' lengths."""
    rng = random.Random(seed)
    conv = Conversation(tok, rng, 2500)
    cache = PromptCache()
    full_ms, inc_ms, lengths = [], [], []
    for _ in range(calls):
        ms_full, want = timed(full, tok, conv)
        ms_inc, got = timed(incremental, tok, cache, conv)
        assert got == want, "incremental ids differ from the full render"
        full_ms.append(ms_full)
        inc_ms.append(ms_inc)
        lengths.append(len(want))
        conv.step(want, 160)
    return full_ms, inc_ms, lengths[0], lengths[-1]


def replay(tok, path: str, repeats: int) -> list[tuple[int, int, list[float], list[float]]]:
    """(prompt tokens, reused, full ms, incremental ms) per call of a captured ``calls.jsonl``, each request
    replayed through its dialect's parser against the calls before it."""
    from clawgym_env.capture.records import read_calls
    from clawgym_env.proxy.dialects.registry import spec

    calls = read_calls(path)
    requests = [spec(c.dialect).load().parse_request(c.request) for c in calls]
    rows = []
    for i, req in enumerate(requests):
        full_ms, inc_ms = [], []
        for _ in range(repeats):
            cache = PromptCache()
            if i:
                prev = requests[i - 1]
                cache.prompt(tok, normalize_messages(prev.messages), prev.tools or None, prev.enable_thinking,
                             calls[:i - 1])
            before = calls[:i]
            t0 = time.perf_counter()
            want = splice_prompt(tok, normalize_messages(req.messages), req.tools or None, req.enable_thinking,
                                 before)[0]
            t1 = time.perf_counter()
            got = cache.prompt(tok, normalize_messages(req.messages), req.tools or None, req.enable_thinking, before)
            t2 = time.perf_counter()
            full_ms.append((t1 - t0) * 1e3)
            inc_ms.append((t2 - t1) * 1e3)
            assert got.ids == want, "incremental ids differ from the full render"
        rows.append((len(want), got.reused, full_ms, inc_ms))
    return rows


def fmt(values: list[float]) -> str:
    return f"{min(values):8.2f} / {statistics.median(values):8.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--episode-calls", type=int, default=100)
    ap.add_argument("--episode-repeats", type=int, default=3)
    ap.add_argument("--calls", action="append", default=[], metavar="CALLS_JSONL",
                    help="also replay a captured episode's calls.jsonl (repeatable)")
    args = ap.parse_args()
    tok = load_tokenizer()
    for path in args.calls:
        print(f"\n{path}\n\n| call | tokens | reused | full ms (min / median) | incremental ms (min / median) |")
        print("|---|---|---|---|---|")
        for k, (n, reused, f, i) in enumerate(replay(tok, path, args.repeats)):
            print(f"| {k} | {n} | {reused} | {fmt(f)} | {fmt(i)} |")
        print()
    print("| prompt | tokens | appended | full ms (min / median) | incremental ms (min / median) | speed-up "
          "| floor: tokenise the appended text alone, ms |")
    print("|---|---|---|---|---|---|---|")
    for label, target in (("1K", 1000), ("20K", 20000), ("64K", 64000)):
        f, i, floor, n, added = one_append(tok, target, args.repeats)
        print(f"| {label} | {n} | {added} | {fmt(f)} | {fmt(i)} | {statistics.median(f) / statistics.median(i):.0f}x "
              f"| {fmt(floor)} |")
    runs = [episode(tok, args.episode_calls, seed) for seed in range(args.episode_repeats)]
    first, last = runs[0][2], runs[0][3]
    growth = (last - first) / max(1, args.episode_calls - 1)
    for name, k in (("per-call median", 0), ("per-call max", 1), ("episode total", 2)):
        agg = [statistics.median, max, sum][k]
        f = [agg(r[0]) for r in runs]
        i = [agg(r[1]) for r in runs]
        print(f"| {args.episode_calls}-call episode, {name} | {first}→{last} | ~{growth:.0f}/call | {fmt(f)} "
              f"| {fmt(i)} | {statistics.median(f) / statistics.median(i):.0f}x | |")


if __name__ == "__main__":
    main()
