"""PPO with a critic over call trees (tiny random Qwen3, real tokenizer, fp32).

The reference for every packed quantity is an independent per-path computation: each root→leaf
sequence through its own ordinary causal forward, GAE written out along each path and combined on
shared nodes by the documented rule (mean over the paths through a token), each path's tokens
weighted by ``1 / (trees × tokens over all paths of its tree)``.
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")

from clawgym_env.capture.records import CallRecord, EpisodeRecord  # noqa: E402
from clawgym_env.capture.tree import CallTree  # noqa: E402
from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids  # noqa: E402
from clawgym_env.policy.tiny import build_tiny_qwen3  # noqa: E402
from trainers.batch.advantages import leaf_rewards, tree_gae  # noqa: E402
from trainers.batch.logprobs import token_logprobs  # noqa: E402
from trainers.batch.packing import pack_trees, tree_tokens  # noqa: E402
from trainers.batch.tree_batch import rollout_pack  # noqa: E402
from trainers.ppo.train import Args, add_reference, ppo_loss, prepare, update  # noqa: E402
from trainers.ppo.value import Critic, node_values, packed_values  # noqa: E402


def _call(tok, episode, i, prompt, text, seed):
    out = list(tok.encode(assistant_text(text), add_special_tokens=False))
    return CallRecord(episode_id=episode, call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                      stream=False, request={}, prompt_token_ids=list(prompt), output_token_ids=out,
                      output_logprobs=[0.0] * len(out), finish_reason="stop")


def _episode(tok, episode, answers, seed, retry=None):
    """A token-exact chain of calls (each prompt extends the last prompt + output); ``retry`` re-sends the
    last call's prompt with another answer (a fork after sampled tokens shared by both branches)."""
    prompt = render_prompt_ids(tok, [{"role": "system", "content": "You are an agent. Be brief."},
                                     {"role": "user", "content": "Count the lines of notes.txt"}])
    calls = []
    for i, text in enumerate(answers):
        calls.append(_call(tok, episode, i, prompt, text, seed))
        if i < len(answers) - 1:
            tail = tok.encode(f"<|im_start|>user\nresult {i}<|im_end|>\n<|im_start|>assistant\n",
                              add_special_tokens=False)
            prompt = calls[-1].prompt_token_ids + calls[-1].output_token_ids + list(tail)
    if retry is not None:
        calls.append(_call(tok, episode, len(calls), calls[-1].prompt_token_ids, retry, seed))
    return calls


def _tree(tok, task, specs):
    eps = []
    for e, (answers, retry, reward) in enumerate(specs):
        rec = EpisodeRecord(episode_id=f"{task}-{e}", task_id=task, suite="unit", harness="mini", policy="tiny",
                            status="ok", reward=reward)
        eps.append((rec, _episode(tok, f"{task}-{e}", answers, e, retry)))
    tree = CallTree.from_episodes(eps)
    tree.validate()
    return tree


def _set_rollout_logprobs(model, trees, vocab_limit, seed=0):
    """Rollout logprobs = the model's own ± noise, so IS weights are near 1 and some get truncated."""
    rng = random.Random(seed)
    for tree in trees:
        p = pack_trees(tree)
        with torch.no_grad():
            lp = token_logprobs(model, p, vocab_limit=vocab_limit).tolist()
        offs = p.node_offsets.tolist()
        for k, nid in enumerate(p.node_ids.tolist()):
            node = tree.nodes[nid]
            node.logprobs = [lp[offs[k] + j] + rng.uniform(-0.8, 0.8) if s else None
                             for j, s in enumerate(node.sampled)]


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_qwen3(tokenizer, seed=0).train()


