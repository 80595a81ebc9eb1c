"""Tree cleaning (trainers.batch.clean) on constructed episodes over real Qwen3 token ids.

The "rich" episode has a main conversation (3 calls, one of them retried after a discarded answer that shares
a few tokens with the retry's), a side call (its own system prompt), a 2-call subagent and a compaction call
that branches off the main path. Expected counts are computed from the records, independently of the tree code.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from clawgym_env.capture.records import CallKind, CallRecord, EpisodeRecord  # noqa: E402
from clawgym_env.capture.tree import CallTree  # noqa: E402
from clawgym_env.errors import ConfigError  # noqa: E402
from clawgym_env.policy.chat_format import render_prompt_ids  # noqa: E402
from trainers.batch.clean import CleanConfig, CleanStats, clean_episode  # noqa: E402
from trainers.batch.tree_batch import group_summary, make_groups, pack_groups  # noqa: E402
from trainers.ppo.train import clean_trees, episode_trees  # noqa: E402
from trainers.rollouts.ahead import AsyncConfig, RolloutAhead, StepBatch  # noqa: E402
from trainers.sft.train import clean_expert  # noqa: E402

MAIN_SYSTEM = "You are a careful agent. Use the tools, then answer."
TASK = "alpha Count the lines of a.txt"
ALL_KINDS = ("main", "side", "subagent", "compaction")
NO_CLEAN = CleanConfig(train_kinds=ALL_KINDS, drop_discarded=False, max_leaves=None)


def lp(seq: list[int]) -> float:
    h = int(hashlib.sha1(str(seq).encode()).hexdigest()[:8], 16)
    return -0.05 - (h % 1000) / 400.0


class Ep:
    """Builds one episode's calls in order, each with its prompt, output, kind and discarded_by."""

    def __init__(self, tok, eid: str, version: int = 0) -> None:
        self.tok, self.eid, self.version = tok, eid, version
        self.calls: list[CallRecord] = []

    def ids(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def start(self, system: str, user: str) -> list[int]:
        return render_prompt_ids(self.tok, [{"role": "system", "content": system}, {"role": "user", "content": user}])

    def call(self, prompt: list[int], text: str, kind: CallKind = "main", discarded_by: int | None = None
             ) -> CallRecord:
        out = self.ids(text)
        c = CallRecord(episode_id=self.eid, call_index=len(self.calls), dialect="openai_chat",
                       path="/v1/chat/completions", stream=False, request={}, prompt_token_ids=list(prompt),
                       output_token_ids=out, output_logprobs=[lp(prompt + out[:j + 1]) for j in range(len(out))],
                       finish_reason="stop", kind=kind, discarded_by=discarded_by, policy_version=self.version)
        self.calls.append(c)
        return c

    def after(self, c: CallRecord, user: str) -> list[int]:
        """The next prompt of c's conversation: c's prompt + output + a tool result."""
        tail = self.ids(f"\n<|im_start|>user\n<tool_response>\n{user}\n</tool_response><|im_end|>\n"
                        "<|im_start|>assistant\n")
        return c.prompt_token_ids + c.output_token_ids + tail

    def record(self, reward: float) -> tuple[EpisodeRecord, list[CallRecord]]:
        rec = EpisodeRecord(episode_id=self.eid, task_id=TASK.split()[0], suite="unit", harness="mini",
                            policy="tiny", status="ok", reward=reward, num_calls=len(self.calls),
                            policy_version=self.version)
        return rec, list(self.calls)


def rich(tok, eid: str = "rich", reward: float = 1.0, version: int = 0):
    """Main M0, M1x (discarded), M1, side S, subagent A0 A1, compaction C, main M2."""
    e = Ep(tok, eid, version)
    m0 = e.call(e.start(MAIN_SYSTEM, TASK), "I will read a.txt first.")
    p1 = e.after(m0, "a.txt: 3 lines")
    e.call(p1, "I will count them with wc right now.", discarded_by=2)  # the harness timed out and re-sent p1
    m1 = e.call(p1, "I will count the lines.")
    e.call(e.start("Write a 5-word title for this chat.", TASK), "Counting lines in a file", kind="side")
    a0 = e.call(e.start("You are a subagent. Search the files.", "find a.txt"), "Searching the workspace.",
                kind="subagent")
    e.call(e.after(a0, "./a.txt"), "Found it at ./a.txt.", kind="subagent")
    e.call(e.after(m1, "Summarise the conversation so far."), "We read a.txt; it has 3 lines.", kind="compaction")
    e.call(e.after(m1, "3"), "It has 3 lines.")
    return e.record(reward)


def plain(tok, eid: str, text: str, reward: float, version: int = 0):
    e = Ep(tok, eid, version)
    c = e.call(e.start(MAIN_SYSTEM, TASK), "I will read b.txt.")
    e.call(e.after(c, "b.txt: 4 lines"), text)
    return e.record(reward)


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def by_kind(calls):
    out: dict[str, list[CallRecord]] = {k: [] for k in (*ALL_KINDS, "discarded")}
    for c in calls:
        out["discarded" if c.discarded_by is not None else c.kind].append(c)
    return out


def episode_pairs(pack, eid):
    """Packed token indices of the pairs of episode ``eid``."""
    return [t for t, e in zip(pack.pair_token.tolist(), pack.pair_episode.tolist())
            if pack.episodes[e].episode_id == eid]


def test_cleaned_tree_holds_exactly_the_main_calls_sampled_tokens(tokenizer):
    rec, calls = rich(tokenizer)
    parts = by_kind(calls)
    main = parts["main"]
    retry, redo = parts["discarded"][0], main[1]
    shared = lcp(retry.output_token_ids, redo.output_token_ids)
    assert shared > 0  # the dead retry's first tokens equal the retry's: those stay trained (by the retry)
    groups = make_groups([(rec, calls), plain(tokenizer, "p", "It has 4 lines.", 0.0)], clean=CleanConfig())
    g = groups[0]
    assert g.skipped is None and [r.episode_id for r, _ in g.episodes] == ["rich", "p"]
    assert g.episodes[0][1] == calls  # the group keeps the records as collected; the tree is cleaned
    pack = pack_groups(groups)[0]
    idx = episode_pairs(pack, "rich")
    # chain after cleaning: the pairs in packed (preorder) order are the main outputs, in order
    assert pack.packed.input_ids[idx].tolist() == [t for c in main for t in c.output_token_ids]
    assert next(e for e in pack.episodes if e.episode_id == "rich").trainable_tokens == sum(
        len(c.output_token_ids) for c in main)
    m = group_summary(groups)
    expect = {"side": parts["side"], "subagent": parts["subagent"], "compaction": parts["compaction"]}
    for kind, cs in expect.items():
        assert m[f"clean/{kind}_calls"] == len(cs)
        assert m[f"clean/{kind}_tokens"] == sum(len(c.output_token_ids) for c in cs)
    assert m["clean/main_calls"] == m["clean/main_tokens"] == 0
    assert m["clean/discarded_calls"] == 1
    assert m["clean/discarded_tokens"] == len(retry.output_token_ids) - shared
    assert m["clean/kept_calls"] == len(main) + 2
    assert m["clean/kept_tokens"] == sum(len(c.output_token_ids) for c in main + g.episodes[1][1])
    assert m["clean/dropped_rollouts_max_leaves"] == 0 and m["groups_skipped_max_leaves"] == 0


def test_per_kind_choices(tokenizer):
    rec, calls = rich(tokenizer)
    parts = by_kind(calls)
    n = {k: sum(len(c.output_token_ids) for c in cs) for k, cs in parts.items()}
    retry, redo = parts["discarded"][0], parts["main"][1]
    retry_own = len(retry.output_token_ids) - lcp(retry.output_token_ids, redo.output_token_ids)

    def trained(cfg):
        ep = clean_episode(calls, cfg)
        tree = CallTree.from_calls(ep.calls)
        assert ep.stats.kept_tokens == sum(sum(node.sampled) for node in tree.nodes)
        return ep

    assert trained(CleanConfig()).stats.kept_tokens == n["main"]
    assert trained(CleanConfig(train_kinds=("main", "subagent"))).stats.kept_tokens == n["main"] + n["subagent"]
    keep_retry = trained(CleanConfig(drop_discarded=False))
    assert keep_retry.stats.kept_tokens == n["main"] + retry_own and retry in keep_retry.calls
    everything = trained(NO_CLEAN)
    assert everything.calls == calls and everything.stats.removed_calls == {}
    assert everything.stats.kept_tokens == sum(n.values()) - (len(retry.output_token_ids) - retry_own)
    only_side = trained(CleanConfig(train_kinds=("side",)))
    assert [c.kind for c in only_side.calls] == ["side"]
    assert only_side.stats.removed_calls["main"] == 4  # the dead retry is a main call: counted under its kind
    # a side call that is also a dead retry counts under its kind (the first reason)
    dead_side = [c.model_copy(update={"discarded_by": 99}) if c.kind == "side" else c for c in calls]
    st = clean_episode(dead_side, CleanConfig()).stats
    assert st.removed_calls["side"] == 1 and st.removed_calls["discarded"] == 1
    with pytest.raises(ConfigError, match="train_kinds"):
        CleanConfig(train_kinds=("mian",))
    with pytest.raises(ConfigError, match="max_leaves"):
        CleanConfig(max_leaves=0)


def test_max_leaves_drops_rollouts_counted_and_regroups(tokenizer):
    rec, calls = rich(tokenizer)
    cfg = dataclasses.replace(NO_CLEAN, max_leaves=2)
    full = clean_episode(calls, cfg)
    assert full.leaves == len(CallTree.from_calls(calls).leaves()) == 5 and full.over_max_leaves
    assert clean_episode(calls, CleanConfig(max_leaves=2)).leaves == 1  # cleaned: the main chain only
    eps = [(rec, calls), plain(tokenizer, "p", "It has 4 lines.", 0.0), plain(tokenizer, "q", "3 lines.", 1.0)]
    g = make_groups(eps, clean=cfg, normalize_std=False)[0]
    assert g.skipped is None and [r.episode_id for r, _ in g.episodes] == ["p", "q"]
    assert [r.episode_id for r, _ in g.dropped] == ["rich"]
    assert g.advantages == pytest.approx([-0.5, 0.5])  # the baseline is over the rollouts that remain
    m = group_summary([g])
    assert m["clean/dropped_rollouts_max_leaves"] == 1 and m["clean/dropped_calls_max_leaves"] == len(calls)
    assert m["clean/dropped_tokens_max_leaves"] == full.stats.kept_tokens
    two = make_groups(eps[:2], clean=cfg)[0]
    assert two.skipped == "max_leaves" and group_summary([two])["groups_skipped_max_leaves"] == 1
    assert pack_groups([two]) == []
    # PPO drops the rollout too, counted the same way
    trees, st = clean_trees(eps, cfg)
    assert [t.meta.episode_ids for t in trees] == [["p"], ["q"]] and st.dropped_rollouts == 1


def test_async_regroup_keeps_the_max_leaves_drop(tokenizer):
    cfg = dataclasses.replace(NO_CLEAN, max_leaves=2)
    results = [rich(tokenizer, version=1), plain(tokenizer, "p", "It has 4 lines.", 0.0, version=1),
               plain(tokenizer, "q", "3 lines.", 1.0, version=1), plain(tokenizer, "s", "Five.", 0.0, version=0)]
    regroup = functools.partial(make_groups, clean=cfg)
    ahead = RolloutAhead(lambda n: StepBatch(n, results, regroup(results)), AsyncConfig(), start=1, stop=1,
                         regroup=regroup)
    batch = ahead.get(1, 1)  # "s" was sampled one version ago: stale under max_staleness 0
    (g,) = batch.groups
    assert [r.episode_id for r, _ in g.episodes] == ["p", "q"] and [r.episode_id for r, _ in g.dropped] == ["rich"]
    assert g.clean.dropped_rollouts == 1 and batch.metrics is not None and batch.metrics.dropped == 1


def test_records_without_kinds_pack_bit_identically(tokenizer):
    eps = [plain(tokenizer, "p", "It has 4 lines.", 0.0), plain(tokenizer, "q", "3 lines.", 1.0),
           rich(tokenizer, "r", 0.5)]
    old = [(rec, [CallRecord.model_validate({k: v for k, v in c.model_dump().items()
                                              if k not in ("kind", "kind_reason", "discarded_by")}) for c in calls])
           for rec, calls in eps]  # as written before calls had kinds: every call main, none discarded
    assert all(c.kind == "main" and c.discarded_by is None for _, cs in old for c in cs)
    before, after = pack_groups(make_groups(old)), pack_groups(make_groups(old, clean=CleanConfig()))
    assert len(before) == len(after) == 1
    for f in dataclasses.fields(before[0]):
        a, b = getattr(before[0], f.name), getattr(after[0], f.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f.name
    for f in dataclasses.fields(before[0].packed):
        a, b = getattr(before[0].packed, f.name), getattr(after[0].packed, f.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f.name
    assert before[0].episodes == after[0].episodes
    assert group_summary(make_groups(old, clean=CleanConfig()))["clean/kept_calls"] == sum(len(c) for _, c in old)
    ppo_old, ppo_new = episode_trees(old), clean_trees(old, CleanConfig())[0]
    assert [t.nodes for t in ppo_old] == [t.nodes for t in ppo_new]
    assert clean_expert(old, CleanConfig())[0] == old


def test_a_removed_side_calls_tokens_are_never_an_action_even_as_context(tokenizer):
    """Episode a: a side call sampled O; a main call later received O as context. Episode b's main call sampled
    the same O at the same position. After cleaning a has no pair on O (it received O only), b keeps its own."""
    a = Ep(tokenizer, "a")
    side = a.call(a.start(MAIN_SYSTEM, TASK), "Let me think about a.txt.", kind="side")
    a.call(a.after(side, "go on"), "It has 3 lines.")
    b = Ep(tokenizer, "b")
    b.call(b.start(MAIN_SYSTEM, TASK), "Let me think about a.txt.")
    eps = [a.record(1.0), b.record(0.0)]
    o = len(side.output_token_ids)

    def pairs(clean):
        pack = pack_groups(make_groups(eps, clean=clean))[0]
        return len(episode_pairs(pack, "a")), len(episode_pairs(pack, "b"))

    assert pairs(None) == (o + len(a.calls[1].output_token_ids), o)  # uncleaned: a trains its side answer
    assert pairs(CleanConfig()) == (len(a.calls[1].output_token_ids), o)
    alone = make_groups([eps[0], plain(tokenizer, "p", "x", 0.0)], clean=CleanConfig())[0].tree
    assert alone is not None
    node_of_o = [n for n in alone.nodes if 0 in [alone.meta.episode_of(c) for c in n.calls]]
    assert sum(sum(n.sampled) for n in node_of_o) == len(a.calls[1].output_token_ids)  # O is context there


def test_grpo_weight_moves_from_side_and_retry_tokens_to_the_main_trajectory(tokenizer):
    """Each token's GRPO weight (pack.token_weight, loss_norm episode) on the rich episode, split by who sampled it."""
    eps = [rich(tokenizer), plain(tokenizer, "p", "It has 4 lines.", 0.0)]

    def shares(clean):
        pack = pack_groups(make_groups(eps, clean=clean))[0]
        tree = pack.packed.trees[0]
        lengths, kinds = tree.meta.prompt_lengths, tree.meta.call_kinds
        assert lengths is not None and kinds is not None
        dead = set(tree.meta.discarded_calls)
        where = {}
        for node in tree.nodes:
            sl = pack.packed.node_slice(0, node.id)
            for j in range(len(node.tokens)):
                samplers = [c for c in node.calls if tree.meta.episode_of(c) == 0 and lengths[c] <= node.depth + j]
                where[sl.start + j] = "main" if any(kinds[c] == "main" and c not in dead for c in samplers) else "side"
        w = {"main": 0.0, "side": 0.0}
        for t, e, pw in zip(pack.pair_token.tolist(), pack.pair_episode.tolist(), pack.pair_weight.tolist()):
            if pack.episodes[e].episode_id == "rich":
                w[where[t]] += pw
        total = w["main"] + w["side"]
        return w["main"] / total, w["side"] / total, total

    main0, side0, total0 = shares(None)
    main1, side1, total1 = shares(CleanConfig())
    print(f"\nGRPO weight of the rich episode: before cleaning main {main0:.3f} side/subagent/compaction/retry "
          f"{side0:.3f}; after cleaning main {main1:.3f} side/retry {side1:.3f} (episode total {total0:.3f} -> "
          f"{total1:.3f})")
    assert side0 > 0.5 and main0 < 0.5  # most of this episode's sampled tokens were not the main agent's
    assert side1 == 0.0 and main1 == pytest.approx(1.0)
    assert total0 == pytest.approx(total1) == pytest.approx(0.5)  # the episode's weight 1/G is kept, moved to main


def test_clean_stats_sum():
    a = CleanStats({"side": 1}, {"side": 4}, kept_calls=2, kept_tokens=9)
    b = CleanStats({"side": 2, "discarded": 1}, {"side": 1, "discarded": 3}, dropped_rollouts=1, dropped_calls=3,
                   dropped_tokens=7)
    m = CleanStats.total([a, b]).as_metrics()
    assert m["clean/side_calls"] == 3 and m["clean/side_tokens"] == 5 and m["clean/discarded_tokens"] == 3
    assert m["clean/dropped_rollouts_max_leaves"] == 1 and m["clean/kept_tokens"] == 9
    assert CleanStats.total([]).as_metrics() == CleanStats().as_metrics()


REWARD_SH = """#!/usr/bin/env bash
python3 -c 'import json, os
p = json.load(open(os.environ["OPENCLAW_REWARD_PAYLOAD"]))
print(1.0 if len(p.get("final_message") or "") % 2 == 0 else 0.0)'
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/install.sh)")
def test_one_grpo_step_through_mini_logs_the_clean_metrics(tmp_path, tokenizer):
    from trainers.grpo.train import Args, train
    from trainers.policy import PolicyConfig
    from trainers.run_args import LogArgs

    d = tmp_path / "suite" / "parity_0"
    (d / "reward").mkdir(parents=True)
    (d / "data_entry.json").write_text(json.dumps({
        "task_id": "parity_0", "user_query": "Say something.", "input_mount_dir": "/root/.openclaw/workspace",
        "metadata": {"grading_type": "automated"},
        "limits": {"timeout_s": 60, "max_turns": 2, "reward_timeout_s": 30}}))
    (d / "reward" / "reward.sh").write_text(REWARD_SH)
    out = tmp_path / "run"
    train(Args(out_dir=str(out), suite=str(tmp_path / "suite"), steps=1, groups_per_step=1, group_size=2,
               concurrency=2, max_tokens=8, log=LogArgs(progress=False, plot=False),
               policy=PolicyConfig(model="tiny", seed=1)),
          echo=lambda *_: None)
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    keys = CleanStats().as_metrics().keys()
    assert all(isinstance(row[k], int) for k in keys), sorted(set(keys) - set(row))
    calls = [json.loads(line) for p in Path(out / "episodes").glob("*/calls.jsonl")
             for line in p.read_text().splitlines()]
    removed = sum(row[k] for k in keys if k.endswith("_calls") and k != "clean/kept_calls")
    assert row["clean/kept_calls"] + removed == len(calls) > 0  # every captured call kept or counted
