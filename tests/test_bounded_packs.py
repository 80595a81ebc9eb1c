"""Bounded packs: a tree larger than ``max_pack_tokens`` is split into parts that fit, and training on
the parts is training on the whole tree.

Trees are real-looking (episodes of token-exact agent calls from the real chat template, with shared
prefixes, retries forking after sampled tokens and GRPO groups); the model is a tiny random Qwen3 in
fp32. For GRPO, SFT and PPO (policy and value losses, through the real loss functions) the summed
loss of the split packs and every parameter's gradient equal those of the unsplit packs within 1e-5.
Packing alone is also checked at 64K tokens (no forward at that size).
"""

from __future__ import annotations

import copy
import random
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from clawgym_env.capture.records import CallRecord, EpisodeRecord  # noqa: E402
from clawgym_env.capture.tree import CallTree  # noqa: E402
from clawgym_env.errors import ConfigError  # noqa: E402
from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids  # noqa: E402
from clawgym_env.policy.tiny import build_tiny_qwen3  # noqa: E402
from trainers.batch.logprobs import token_logprobs  # noqa: E402
from trainers.batch.pack_parts import gae_over_packs, pack_stats, pack_units  # noqa: E402
from trainers.batch.pack_split import plan_packs, split_tree, tree_tokens  # noqa: E402
from trainers.batch.packing import pack_batch, pack_trees, scorable_mask  # noqa: E402
from trainers.batch.tree_batch import episode_packs, make_groups, pack_groups, rollout_packs  # noqa: E402
from trainers.grpo.train import grpo_loss  # noqa: E402
from trainers.ppo.targets import add_reference, gae_targets, prepare  # noqa: E402
from trainers.ppo.train import Args as PPOArgs  # noqa: E402
from trainers.ppo.train import ppo_loss  # noqa: E402
from trainers.ppo.value import Critic  # noqa: E402
from trainers.sft.train import sft_loss, sft_pack  # noqa: E402

SYSTEM = "You are a careful agent. Use the tools, then answer briefly."


def _lp(key: str) -> float:
    return -random.Random(key).uniform(0.05, 3.0)


def _calls(tok, eid: str, task: str, outputs: list[str], retry: tuple[int, str] | None = None) -> list[CallRecord]:
    """A token-exact chain of calls (each prompt = last prompt + output + a tool result); ``retry`` re-sends
    call ``i``'s prompt with another answer (a fork after the sampled tokens both branches share)."""
    prompt = render_prompt_ids(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}])
    calls: list[CallRecord] = []

    def one(i, p, text):
        out = list(tok.encode(text, add_special_tokens=False))
        return CallRecord(episode_id=eid, call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                          stream=False, request={}, prompt_token_ids=list(p), output_token_ids=out,
                          output_logprobs=[_lp(f"{p}{out[:j + 1]}") for j in range(len(out))], finish_reason="stop")

    for i, text in enumerate(outputs):
        calls.append(one(i, prompt, text))
        tail = tok.encode(f"<|im_start|>user\n<tool_response>\nresult {i} for {eid}\n</tool_response><|im_end|>\n"
                          "<|im_start|>assistant\n", add_special_tokens=False)
        prompt = calls[-1].prompt_token_ids + calls[-1].output_token_ids + list(tail)
    if retry is not None:
        calls.append(one(len(calls), calls[retry[0]].prompt_token_ids, retry[1]))
    return calls


def _episode(tok, eid, task, outputs, reward, retry=None):
    rec = EpisodeRecord(episode_id=eid, task_id=task.split()[0], suite="unit", harness="mini", policy="tiny",
                        status="ok", reward=reward, num_calls=len(outputs))
    return rec, _calls(tok, eid, task, outputs, retry)


def _tool(path):
    return assistant_text("", tool_calls=[("read_file", {"path": path})])