@pytest.fixture(scope="module")
def trees(tokenizer, model):
    """A group tree (two episodes, rewards 1 and 0, one with a retry fork) and a single-episode chain."""
    group = _tree(tokenizer, "count", [(["Reading it.", "There are 3 lines."], "It has 4 lines.", 1.0),
                                       (["Reading the file slowly.", "5 lines."], None, 0.0)])
    single = _tree(tokenizer, "sum", [(["Opening the CSV.", "Total is 12."], None, 0.5)])
    assert len(group.leaves()) == 3 and len(single.leaves()) == 1
    shared_sampled = [n for n in group.nodes if len(n.children) >= 1 and any(n.sampled)]
    assert shared_sampled, "the retry fork must leave sampled tokens on a shared node"
    _set_rollout_logprobs(model, [group, single], len(tokenizer))
    return [group, single]


def _path_gae(tree, values, gamma, lam):
    """Per-path GAE written out along each path, combined by the mean over paths through a token."""
    rewards = leaf_rewards(tree, [e.reward for e in tree.meta.episodes])
    acc = defaultdict(list)
    for leaf in tree.leaves():
        steps = [(n, j) for n in tree.path(leaf) for j, s in enumerate(tree.nodes[n].sampled) if s]
        vals = [values[n][j] for n, j in steps]
        adv = 0.0
        for k in reversed(range(len(steps))):
            nxt = vals[k + 1] if k + 1 < len(steps) else 0.0
            r = rewards[leaf] if k == len(steps) - 1 else 0.0
            adv = r + gamma * nxt - vals[k] + gamma * lam * adv
            acc[steps[k]].append((adv, adv + vals[k]))
    return {key: (sum(a for a, _ in v) / len(v), sum(r for _, r in v) / len(v)) for key, v in acc.items()}


def _path_forward(model, head, ids, vocab_limit, temperature):
    """Ordinary causal forward over one sequence → (logp of ids[1:], entropy, value before ids[1:])."""
    h = model.model(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0, :-1]
    logits = model.get_output_embeddings()(h)[:, :vocab_limit].float() / temperature
    logp_all = torch.log_softmax(logits, -1)
    lp = logp_all.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return lp, ent, head(h)


def _per_path_loss(model, old_model, ref_model, head, old_head, trees, args, vocab_limit):
    """The PPO loss of :mod:`trainers.ppo.train` from scratch, per rollout: every root-to-leaf path is an
    ordinary causal forward; each episode's loss is the mean of its own DISTINCT sampled tokens' terms
    (a token on a prefix shared by two of its paths counts once), and the episodes are averaged."""
    per_episode: list = []
    for tree in trees:
        leaves = tree.leaves()
        seqs = [tree.sequence(leaf) for leaf in leaves]
        terms: dict = {}  # (node, index) -> the token's loss term (identical on every path through it)
        call_episode = tree.meta.call_episode
        owners = [{call_episode[c] for c in tree.nodes[leaf].calls} for leaf in leaves]
        values = [[0.0] * len(n.tokens) for n in tree.nodes]
        with torch.no_grad():
            olds = [_path_forward(old_model, old_head, s[0], vocab_limit, args.temperature) for s in seqs]
            refs = [_path_forward(ref_model, old_head, s[0], vocab_limit, args.temperature)[0] for s in seqs]
        for leaf, (_, _, v_old) in zip(leaves, olds):
            at = [(n, j) for n in tree.path(leaf) for j in range(len(tree.nodes[n].tokens))]
            for i, (n, j) in enumerate(at[1:]):
                values[n][j] = float(v_old[i])
        combined = _path_gae(tree, values, args.gamma, args.lam)
        for leaf, (ids, flags, lps), (old_lp, _, old_v), ref_lp in zip(leaves, seqs, olds, refs):
            at = [(n, j) for n in tree.path(leaf) for j in range(len(tree.nodes[n].tokens))][1:]
            lp, ent, v = _path_forward(model, head, ids, vocab_limit, args.temperature)
            m = torch.tensor(flags[1:])
            adv = torch.tensor([combined.get(key, (0.0, 0.0))[0] for key in at])
            ret = torch.tensor([combined.get(key, (0.0, 0.0))[1] for key in at])
            roll = torch.tensor([x if x is not None else 0.0 for x in lps[1:]])
            is_w = torch.exp(old_lp - roll).clamp(max=args.is_clip)
            ratio = torch.exp(lp - old_lp)
            pg = -is_w * torch.minimum(ratio * adv, ratio.clamp(1 - args.clip_eps, 1 + args.clip_high) * adv)
            vc = old_v + (v - old_v).clamp(-args.vf_clip, args.vf_clip)
            vl = 0.5 * torch.maximum((v - ret) ** 2, (vc - ret) ** 2)
            q = ref_lp - lp
            tok = pg + args.vf_coef * vl - args.ent_coef * ent + args.kl_coef * (torch.exp(q) - q - 1)
            for key, keep, term in zip(at, m.tolist(), tok):
                if keep:
                    terms.setdefault(key, term)
        for e in sorted(set().union(*owners)):
            mine = {key for leaf, own in zip(leaves, owners) if e in own
                    for key in [(n, j) for n in tree.path(leaf) for j in range(len(tree.nodes[n].tokens))]
                    if key in terms}
            per_episode.append(sum(terms[key] for key in mine) / len(mine))
    return sum(per_episode) / len(per_episode)


