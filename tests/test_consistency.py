"""Consistency report: a tiny Qwen3 samples through the real proxy (official openai SDK as the client),
the calls become call trees, and the training-side packed recomputation must agree with the rollout.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from openai import OpenAI  # noqa: E402

from clawgym_env.capture.records import EpisodeRecord  # noqa: E402
from clawgym_env.capture.tree import CallTree  # noqa: E402
from clawgym_env.errors import ConfigError  # noqa: E402
from clawgym_env.policy.tiny import build_tiny_qwen3  # noqa: E402
from clawgym_env.policy.transformers_backend import TransformersPolicy  # noqa: E402
from clawgym_env.proxy.server import ProxyServer  # noqa: E402
from trainers.batch.consistency import consistency_report, report_from_logprobs  # noqa: E402
from trainers.batch.packing import pack_trees  # noqa: E402

SYSTEM = "You are a terse assistant working in a sandboxed workspace. Answer in one line."


def run_episode(server, task: str, seed: int, turns: int = 3, side_call: bool = False):
    """A multi-turn chat through the proxy: each turn sends the whole history back, as harnesses do."""
    session = server.open_episode(task={"id": "consistency"}, harness="pytest")
    client = OpenAI(base_url=session.base_url(server.url), api_key="unused", max_retries=0)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for t in range(turns):
        resp = client.chat.completions.create(model="tiny", messages=msgs, temperature=1.0, top_p=1.0,
                                              max_tokens=12, seed=seed * 100 + t)
        msg = resp.choices[0].message
        msgs = msgs + [{"role": "assistant", "content": msg.content or ""},
                       {"role": "user", "content": f"Step {t + 2}: go on."}]
        if side_call and t == 0:  # a side call sharing the system prompt only
            client.chat.completions.create(model="tiny", temperature=1.0, max_tokens=8, seed=seed, messages=[
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name this chat."}])
    calls = server.close_episode(session.token)
    rec = EpisodeRecord(episode_id=session.episode_id, task_id="consistency", suite="unit", harness="pytest",
                        policy="tiny", status="ok", reward=float(seed % 2), num_calls=len(calls))
    return rec, calls


@pytest.fixture(scope="module")
def rollout(tokenizer):
    """Trees from real proxy traffic: one episode with a side call, and a GRPO group of two episodes."""
    policy = TransformersPolicy(build_tiny_qwen3(tokenizer, seed=0), tokenizer)
    with ProxyServer(policy) as server:
        single = run_episode(server, "List the files.", seed=1, side_call=True)
        group = [run_episode(server, "Count the lines.", seed=s, turns=2) for s in (2, 3)]
    trees = [CallTree.from_calls(single[1]), CallTree.from_episodes(group)]
    for tree in trees:
        tree.validate()
    return policy, trees, [single] + group


def test_recomputed_logprobs_match_rollout(rollout, tokenizer):
    policy, trees, episodes = rollout
    all_calls = [c for _, calls in episodes for c in calls]
    assert len(all_calls) == 3 + 1 + 2 + 2 and all(c.output_token_ids for c in all_calls)
    assert len(trees[0].roots) == 1 and len(trees[0].leaves()) == 2  # the side call branches off
    report = consistency_report(policy.model, trees, clip=2.0, threshold=1e-3, vocab_limit=len(tokenizer),
                                max_tokens=1)  # one pack per tree
    assert len(report.packs) == 2 and report.num_trees == 2 and report.num_calls == len(all_calls)
    sampled = sum(len(c.output_token_ids) for c in all_calls)
    # every output token of every call is compared (a later call's context reuses it, never duplicates it)
    assert report.compared_tokens == report.sampled_tokens == sampled
    assert report.max_abs < 1e-4 and abs(report.mean) < 1e-5 and report.share_beyond == 0.0
    assert torch.allclose(report.flat_weights(), torch.ones(sampled, dtype=torch.float32), atol=2e-4)
    assert report.share_clipped == 0.0 and abs(report.mean_weight - 1.0) < 1e-4
    expected_inexact = sum(not c.token_exact for c in all_calls)
    assert report.inexact_calls == expected_inexact
    assert math.isclose(report.inexact_call_share, expected_inexact / len(all_calls))
    d = report.as_dict()
    assert d["compared_tokens"] == sampled and set(d["quantiles"]) >= {"q0.5", "q0.99"}
    for pack, w, m in zip(report.packs, report.weights, report.compared):
        assert w.shape == (pack.num_tokens,) and torch.equal(m, pack.target_mask & pack.logprob_known)
        assert torch.all(w[~m] == 1.0)


def test_rollout_logprobs_are_per_call_exact(rollout, tokenizer):
    """Each call's own output logprobs, gathered from its path in the pack, equal the record's."""
    policy, trees, episodes = rollout
    tree = trees[0]
    pack = pack_trees(tree)
    report = consistency_report(policy.model, tree, vocab_limit=len(tokenizer), packs=[pack])
    lp = report.train_logprobs[0]
    for i, rec in enumerate(episodes[0][1]):
        idx = pack.call_indices(0, i)
        assert pack.input_ids[idx].tolist() == rec.prompt_token_ids + rec.output_token_ids
        out = idx[len(rec.prompt_token_ids):]
        assert (lp[out] - torch.tensor(rec.output_logprobs)).abs().max() < 1e-4


def test_perturbed_model_moves_ratios_and_truncates(rollout, tokenizer):
    _, trees, _ = rollout
    model = build_tiny_qwen3(tokenizer, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    clip = 1.5
    report = consistency_report(model, trees, clip=clip, threshold=0.05, vocab_limit=len(tokenizer))
    x, w = report.flat_log_ratio(), report.flat_weights()
    assert report.max_abs > 0.1 and report.share_beyond > 0.0 and report.std > 0.01
    assert report.share_clipped > 0.0 and float(w.max()) == pytest.approx(clip)
    assert torch.allclose(w, torch.clamp(torch.exp(x.double()), max=clip).float())
    assert report.share_clipped == pytest.approx(float((torch.exp(x.double()) > clip).double().mean()))
    assert report.quantiles["q0.5"] == pytest.approx(float(torch.quantile(x.double(), 0.5)), abs=1e-6)
    assert report.quantiles["q0"] == pytest.approx(float(x.min()), abs=1e-6)


def test_inexact_calls_and_tokens_are_counted(rollout, tokenizer):
    """Marking the side call as not token-exact counts it and exactly its own branch's sampled tokens."""
    policy, _, episodes = rollout
    calls = [c.model_copy(update={"token_exact": i != 1}) for i, c in enumerate(episodes[0][1])]
    tree = CallTree.from_calls(calls)
    assert tree.meta.inexact_calls == [1]
    pack = pack_trees(tree)
    lp = torch.zeros(pack.num_tokens)
    report = report_from_logprobs([pack], [lp], clip=3.0)
    only_side = [n.id for n in tree.nodes if n.calls == [1]]
    assert only_side and report.inexact_calls == 1 and report.num_calls == 4
    assert report.inexact_tokens == sum(sum(tree.nodes[n].sampled) for n in only_side) == len(calls[1].output_token_ids)
    with pytest.raises(ConfigError, match="do not fit"):
        report_from_logprobs([pack], [lp[:-1]])