@pytest.fixture(scope="module")
def episodes(tokenizer):
    a, b = "alpha Count the lines of a.txt and b.txt", "beta Say hello"
    return [
        _episode(tokenizer, "a0", a, [_tool("a.txt"), _tool("b.txt"), assistant_text("3 and 4 lines.")], 1.0,
                 retry=(1, _tool("c.txt"))),
        _episode(tokenizer, "a1", a, [_tool("a.txt"), _tool("b.txt"), assistant_text("3 and 5 lines.")], 0.0),
        _episode(tokenizer, "a2", a, [_tool("a.txt"), assistant_text("I could not read b.txt.")], 0.5),
        _episode(tokenizer, "a3", a, [_tool("b.txt"), _tool("a.txt"), assistant_text("Both have 3 lines.")], 0.2,
                 retry=(2, assistant_text("Both files have three lines."))),
        _episode(tokenizer, "b0", b, [assistant_text("hello")], 1.0),
        _episode(tokenizer, "b1", b, [assistant_text("Hi there, hello!")], 0.0),
    ]


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_qwen3(tokenizer, seed=0)


def _longest_path(tree: CallTree) -> int:
    return max(sum(len(tree.nodes[n].tokens) for n in tree.path(leaf)) for leaf in tree.leaves())


def _limit(trees: list[CallTree]) -> int:
    """A limit that splits the largest tree into several parts while every path still fits."""
    return max(max(_longest_path(t) for t in trees) + 8, max(tree_tokens(t) for t in trees) // 3)


def _token_noise(packed, salt: str, scale: float = 0.3):
    """A fixed per-token perturbation keyed by (tree, node, index): equal in every pack holding the token."""
    out = torch.zeros(packed.num_tokens)
    offs = packed.node_offsets.tolist()
    for k, (ti, nid) in enumerate(zip(packed.node_tree.tolist(), packed.node_ids.tolist())):
        tid = packed.trees[ti].meta.tree_id
        for j in range(offs[k], offs[k + 1]):
            out[j] = random.Random(f"{salt}/{tid}/{nid}/{j - offs[k]}").uniform(-scale, scale)
    return out


def _owned_keys(packed, mask):
    """(tree id, node, index) of the tokens where ``mask``, with their packed index."""
    out = {}
    offs = packed.node_offsets.tolist()
    flags = mask.tolist()
    for k, (ti, nid) in enumerate(zip(packed.node_tree.tolist(), packed.node_ids.tolist())):
        for j in range(offs[k], offs[k + 1]):
            if flags[j]:
                out[(packed.trees[ti].meta.tree_id, nid, j - offs[k])] = j
    return out


def _pairs(packs):
    """Every (tree, node, index, episode, weight, advantage) pair of ``packs``, as a multiset."""
    c: Counter = Counter()
    for p in packs:
        keys = {j: key for key, j in _owned_keys(p.packed, p.trainable).items()}
        for t, e, w, a in zip(p.pair_token.tolist(), p.pair_episode.tolist(), p.pair_weight.tolist(),
                              p.pair_adv.tolist()):
            c[(keys[t], p.episodes[e].episode_id, round(w, 9), round(a, 9))] += 1
    return c


def _grads(*modules):
    out = {}
    for i, m in enumerate(modules):
        for n, q in m.named_parameters():
            if q.grad is not None:
                out[f"{i}.{n}"] = q.grad.detach().clone()
                q.grad = None
    return out


def _assert_same_grads(a, b, tol=1e-5):
    assert a.keys() == b.keys() and a
    for k in a:
        scale = max(1.0, float(a[k].abs().max()))
        assert float((a[k] - b[k]).abs().max()) <= tol * scale, k


def _check_bounded(packs, limit, min_parts=3):
    assert all(p.num_tokens <= limit for p in packs)
    stats = pack_stats(packs)
    assert stats.packs_split >= 1 and stats.subpacks >= min_parts and stats.recomputed_tokens > 0
    assert stats.pack_tokens_max <= limit
    return stats


# ---- the split itself ------------------------------------------------------------------------------------
def test_split_parts_are_whole_paths_that_fit_and_own_each_node_once():
    rng = random.Random(0)
    for trial in range(40):
        seqs: list[list[int]] = []
        for _ in range(rng.randint(2, 9)):  # sequences sharing random prefixes of earlier ones
            base = rng.choice(seqs)[: rng.randint(1, 30)] if seqs and rng.random() < 0.8 else []
            seqs.append(base + [rng.randint(5, 99) for _ in range(rng.randint(1, 25))])
        calls = [CallRecord(episode_id="e", call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                            stream=False, request={}, prompt_token_ids=s[:-1], output_token_ids=s[-1:],
                            output_logprobs=[-1.0], finish_reason="stop") for i, s in enumerate(seqs)]
        tree = CallTree.from_calls(calls)
        limit = _longest_path(tree) + rng.randint(0, 20)
        parts = split_tree(tree, limit)
        owned = [n for p in parts for n in p.owned]
        assert sorted(owned) == list(range(len(tree.nodes))), trial  # a partition of the nodes
        for p in parts:
            assert p.tokens == sum(len(tree.nodes[n].tokens) for n in p.nodes) <= limit
            assert p.owned <= p.nodes and p.count == len(parts)
            leaves = [n for n in p.nodes if not tree.nodes[n].children]
            assert set().union(*(tree.path(leaf) for leaf in leaves)) == set(p.nodes)  # whole paths only
        assert (len(parts) == 1) == (tree_tokens(tree) <= limit)


def test_a_path_longer_than_the_limit_names_the_fix(episodes):
    tree = CallTree.from_episodes(episodes[:2])
    longest = _longest_path(tree)
    with pytest.raises(ConfigError, match=rf"{longest} tokens.*raise max_pack_tokens to at least max_context_tokens"):
        plan_packs([tree], longest - 1)
    assert len(plan_packs([tree], longest)) >= 1


def test_split_packs_count_each_token_once_and_units_keep_parts_together(episodes):
    trees = [g.tree for g in make_groups(episodes) if g.skipped is None and g.tree is not None]
    limit = _limit(trees)
    whole = pack_batch(trees)
    split = [pack_trees(b) for b in plan_packs(trees, limit)]
    assert all(p.num_tokens <= limit for p in split) and len(split) > len(whole)
    assert sum(int(scorable_mask(p).sum()) for p in split) == sum(int(scorable_mask(p).sum()) for p in whole)
    assert sum(int(p.owned.sum()) for p in split) == sum(tree_tokens(t) for t in trees)
    units = pack_units(split)
    assert [k for u in units for k in u] == list(range(len(split)))
    for t in trees:  # a split tree's parts never leave their unit
        holding = {k for k, p in enumerate(split) if any(x is t for x in p.trees)}
        assert any(holding <= set(u) for u in units)
    big = max(trees, key=tree_tokens)
    assert sum(1 for p in split if any(x is big for x in p.trees)) >= 3


# ---- GRPO ------------------------------------------------------------------------------------------------
def _grpo_total(model, packs, vl):
    total = torch.zeros(())
    for pack in packs:
        logp = token_logprobs(model, pack.packed, 64, mask=pack.trainable, vocab_limit=vl)
        m = pack.trainable
        old = logp.detach() + _token_noise(pack.packed, "old")
        ref = logp.detach() + _token_noise(pack.packed, "ref")
        is_w = torch.where(m, torch.exp(old - pack.packed.rollout_logprobs).clamp(max=2.0), torch.zeros_like(old))
        loss, _ = grpo_loss(logp, old, is_w, pack, clip_low=0.1, clip_high=0.15, kl_coef=0.1, logp_ref=ref)
        total = total + loss
    total.backward()
    return float(total.detach())


@pytest.mark.parametrize("loss_norm", ["episode", "token", "constant"])
def test_grpo_split_packs_carry_the_unsplit_pairs(episodes, loss_norm):
    groups = make_groups(episodes)
    limit = _limit([g.tree for g in groups if g.tree is not None])
    kw = {"loss_norm": loss_norm, "norm_constant": 50.0}
    whole = pack_groups(groups, **kw)
    split = pack_groups(groups, max_tokens=limit, **kw)
    _check_bounded(split, limit)
    assert _pairs(split) == _pairs(whole)  # the same (token, episode) pairs with the same weights
    assert sum(e.primary for p in split for e in p.episodes) == sum(len(p.episodes) for p in whole)
    for p in split:  # token weights are the pairs' sums, on owned trainable tokens only
        assert torch.allclose(torch.zeros(p.num_tokens).index_add_(0, p.pair_token, p.pair_weight), p.token_weight)
        assert not bool((p.trainable & ~p.packed.owned).any())


@pytest.mark.slow
def test_grpo_split_loss_and_grads_equal_unsplit(model, tokenizer, episodes):
    groups = make_groups(episodes)
    limit = _limit([g.tree for g in groups if g.tree is not None])
    whole = pack_groups(groups)
    split = pack_groups(groups, max_tokens=limit)
    _check_bounded(split, limit)
    vl = len(tokenizer)
    loss_whole = _grpo_total(model, whole, vl)
    g_whole = _grads(model)
    loss_split = _grpo_total(model, split, vl)
    g_split = _grads(model)
    assert loss_whole != 0.0 and abs(loss_whole - loss_split) <= 1e-5
    _assert_same_grads(g_whole, g_split)


# ---- SFT -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sft_split_loss_and_grads_equal_unsplit(model, tokenizer, episodes):
    eps = episodes[:4]
    whole = sft_pack(eps)
    limit = _limit([whole.packed.trees[0]])
    split = episode_packs(eps, limit)
    _check_bounded(split, limit)
    assert _pairs(split) == _pairs([whole])
    vl = len(tokenizer)
    losses = []
    for packs in ([whole], split):
        total = torch.stack([sft_loss(token_logprobs(model, p.packed, 64, mask=p.trainable, vocab_limit=vl), p)
                             for p in packs]).sum()
        total.backward()
        losses.append((float(total.detach()), _grads(model)))
    assert abs(losses[0][0] - losses[1][0]) <= 1e-5
    _assert_same_grads(losses[0][1], losses[1][1])


# ---- PPO -------------------------------------------------------------------------------------------------
def _ppo_trees(tok):
    big = CallTree.from_episodes([
        _episode(tok, "p0", "count Count the lines of a.txt", [_tool("a.txt"), _tool("b.txt"),
                 assistant_text("There are 3 lines.")], 1.0, retry=(1, _tool("notes.txt"))),
        _episode(tok, "p1", "count Count the lines of a.txt", [_tool("a.txt"), assistant_text("5 lines.")], 0.0,
                 retry=(1, assistant_text("Five lines in a.txt."))),
    ])
    single = CallTree.from_episodes([_episode(tok, "s0", "sum Add the numbers", [assistant_text("12")], 0.5)])
    return [big, single]


def _all_keys(packed):
    return _owned_keys(packed, torch.ones(packed.num_tokens, dtype=torch.bool))


def test_gae_over_packs_runs_on_whole_trees_across_split_packs(tokenizer):
    trees = _ppo_trees(tokenizer)
    whole = rollout_packs(trees, None)
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(p.num_tokens, generator=gen) for p in whole]
    by_key = {}
    for p, v, (adv, ret) in zip(whole, values, gae_over_packs(whole, values, 0.9, 0.8)):
        a2, r2 = gae_targets(p.packed, v, 0.9, 0.8)  # whole trees: the per-pack GAE
        assert torch.equal(adv, a2) and torch.equal(ret, r2)
        by_key.update({key: (float(v[j]), float(adv[j]), float(ret[j])) for key, j in _all_keys(p.packed).items()})
    split = rollout_packs(trees, _limit(trees))
    assert pack_stats(split).packs_split == 1
    split_values = []
    for p in split:  # the same value for a token in every pack holding it (it depends on its prefix only)
        keys = _all_keys(p.packed)
        split_values.append(torch.tensor([by_key[k][0] for k in sorted(keys, key=keys.__getitem__)]))
    for p, (adv, ret) in zip(split, gae_over_packs(split, split_values, 0.9, 0.8)):
        for key, j in _all_keys(p.packed).items():  # owned and context tokens alike
            assert abs(float(adv[j]) - by_key[key][1]) < 1e-6 and abs(float(ret[j]) - by_key[key][2]) < 1e-6
    with pytest.raises(ConfigError, match="every part of a split tree"):
        gae_over_packs(split[:1], split_values[:1], 0.9, 0.8)