def _grads(*modules):
    return {f"{i}.{n}": q.grad.detach().clone() for i, mod in enumerate(modules)
            for n, q in mod.named_parameters() if q.grad is not None}


def test_packed_loss_and_gradients_equal_per_rollout_reference(model, tokenizer, trees):
    vl = len(tokenizer)
    args = Args(gamma=0.9, lam=0.8, vf_clip=0.05, ent_coef=0.01, kl_coef=0.1, clip_eps=0.1, clip_eps_high=0.15,
                temperature=0.9, chunk_size=64, minibatches=1)
    old = copy.deepcopy(model)
    ref = build_tiny_qwen3(tokenizer, seed=3).train()
    critic = Critic.on_policy(old, init_std=0.1)
    targets = prepare(old, critic, [rollout_pack(trees)], args, vocab_limit=vl)
    add_reference(targets, ref, args, vocab_limit=vl)
    t = targets[0]
    assert t.denom == 3 and bool((t.is_weight[t.mask] < args.is_clip).any())  # three episodes
    assert bool((t.is_weight[t.mask] == args.is_clip).any()), "some IS weights must be truncated"
    cur = copy.deepcopy(old)  # a policy one update away from the rollout one: ratios differ from 1
    cur_head = copy.deepcopy(critic.head)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for q in list(cur.model.layers.parameters()) + list(cur_head.parameters()):
            q.add_(0.05 * torch.randn(q.shape, generator=g))
    cur_critic = Critic(cur_head)
    loss, stats = ppo_loss(cur, cur_critic, t, args, t.denom, vocab_limit=vl)
    assert stats["clip_fraction"] > 0
    loss.backward()
    packed = _grads(cur, cur_head)
    cur.zero_grad(), cur_head.zero_grad()
    ref_loss = _per_path_loss(cur, old, ref, cur_head, critic.head, trees, args, vl)
    assert float(ref_loss.detach()) != 0.0
    ref_loss.backward()
    per_path = _grads(cur, cur_head)
    cur.zero_grad(), cur_head.zero_grad()
    assert abs(float(loss.detach()) - float(ref_loss.detach())) < 1e-5
    assert packed.keys() == per_path.keys() and "1.linear.weight" in packed and "0.model.norm.weight" in packed
    for name in packed:
        assert (packed[name] - per_path[name]).abs().max() < 1e-5, name


