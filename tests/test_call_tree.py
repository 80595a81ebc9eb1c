"""Call trees over real Qwen3 token ids: shapes, flags, statistics, serialisation, rendering.

Synthetic calls are rendered with the real tokenizer and chat template; every tree is checked against
an independent oracle (an uncompressed one-node-per-token trie) and the analytic minimal size.
"""

from __future__ import annotations

import json
import random

import pytest

from clawgym_env.capture.records import CallRecord, EpisodeRecord, write_jsonl
from clawgym_env.capture.tree import CallTree, expected_tree_tokens
from clawgym_env.capture.tree_io import (
    from_records,
    read_jsonl,
    read_parquet,
    to_jsonl,
    to_records,
    write_parquet,
    write_records_jsonl,
)
from clawgym_env.capture.tree_meta import TreeMeta
from clawgym_env.capture.tree_show import render_html, render_png, render_text
from clawgym_env.errors import ClawGymError
from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command in the workspace.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
SYSTEM = "You are a careful coding agent. Use the bash tool, then answer briefly."
TASK = "Count the lines of every .txt file in the workspace and write the total to total.txt."


def enc(tok, text):
    return list(tok.encode(text, add_special_tokens=False))


def call(ep, idx, prompt, output, seed, token_exact=True):
    rng = random.Random(seed)
    return CallRecord(episode_id=ep, call_index=idx, dialect="openai_chat", path="/v1/chat/completions",
                      stream=False, request={}, prompt_token_ids=prompt, output_token_ids=output,
                      output_logprobs=[-round(rng.random() * 4, 6) for _ in output], finish_reason="stop",
                      policy_name="synthetic", policy_version=3, token_exact=token_exact)