@pytest.mark.slow
def test_ppo_split_policy_and_value_losses_equal_unsplit(model, tokenizer):
    trees = _ppo_trees(tokenizer)
    vl = len(tokenizer)
    args = PPOArgs(gamma=0.9, lam=0.8, vf_clip=0.05, ent_coef=0.01, kl_coef=0.1, clip_eps=0.1, clip_eps_high=0.15,
                   chunk_size=64, minibatches=1)
    old = copy.deepcopy(model)
    critic = Critic.on_policy(old, init_std=0.1)  # shared: the value loss reaches the policy's trunk too
    limit = _limit(trees)
    whole = rollout_packs(trees, None)
    split = rollout_packs(trees, limit)
    _check_bounded(split, limit, min_parts=2)
    ref = build_tiny_qwen3(tokenizer, seed=3)
    with torch.no_grad():
        t_whole = prepare(old, critic, whole, args, vocab_limit=vl)
        t_split = prepare(old, critic, split, args, vocab_limit=vl)  # the real one, across split packs
    add_reference(t_whole, ref, args, vocab_limit=vl)
    add_reference(t_split, ref, args, vocab_limit=vl)
    # every per-token target of an owned token equals the unsplit one
    full = {key: (t, j) for t in t_whole for key, j in _owned_keys(t.pack, t.mask).items()}
    seen = 0
    for t in t_split:
        for key, j in _owned_keys(t.pack, t.mask).items():
            tw, jw = full[key]
            for name in ("old_logp", "old_values", "advantages", "returns", "is_weight", "weight", "ref_logp"):
                assert abs(float(getattr(t, name)[j]) - float(getattr(tw, name)[jw])) <= 1e-5, (name, key)
            seen += 1
    assert seen == len(full) and sum(t.denom for t in t_split) == sum(t.denom for t in t_whole) == 3
    cur = copy.deepcopy(old)  # one update away from the rollout policy: ratios leave 1, clipping acts
    cur_critic = Critic(copy.deepcopy(critic.head))
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for q in list(cur.model.layers.parameters()) + list(cur_critic.parameters()):
            q.add_(0.05 * torch.randn(q.shape, generator=g))
    results = []
    for targets in (t_whole, t_split):  # the value head's gradient comes from the value loss alone
        denom = sum(t.denom for t in targets)
        losses = [ppo_loss(cur, cur_critic, t, args, denom, vocab_limit=vl) for t in targets]
        total = torch.stack([loss for loss, _ in losses]).sum()
        total.backward()
        results.append((float(total.detach()), sum(st["v_loss"] for _, st in losses), _grads(cur, cur_critic)))
    (lw, vw, gw), (ls, vs, gs) = results
    assert lw != 0.0 and vw != 0.0
    assert abs(lw - ls) <= 1e-5 and abs(vw - vs) <= 1e-5
    _assert_same_grads(gw, gs)