def test_shared_prefix_value_is_one_row_computed_once(model, tokenizer, trees):
    group = trees[0]
    pack = pack_trees(group)
    path_len = sum(len(group.sequence(leaf)[0]) for leaf in group.leaves())
    for kind in ("shared", "separate"):
        critic = Critic.on_policy(model, init_std=0.1) if kind == "shared" else Critic.separate(model, init_std=0.1)
        trunk = model.model if kind == "shared" else critic.trunk
        seen, head_rows = [], []
        h1 = trunk.embed_tokens.register_forward_hook(
            lambda m, i, o, seen=seen: seen.append(int(i[0].numel())))
        h2 = critic.head.linear.register_forward_hook(
            lambda m, i, o, rows=head_rows: rows.append(int(i[0].shape[0])))
        try:
            with torch.no_grad():
                hidden = trunk(input_ids=pack.input_ids[None], position_ids=pack.position_ids[None],
                               attention_mask=pack.attention_mask("bool"), use_cache=False).last_hidden_state[0]
                v = packed_values(critic, pack, hidden if kind == "shared" else None, mask=pack.target_mask)
        finally:
            h1.remove(), h2.remove()
        # the trunk runs over the tree's tokens once (shared prefixes once), not over every path: one
        # forward (shared: the call above) or one per branch segment (separate: prefix-KV reuse)
        assert sum(seen[1:] if kind == "separate" else seen) == tree_tokens(group) < path_len
        distinct = pack.predecessor[pack.target_mask].unique().numel()
        assert head_rows[-1] == distinct
        shared = (pack.path_counts > 1) & pack.target_mask
        assert int(shared.sum()) > 0
        with torch.no_grad():
            for k, leaf in enumerate(group.leaves()):
                ids = group.sequence(leaf)[0]
                h = trunk(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0, :-1]
                per_path = critic.head(h)
                idx = pack.paths[k][1:]
                m = pack.target_mask[idx]
                assert (v[idx][m] - per_path[m]).abs().max() < 1e-5
        # branching right after a sampled token: every child's first token is judged from the same state,
        # so it gets the very same value (one head row), whichever branch it starts
        lists = node_values(pack, v)[0]
        forks = [n for n in group.nodes if len(n.children) > 1 and n.sampled[-1]]
        assert forks
        for n in forks:
            firsts = {lists[c][0] for c in n.children if group.nodes[c].sampled[0]}
            assert len(firsts) == 1 and firsts != {0.0}
        assert any(any(x != 0.0 for x in row) for row in lists)


def test_gae_returns_are_the_value_targets(model, tokenizer, trees):
    vl = len(tokenizer)
    args = Args(gamma=0.95, lam=0.7, vf_clip=0.0, vf_coef=1.0)
    critic = Critic.on_policy(model, init_std=0.2)
    pack = pack_trees(trees)
    t = prepare(model, critic, [rollout_pack(trees)], args, vocab_limit=vl)[0]
    vals = node_values(pack, t.old_values)
    for ti, tree in enumerate(trees):
        adv, ret = tree_gae(tree, vals[ti], leaf_rewards(tree, [e.reward for e in tree.meta.episodes]),
                            gamma=args.gamma, lam=args.lam)
        by_hand = _path_gae(tree, vals[ti], args.gamma, args.lam)
        for nid, node in enumerate(tree.nodes):
            sl = pack.node_slice(ti, nid)
            assert t.returns[sl].tolist() == pytest.approx(ret[nid], abs=1e-6)
            assert t.advantages[sl].tolist() == pytest.approx(adv[nid], abs=1e-6)
            for j, s in enumerate(node.sampled):
                if s:
                    assert ret[nid][j] == pytest.approx(by_hand[(nid, j)][1], abs=1e-9)
                    assert adv[nid][j] == pytest.approx(by_hand[(nid, j)][0], abs=1e-9)
    # gamma = lam = 1: the group tree's sampled tokens shared by the two branches of episode 0 (rewards
    # 1 and 1) get return 1; its first sampled token ("Reading"), shared by all three leaves (rewards 1,
    # 1 and 0), gets their mean 2/3, which no single path gives
    t1 = prepare(model, critic, [rollout_pack(trees)], Args(), vocab_limit=vl)[0]
    end = pack.tree_ranges[0][1]
    three = (pack.path_counts[:end] == 3) & pack.target_mask[:end]
    assert int(three.sum()) >= 1
    assert t1.returns[:end][three].tolist() == pytest.approx([2 / 3] * int(three.sum()))
    shared = (pack.path_counts[:end] == 2) & pack.target_mask[:end]
    assert int(shared.sum()) > 0
    assert t1.returns[:end][shared].tolist() == pytest.approx([1.0] * int(shared.sum()))
    assert t1.advantages[:end][shared].tolist() == pytest.approx((1.0 - t1.old_values[:end][shared]).tolist(), abs=1e-6)
    # the value loss regresses on exactly those returns (no clipping: 0.5 * (V - R)^2, path-weighted)
    with torch.no_grad():
        loss, _ = ppo_loss(model, critic, t, args, t.denom, value_only=True, vocab_limit=vl)
        v = packed_values(critic, pack, _hidden(model, pack), mask=pack.target_mask)
    w = t.weight / t.denom
    assert float(loss) == pytest.approx(float((w * 0.5 * (v - t.returns) ** 2).sum()), rel=1e-6)
    assert float(loss) > 0


