"""GRPO's practitioner options (loss normalisation, overlong episodes, dynamic sampling) and token ownership:
a token is trained as an episode's action only where that episode's own call sampled it (GRPO and PPO)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_grpo import episode, tool  # noqa: E402

from clawgym_env.errors import ConfigError  # noqa: E402
from trainers.batch.tree_batch import group_summary, make_groups, pack_groups  # noqa: E402
from trainers.grpo.train import Args, collect_groups  # noqa: E402


@pytest.fixture(scope="module")
def group(tokenizer):
    """One group of three episodes of different lengths (rewards 1, 0, 0.5); b1 ends on max_tokens."""
    t = "alpha Count the lines of a.txt"
    eps = [episode(tokenizer, "a0", t, [tool("a.txt"), "It has 3 lines."], 1.0),
           episode(tokenizer, "a1", t, [tool("a.txt"), tool("b.txt"), tool("c.txt"), "It has 4 lines, I think."], 0.0),
           episode(tokenizer, "a2", t, ["No."], 0.5)]
    eps[1][1][-1].finish_reason = "length"
    return eps


def _pairs_by_episode(pack):
    out: dict[str, list[float]] = {}
    for e, w in zip(pack.pair_episode.tolist(), pack.pair_weight.tolist()):
        out.setdefault(pack.episodes[e].episode_id, []).append(w)
    return out


def test_loss_norms_weight_pairs_as_documented(group):
    g = make_groups(group)
    by_ep = _pairs_by_episode(pack_groups(g, loss_norm="episode")[0])
    for eid, ws in by_ep.items():  # each episode: mean over its own tokens, then 1/G
        assert sum(ws) == pytest.approx(1 / 3) and len(set(round(w, 12) for w in ws)) == 1, eid
    n = {eid: len(ws) for eid, ws in by_ep.items()}
    assert n["a1"] > n["a0"] > n["a2"]  # different lengths, so the norms differ
    token = _pairs_by_episode(pack_groups(g, loss_norm="token")[0])
    flat = [w for ws in token.values() for w in ws]
    assert sum(flat) == pytest.approx(1.0) and max(flat) == pytest.approx(min(flat))  # one mean over all pairs
    const = _pairs_by_episode(pack_groups(g, loss_norm="constant", norm_constant=500)[0])
    assert all(w == pytest.approx(1 / (3 * 500)) for ws in const.values() for w in ws)
    with pytest.raises(ConfigError, match="norm_constant"):
        pack_groups(g, loss_norm="constant")
    with pytest.raises(ConfigError, match="loss_norm"):
        Args(loss_norm="sum")


def test_overlong_episodes_masked_or_penalised(group):
    keep = make_groups(group)[0]
    assert keep.overlong == [1] and not keep.masked
    masked = make_groups(group, overlong="mask")[0]
    assert masked.advantages == keep.advantages  # still in the baseline
    pack = pack_groups([masked])[0]
    assert "a1" not in _pairs_by_episode(pack) and {"a0", "a2"} <= set(_pairs_by_episode(pack))
    assert group_summary([masked])["episodes_overlong_masked"] == 1
    pen = make_groups(group, overlong="penalty", overlong_penalty=1.0)[0]
    assert pen.rewards == [1.0, -1.0, 0.5] and pen.advantages[1] < keep.advantages[1]
    assert group[1][0].reward == 0.0  # the record keeps its reward


def test_dynamic_sampling_refills_constant_groups_within_budget(tokenizer):
    tasks = [f"t{i} Do task {i}" for i in range(12)]
    calls = []

    def run(jobs):  # even task numbers always score 1.0 (constant group), odd ones 1.0 / 0.0
        calls.append(len(jobs))
        out = []
        for task, _harness in jobs:
            k = int(task.split()[0][1:])
            for s in range(2):
                reward = 1.0 if k % 2 == 0 or s == 0 else 0.0
                out.append(episode(tokenizer, f"{task.split()[0]}-{len(calls)}-{s}", task, ["ok"], reward))
        return out

    args = Args(groups_per_step=4, refill_groups=0)
    _, groups, stats = collect_groups(args, tasks, 1, run)
    assert stats == {"refill_groups": 0, "refill_rounds": 0} and len(groups) == 4
    first = sum(g.skipped is None for g in groups)
    assert first < 4, "the seeded draw must leave a constant group to refill"
    calls.clear()
    args = Args(groups_per_step=4, refill_groups=8)
    _, groups, stats = collect_groups(args, tasks, 1, run)
    trainable = sum(g.skipped is None for g in groups)
    assert trainable == 4 or stats["refill_groups"] == 8
    assert stats["refill_groups"] <= 8 and calls[0] == 4 and sum(calls[1:]) == stats["refill_groups"]
    assert stats["refill_rounds"] >= 1 and trainable > first


def test_a_token_received_only_as_context_is_not_that_episodes_action(tokenizer):
    """Episode b's prompt holds episode a's sampled answer as context (a prefilled turn): a shared tree
    node, sampled by a; b must get no training pair (GRPO) and no weight (PPO) on those tokens."""
    from clawgym_env.capture.records import CallRecord
    from clawgym_env.capture.tree import CallTree
    from trainers.batch.tree_batch import rollout_pack
    from trainers.ppo.train import loss_weights

    task = "alpha Count the lines of a.txt"
    rec_a, calls_a = episode(tokenizer, "a", task, ["It has 3 lines."], 1.0)
    rec_b, _ = episode(tokenizer, "b", task, ["x"], 0.0)
    first = calls_a[0]
    tail = list(tokenizer.encode("\n<|im_start|>user\nAre you sure?<|im_end|>\n<|im_start|>assistant\n",
                                 add_special_tokens=False))
    out = list(tokenizer.encode("Yes.", add_special_tokens=False))
    call_b = CallRecord(episode_id="b", call_index=0, dialect="openai_chat", path="/v1/chat/completions",
                        stream=False, request={},
                        prompt_token_ids=first.prompt_token_ids + first.output_token_ids + tail,
                        output_token_ids=out, output_logprobs=[-0.5] * len(out), finish_reason="stop")
    group = make_groups([(rec_a, calls_a), (rec_b, [call_b])])[0]
    pack = pack_groups([group])[0]
    answer = len(first.output_token_ids)
    pairs = {"a": 0, "b": 0}
    for e in pack.pair_episode.tolist():
        pairs[pack.episodes[e].episode_id] += 1
    assert pairs["a"] == answer  # a trains on its own answer
    assert pairs["b"] == len(out)  # b only on "Yes.", never on a's answer it got as context
    tree = CallTree.from_episodes([(rec_a, calls_a), (rec_b, [call_b])])
    w, denom = loss_weights(rollout_pack([tree]), "token")
    assert denom == answer + len(out)  # each sampled token counted once, by its owner only