# ---- 64K context: packing only --------------------------------------------------------------------------
def _chain(n_prompt: int, n_out: int, seed: int, prefix: list[int] | None = None) -> list[CallRecord]:
    rng = random.Random(seed)
    prompt = (prefix or []) + [rng.randrange(1000, 150000) for _ in range(n_prompt - len(prefix or []))]
    out = [rng.randrange(1000, 150000) for _ in range(n_out)]
    return [CallRecord(episode_id=f"long{seed}", call_index=0, dialect="openai_chat", path="/v1/chat/completions",
                       stream=False, request={}, prompt_token_ids=prompt, output_token_ids=out,
                       output_logprobs=[-0.5] * n_out, finish_reason="length")]


def test_64k_context_packs_within_the_limit():
    chain = CallTree.from_calls(_chain(65536 - 512, 512, 0))
    packs = rollout_packs([chain], 65536)
    assert len(packs) == 1 and packs[0].num_tokens == 65536 and pack_stats(packs).packs_split == 0
    assert packs[0].num_trainable == 512 and packs[0].packed.is_chain
    two = [CallTree.from_calls(_chain(40000, 100, s)) for s in (1, 2)]
    assert [p.num_tokens for p in rollout_packs(two, 65536)] == [40100, 40100]
    shared = _chain(40000, 100, 3)[0].prompt_token_ids[:30000]  # two 40K calls sharing a 30K prefix: 50K tokens
    fork = CallTree.from_calls(_chain(40000, 100, 3, shared) + _chain(40000, 100, 4, shared))
    packs = rollout_packs([fork], 45000)
    assert [p.num_tokens for p in packs] == [40100, 40100]
    assert pack_stats(packs).recomputed_tokens == 30000 and sum(p.num_trainable for p in packs) == 200
    with pytest.raises(ConfigError, match="40100 tokens"):
        rollout_packs([fork], 40000)