def _hidden(model, pack):
    from trainers.batch.logprobs import packed_hidden_states

    return packed_hidden_states(model, pack)


def _optimizer(model, critic, lr, critic_lr):
    """One AdamW over both, as the trainer builds it (weight decay on: a frozen policy must still not move)."""
    return torch.optim.AdamW([{"params": list(model.parameters()), "lr": lr},
                              {"params": list(critic.parameters()), "lr": critic_lr}], weight_decay=0.1)


def _snapshot(module):
    return {n: q.detach().clone() for n, q in module.state_dict().items()}


def _eval_loss(m, critic, targets, args, vl, value_only=False):
    with torch.no_grad():
        return sum(float(ppo_loss(m, critic, t, args, sum(x.denom for x in targets), value_only=value_only,
                                  vocab_limit=vl)[0]) for t in targets)


def test_one_ppo_step_changes_parameters_and_lowers_its_loss(model, tokenizer, trees):
    vl = len(tokenizer)
    m = copy.deepcopy(model)
    args = Args(update_epochs=1, minibatches=1, ent_coef=0.001)
    critic = Critic.on_policy(m, init_std=0.1)
    targets = prepare(m, critic, [rollout_pack(trees)], args, vocab_limit=vl)
    before_params = _snapshot(m)
    head_before = _snapshot(critic)
    before = _eval_loss(m, critic, targets, args, vl)
    stats = update(m, critic, targets, args, _optimizer(m, critic, 1e-4, 1e-3), vocab_limit=vl)
    after = _eval_loss(m, critic, targets, args, vl)
    assert after < before - 1e-4, (before, after)
    assert stats["loss"] == pytest.approx(before, rel=1e-5)  # the step's own loss was the pre-step one
    changed = [n for n, q in m.state_dict().items() if not torch.equal(q, before_params[n])]
    assert "model.layers.0.self_attn.q_proj.weight" in changed and "model.embed_tokens.weight" in changed
    assert not torch.equal(critic.head.linear.weight, head_before["head.linear.weight"])
    assert stats["grad_norm"] > 0 and stats["grad_norm_value"] > 0


@pytest.mark.parametrize("kind", ["shared", "separate"])
def test_value_pretraining_lowers_value_loss_and_freezes_policy(model, tokenizer, trees, kind):
    vl = len(tokenizer)
    m = copy.deepcopy(model)
    args = Args(update_epochs=10, minibatches=2, vf_clip=0.0)
    critic = Critic.on_policy(m, init_std=0.1) if kind == "shared" else Critic.separate(m, init_std=0.1)
    targets = prepare(m, critic, [rollout_pack(trees[:1]), rollout_pack(trees[1:])], args, vocab_limit=vl)
    policy_before = _snapshot(m)
    critic_before = _snapshot(critic)
    v_before = _eval_loss(m, critic, targets, args, vl, value_only=True)
    order = random.Random(0)  # a fixed minibatch order: the test does not depend on the global RNG
    stats = update(m, critic, targets, args, _optimizer(m, critic, 1e-3, 3e-3), pretrain=True, vocab_limit=vl,
                   rng=order)
    v_after = _eval_loss(m, critic, targets, args, vl, value_only=True)
    assert v_after < 0.5 * v_before, (v_before, v_after)
    assert "pg_loss" not in stats and "grad_norm" not in stats
    assert all(torch.equal(q, policy_before[n]) for n, q in m.state_dict().items())  # bit-identical policy
    assert all(q.grad is None for q in m.parameters())
    moved = [n for n, q in critic.state_dict().items() if not torch.equal(q, critic_before[n])]
    assert "head.linear.weight" in moved
    if kind == "separate":  # the critic's own trunk trains; it never shared a tensor with the policy
        assert any(n.startswith("trunk.layers.") for n in moved)