def episode(tok, ep, commands, final="Done.", system=SYSTEM, task=TASK, seed=0):
    """A linear multi-turn episode: each prompt is the conversation so far, rendered by the template."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    calls = []
    for k, cmd in enumerate(commands + [None]):
        prompt = render_prompt_ids(tok, msgs, TOOLS)
        if cmd is None:
            calls.append(call(ep, k, prompt, enc(tok, assistant_text(final)), seed * 100 + k))
            break
        calls.append(call(ep, k, prompt, enc(tok, assistant_text(tool_calls=[("bash", {"command": cmd})])),
                          seed * 100 + k))
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{k}", "function": {"name": "bash", "arguments": json.dumps({"command": cmd})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"output of step {k}: ok"})
    for a, b in zip(calls, calls[1:]):  # the fixture itself: each prompt extends the last prompt + output
        seq = a.prompt_token_ids + a.output_token_ids
        assert b.prompt_token_ids[:len(seq)] == seq
    return calls


def seq_of(c):
    return c.prompt_token_ids + c.output_token_ids


def lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def oracle(calls):
    """One node per token; the first call that samples a position sets its flag and logprob."""
    root, conflicts, size = {}, 0, 0
    for c in calls:
        node = root
        for j, t in enumerate(seq_of(c)):
            if t not in node:
                node[t] = {"kids": {}, "s": False, "lp": None}
                size += 1
            cell = node[t]
            if j >= len(c.prompt_token_ids):
                lp = c.output_logprobs[j - len(c.prompt_token_ids)]
                if not cell["s"]:
                    cell["s"], cell["lp"] = True, lp
                elif abs(cell["lp"] - lp) > 1e-6:
                    conflicts += 1
            node = cell["kids"]
    flags = []
    for c in calls:
        node, f, lps = root, [], []
        for t in seq_of(c):
            f.append(node[t]["s"])
            lps.append(node[t]["lp"])
            node = node[t]["kids"]
        flags.append((f, lps))
    return flags, conflicts, size


def check(tree, calls):
    """Every invariant the builder promises, against the oracle."""
    tree.validate()
    flags, conflicts, size = oracle(calls)
    st = tree.stats()
    assert st.tree_tokens == size == expected_tree_tokens(seq_of(c) for c in calls)
    assert st.captured_tokens == sum(len(seq_of(c)) for c in calls)
    assert st.compression_ratio == pytest.approx(st.captured_tokens / st.tree_tokens)
    assert st.logprob_conflicts == conflicts
    assert st.num_calls == len(calls)
    for i, c in enumerate(calls):
        toks, f, lps = tree.call_sequence(i)
        assert toks == seq_of(c)
        assert (f, lps) == flags[i]
        assert all(f[len(c.prompt_token_ids):])  # a call's own output is always sampled
        on_path = set(tree.path(tree.call_leaf[i]))
        assert {n.id for n in tree.nodes if i in n.calls} == on_path
    return st


@pytest.fixture(scope="module")
def linear(tokenizer):
    return episode(tokenizer, "ep-lin", ["ls *.txt", "wc -l *.txt", "wc -l *.txt | tail -1 > total.txt"])


def test_expected_tree_tokens_counts_distinct_prefixes():
    assert expected_tree_tokens([[1, 2, 3], [1, 2, 4], [5]]) == 5
    assert expected_tree_tokens([[1, 2], [1, 2], [1, 2, 3]]) == 3
    assert expected_tree_tokens([]) == 0


def test_linear_episode_is_one_chain(linear):
    tree = CallTree.from_calls(linear)
    st = check(tree, linear)
    last = seq_of(linear[-1])
    assert (st.roots, st.leaves, st.branches, st.nodes) == (1, 1, 0, len(linear))
    assert st.tree_tokens == len(last) == st.max_depth_tokens
    assert st.compression_ratio == pytest.approx(sum(len(seq_of(c)) for c in linear) / len(last))
    assert st.sampled_tokens == sum(len(c.output_token_ids) for c in linear)
    assert st.unique_calls == len(linear) and st.retries == 0
    # an earlier output seen as context by every later call stays sampled, with its own logprobs
    c0 = linear[0]
    _, f, lps = tree.sequence(tree.call_leaf[len(linear) - 1])
    n0 = len(c0.prompt_token_ids)
    assert f[n0:n0 + len(c0.output_token_ids)] == [True] * len(c0.output_token_ids)
    assert lps[n0:n0 + len(c0.output_token_ids)] == c0.output_logprobs
    assert not any(f[:n0])
    assert tree.meta.policy_version == 3 and tree.meta.episode_ids == ["ep-lin"]


def test_compaction_branches_at_true_divergence_or_new_root(tokenizer, linear):
    summary = render_prompt_ids(tokenizer, [{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": "Summary so far: listed files, counted."}],
                                TOOLS)
    compacted = call("ep-lin", 4, summary, enc(tokenizer, assistant_text("Done.")), 9)
    raw = call("ep-lin", 5, enc(tokenizer, "Summarize the conversation above."), enc(tokenizer, "ok"), 10)
    calls = linear + [compacted, raw]
    tree = CallTree.from_calls(calls)
    st = check(tree, calls)
    assert st.roots == 2 and tree.call_leaf[5] in tree.roots  # shares nothing: its own root
    div = max(lcp(seq_of(compacted), seq_of(c)) for c in linear)
    assert 0 < div < len(linear[0].prompt_token_ids)  # diverges inside the task message
    fork = [tree.nodes[n] for n in tree.path(tree.call_leaf[4]) if tree.nodes[n].calls == [4]][0]
    assert fork.depth == div and len(tree.nodes[fork.parent].children) == 2
    assert st.tree_tokens == len(seq_of(linear[-1])) + len(seq_of(compacted)) - div + len(seq_of(raw))


def test_subagent_splits_a_context_segment(tokenizer, linear):
    first = CallTree.from_calls(linear[:1])
    assert len(first.nodes) == 1
    sub = episode(tokenizer, "ep-lin", ["grep -c . a.txt"], task="Subtask: count lines of a.txt only.")
    calls = [linear[0], sub[0]]
    tree = CallTree.from_calls(calls)
    check(tree, calls)
    div = lcp(seq_of(linear[0]), seq_of(sub[0]))
    assert 0 < div < len(linear[0].prompt_token_ids)
    assert [len(n.tokens) for n in tree.nodes] == [div, len(seq_of(linear[0])) - div, len(seq_of(sub[0])) - div]
    assert tree.nodes[0].children == [1, 2] and tree.nodes[0].calls == [0, 1]
    assert not any(tree.nodes[0].sampled)


def test_identical_retry_is_deduplicated(linear):
    retry = linear[1].model_copy(update={"call_index": 9})
    calls = linear + [retry]
    tree = CallTree.from_calls(calls)
    st = check(tree, calls)
    assert st.retries == 1 and st.unique_calls == len(linear) and st.duplicates == 0
    assert st.tree_tokens == CallTree.from_calls(linear).stats().tree_tokens
    assert tree.call_leaf[len(linear)] == tree.call_leaf[1]


def test_retry_with_different_output_forks_at_the_output(tokenizer, linear):
    c0 = linear[0]
    other = call("ep-lin", 7, c0.prompt_token_ids,
                 enc(tokenizer, assistant_text(tool_calls=[("bash", {"command": "find . -name '*.txt'"})])), 77)
    calls = [c0, other]
    tree = CallTree.from_calls(calls)
    st = check(tree, calls)
    shared_out = lcp(c0.output_token_ids, other.output_token_ids)
    assert shared_out > 0  # both start with "<tool_call>\n{"name": "bash", ...
    assert st.branches == 1 and tree.nodes[0].depth + len(tree.nodes[0].tokens) == len(c0.prompt_token_ids) + shared_out
    assert all(tree.nodes[k].sampled[0] for k in tree.nodes[0].children)
    # the shared output prefix keeps the first call's logprobs; the second's differ: conflicts
    assert tree.nodes[0].logprobs[-shared_out:] == c0.output_logprobs[:shared_out]
    assert st.logprob_conflicts == shared_out


def test_parallel_side_calls_are_siblings(tokenizer, linear):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    side = [call("ep-lin", 10 + i, render_prompt_ids(tokenizer, msgs + [{"role": "user", "content": q}], TOOLS),
                 enc(tokenizer, assistant_text(a)), 20 + i)
            for i, (q, a) in enumerate([("Give this session a title.", "Line totals"),
                                        ("Is the task risky? Answer yes or no.", "no"),
                                        ("Which language is this project in?", "Shell")])]
    calls = [linear[0]] + side
    tree = CallTree.from_calls(calls)
    check(tree, calls)
    parents = {tree.nodes[[n for n in tree.path(tree.call_leaf[i]) if tree.nodes[n].calls == [i]][0]].parent
               for i in (1, 2, 3)}
    assert len(parents) == 1
    assert len(tree.nodes[parents.pop()].children) >= 3


def _record(ep, calls, reward, status="ok", task="count_lines"):
    return EpisodeRecord(episode_id=ep, task_id=task, suite="synthetic", harness="mini", policy="synthetic",
                         status=status, reward=reward, num_calls=len(calls), policy_version=3)


@pytest.fixture(scope="module")
def group(tokenizer):
    eps = [episode(tokenizer, "g0", ["ls", "wc -l *.txt > total.txt"], seed=1),
           episode(tokenizer, "g1", ["cat *.txt | wc -l > total.txt"], seed=2),
           episode(tokenizer, "g2", ["ls", "echo 3 > total.txt"], final="Wrote 3.", seed=3)]
    eps[2][0] = eps[2][0].model_copy(update={"token_exact": False})
    return [(_record(f"g{i}", calls, r, s), calls) for i, (calls, r, s) in
            enumerate(zip(eps, [1.0, 1.0, 0.0], ["ok", "ok", "no_final_answer"]))]


def test_grpo_group_shares_the_prompt_once(group):
    tree = CallTree.from_episodes(group)
    flat = [c for _, calls in group for c in calls]
    st = check(tree, flat)
    prompt = group[0][1][0].prompt_token_ids
    assert st.roots == 1 and tree.nodes[0].calls == list(range(len(flat)))
    assert len(tree.nodes[0].tokens) >= len(prompt)  # system + tools + task stored once
    assert st.episodes == 3
    assert st.duplicates == 1 and st.unique_calls == len(flat) - 1  # g0 and g2 both begin with `ls`
    assert st.token_exact_share == pytest.approx((len(flat) - 1) / len(flat))
    m = tree.meta
    assert m.task_id == "count_lines" and m.harness == "mini" and m.status == "mixed"
    assert [e.reward for e in m.episodes] == [1.0, 1.0, 0.0] and m.reward == pytest.approx(2 / 3)
    assert m.episodes[1].calls == [3, 4] and m.call_episode == [0, 0, 0, 1, 1, 2, 2, 2]
    assert m.inexact_calls == [5]
    with pytest.raises(ClawGymError, match="one \\(suite, task, harness\\)"):
        CallTree.from_episodes([group[0], (_record("x", [], 0.0, task="other"), [])])


def _trees(tokenizer, linear, group):
    side = call("ep-lin", 4, linear[1].prompt_token_ids, enc(tokenizer, assistant_text("Stop.")), 5)
    return [CallTree.from_episodes(group), CallTree.from_calls(linear + [side], TreeMeta(note="branchy"))]


def test_jsonl_round_trip_is_identical(tmp_path, tokenizer, linear, group):
    trees = _trees(tokenizer, linear, group)
    back = read_jsonl(to_jsonl(trees, tmp_path / "trees.jsonl"))
    assert back == trees and (back[1].meta.model_extra or {})["note"] == "branchy"
    (tmp_path / "bad.jsonl").write_text('{"format": "something else"}\n')
    with pytest.raises(ClawGymError):
        read_jsonl(tmp_path / "bad.jsonl")


def test_records_parquet_and_datasets_round_trip(tmp_path, tokenizer, linear, group):
    datasets = pytest.importorskip("datasets")
    trees = _trees(tokenizer, linear, group)
    rows = [r for t in trees for r in to_records(t)]
    assert len(rows) == sum(len(t.nodes) for t in trees)
    assert rows[0]["task_id"] == "count_lines" and rows[0]["parent_id"] is None
    assert from_records(rows) == trees
    pq = write_parquet(trees, tmp_path / "trees.parquet")
    assert read_parquet(pq) == trees
    js = write_records_jsonl(trees, tmp_path / "nodes.jsonl")
    for kind, path in (("parquet", pq), ("json", js)):
        ds = datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
        assert ds.num_rows == len(rows)
        assert {"tree_id", "node_id", "parent_id", "tokens", "sampled", "logprobs", "calls"} <= set(ds.column_names)
        assert from_records(ds.to_list()) == trees, kind


def test_render_text_shows_branches(tokenizer, linear, group):
    tree = _trees(tokenizer, linear, group)[1]
    text = render_text(tree, tokenizer, width=160)
    assert "├─ " in text and "└─ " in text
    assert all(f"#{n.id} {len(n.tokens)} tok" in text for n in tree.nodes)
    assert "system" in text and "<tool_call>" in text
    plain = render_text(tree, None, width=0)
    assert str(tree.nodes[0].tokens[0]) in plain and "branches=1" in plain


def test_html_and_png_are_written(tmp_path, tokenizer, linear, group):
    pytest.importorskip("matplotlib")
    tree = _trees(tokenizer, linear, group)[0]
    page = render_html(tree, tmp_path / "t.html", tokenizer).read_text()
    assert page.startswith("<!DOCTYPE html>") and 'class="s"' in page and "<details>" in page
    assert "src=" not in page and "href=" not in page  # self-contained
    png = render_png(tree, tmp_path / "t.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_cli_tree_show(tmp_path, capsys, tokenizer, linear, group):
    from clawgym_cli.main import main

    ep_dir = tmp_path / "ep"
    calls_path = write_jsonl(ep_dir / "calls.jsonl", group[0][1])
    (ep_dir / "episode.json").write_text(group[0][0].model_dump_json())
    assert main(["tree", "show", str(calls_path), "--html", str(tmp_path / "o.html"),
                 "--png", str(tmp_path / "o.png")]) == 0
    out = capsys.readouterr().out
    assert "task=count_lines" in out and "reward=1.0" in out and "#0 " in out
    assert (tmp_path / "o.html").stat().st_size > 0 and (tmp_path / "o.png").stat().st_size > 0
    trees_path = to_jsonl(_trees(tokenizer, linear, group), tmp_path / "trees.jsonl")
    assert main(["tree", "show", str(trees_path), "--no-decode"]) == 0
    assert capsys.readouterr().out.count("call tree tree-") == 2
    assert main(["tree", "show", str(tmp_path / "missing.jsonl")]) == 2


def test_real_mini_episode_is_one_chain(expert_runtime, builtin_suite):
    from clawgym_env.plugins import make_harness

    task = next(t for t in builtin_suite.tasks
                if sum("tool" in s for s in json.loads(t.expert_path.read_text())["steps"]) >= 3)
    res = expert_runtime.run(task, make_harness("mini"))
    assert res.record.status == "ok" and len(res.calls) >= 4
    tree = CallTree.from_episodes([(res.record, res.calls)])
    st = check(tree, res.calls)
    assert (st.roots, st.branches, st.leaves, st.nodes) == (1, 0, 1, len(res.calls))
    assert st.tree_tokens == len(seq_of(res.calls[-1]))
    assert st.compression_ratio > 2.0
    assert tree.meta.reward == res.record.reward and tree.meta.episode_ids == [res.record.episode_id]