def _e2e_config(tmp_path):
    return {"algo": "ppo", "out_dir": str(tmp_path / "run"), "steps": 2, "save_every": 1, "value_pretrain_steps": 1,
            "harnesses": {"mini": 1.0}, "tasks_per_step": 2, "samples_per_task": 1, "concurrency": 2,
            "max_tokens": 16, "policy": {"model": "tiny", "device": "cpu"}, "critic": "separate",
            "learning_rate": 1e-4, "critic_learning_rate": 1e-3, "minibatches": 2, "log": {"plot": False},
            "eval": {"suite": str(_one_task_suite(tmp_path)), "every": 2}}


def _one_task_suite(tmp_path):
    """A held-out suite of one builtin task (a folder of task dirs), for the in-loop evaluation."""
    import shutil

    from tasks import load_suite

    src = load_suite("builtin").get("write_greeting").task_dir
    dest = tmp_path / "heldout" / "write_greeting"
    shutil.copytree(src, dest)
    return dest.parent


def test_clawgym_train_config_runs_ppo_end_to_end(tmp_path, tokenizer):
    """``clawgym train --config FILE``: 2 steps (value pretraining, then PPO) on the mini harness, a real
    subprocess as a user runs it: real sandboxes, proxy, tiny policy sampling, critic, sync, checkpoints."""
    import json
    import subprocess
    import sys

    import yaml

    cfg = tmp_path / "ppo.yaml"
    cfg.write_text(yaml.safe_dump(_e2e_config(tmp_path)))
    proc = subprocess.run([sys.executable, "-m", "clawgym_cli", "train", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "run"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["value_pretrain", "ppo"]
    assert [r["version"] for r in rows] == [0, 1]  # synced after the policy update only
    for r in rows:
        assert r["mini/episodes"] + r["mini/infra_failures"] == 2 and r["trees"] >= 1
        assert r["mini/trained_tokens"] == r["trained_tokens"] > 0 and r["v_loss"] > 0
    assert "pg_loss" not in rows[0] and rows[1]["grad_norm"] > 0 and rows[1]["clip_fraction"] is not None
    # in-loop evaluation after the last step only (eval_every=2), through every harness of the mix
    assert not any(k.startswith("eval/") for k in rows[0])
    assert rows[1]["eval/mini/episodes"] + rows[1]["eval/mini/infra_failures"] == 1
    assert rows[1]["eval/episodes"] == rows[1]["eval/mini/episodes"]
    calls = [json.loads(line) for p in (out / "episodes").glob("*/calls.jsonl") for line in p.read_text().splitlines()]
    # both training steps sampled before the first sync; the final evaluation samples the synced version 1
    versions = sorted(json.loads(p.read_text())["policy_version"] for p in (out / "episodes").glob("*/episode.json"))
    assert calls and versions == [0] * 4 + [1]
    from trainers.scale.checkpoint import checkpoint_tensors

    state = checkpoint_tensors(out / "checkpoints" / "step_000002")
    init = build_tiny_qwen3(tokenizer, seed=0)
    up = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(state["policy"][up], init.model.layers[0].mlp.up_proj.weight)
    first = checkpoint_tensors(out / "checkpoints" / "step_000001")  # after value pretraining only
    assert torch.equal(first["policy"][up], init.model.layers[0].mlp.up_proj.weight)
    assert not torch.equal(first["critic"][f"trunk.{up[len('model.'):]}"], init.model.layers[0].mlp.up_proj.weight)
    critic = Critic.separate(init)
    critic.load_state_dict(state["critic"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algo"] == "ppo" and summary["version"] == 1
