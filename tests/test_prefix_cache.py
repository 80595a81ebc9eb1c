"""The prefix-KV-reuse forward of a branched pack (``mask_form="prefix_cache"``) on a tiny random Qwen3 (fp32).

Hand-built trees over random token ids (``CallTree.from_calls`` turns the calls into a radix tree):
branches in the middle of a segment (of the context and of a sampled output), several roots and
several trees in one pack, and a deeper tree with branches of branches. On each, the prefix-cache
forward's hidden states, token logprobs and parameter gradients equal the dense-mask forward and the
per-path causal forward within 1e-5; ``auto`` picks it under sdpa/eager; GRPO's loss and update are
the same as with the dense mask.
"""

from __future__ import annotations

import copy
import random

import pytest

torch = pytest.importorskip("torch")

import trainers.grpo.train as grpo  # noqa: E402
import trainers.grpo.update as grpo_update  # noqa: E402
from clawgym_env.capture.records import CallRecord, EpisodeRecord  # noqa: E402
from clawgym_env.capture.tree import CallTree  # noqa: E402
from clawgym_env.errors import ConfigError  # noqa: E402
from clawgym_env.policy.tiny import build_tiny_qwen3  # noqa: E402
from trainers.batch.logprobs import forward_form, forward_segments, packed_hidden_states, token_logprobs  # noqa: E402
from trainers.batch.packing import PackedTree, pack_trees  # noqa: E402
from trainers.batch.tree_batch import make_groups, pack_groups  # noqa: E402
from trainers.policy import PolicyConfig, TrainablePolicy  # noqa: E402
from trainers.ppo.value import Critic  # noqa: E402

TOL = 1e-5


def rand_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 5000) for _ in range(n)]


def calls_of(seqs: list[tuple[list[int], int]], episode: str = "ep0", seed: int = 0) -> list[CallRecord]:
    """One call per (full token sequence, output length): prompt = all but the last ``n_out`` ids."""
    rng = random.Random(seed)
    out = []
    for i, (seq, n_out) in enumerate(seqs):
        out.append(CallRecord(episode_id=episode, call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                              stream=False, request={}, prompt_token_ids=list(seq[:-n_out]),
                              output_token_ids=list(seq[-n_out:]),
                              output_logprobs=[-rng.uniform(0.05, 4.0) for _ in range(n_out)], finish_reason="stop"))
    return out


def mid_segment_tree() -> CallTree:
    """A subagent branching inside the system prompt, a retry branching inside a sampled output."""
    rng = random.Random(1)
    system, out1, tool = rand_ids(rng, 40), rand_ids(rng, 9), rand_ids(rng, 11)
    seqs = [(system + out1, 9),
            (system[:23] + rand_ids(rng, 14) + rand_ids(rng, 6), 6),          # branch at token 23 of the context
            (system + out1[:4] + rand_ids(rng, 7), 11),                         # branch at token 4 of an output
            (system + out1 + tool + rand_ids(rng, 8), 8)]
    return CallTree.from_calls(calls_of(seqs))


def two_root_tree() -> CallTree:
    """Two roots in one tree (a compaction call that shares nothing), each with a branch."""
    rng = random.Random(2)
    a, b = rand_ids(rng, 30), rand_ids(rng, 25)
    b[0] = a[0] + 1  # never the same first token
    seqs = [(a + rand_ids(rng, 7), 7), (a + rand_ids(rng, 5), 5), (b + rand_ids(rng, 6), 6),
            (b[:12] + rand_ids(rng, 9), 9)]
    return CallTree.from_calls(calls_of(seqs, seed=2))


def deep_tree() -> CallTree:
    """Branches of branches, four levels deep, with a mid-segment split on the way."""
    rng = random.Random(3)
    s, a, b, c, d, e = (rand_ids(rng, n) for n in (24, 10, 9, 8, 7, 11))
    seqs = [(s + a + b + rand_ids(rng, 6), 6), (s + a + b + rand_ids(rng, 5), 5),
            (s + a + c + rand_ids(rng, 4), 4), (s + a + c + d + rand_ids(rng, 5), 5),
            (s + a + c + d + rand_ids(rng, 6), 6), (s + a + c + d[:3] + rand_ids(rng, 5), 8),
            (s + e + rand_ids(rng, 8), 8), (s + e[:4] + rand_ids(rng, 7), 7)]
    return CallTree.from_calls(calls_of(seqs, seed=3))


TREES = {"mid_segment": lambda: [mid_segment_tree()], "two_roots": lambda: [two_root_tree()],
         "deep": lambda: [deep_tree()], "several_trees": lambda: [deep_tree(), two_root_tree(), mid_segment_tree()]}


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_qwen3(tokenizer, seed=0)


def packed_of(name: str) -> PackedTree:
    p = pack_trees(TREES[name]())
    assert not p.is_chain
    return p


def path_forward(model, ids: list[int], vocab_limit: int):
    """Reference: an ordinary causal forward over one sequence → (hidden [n, H], logprobs of ids[1:])."""
    h = model.model(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0]
    logits = model.get_output_embeddings()(h[:-1])[:, :vocab_limit].float()
    return h, torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_trees_have_the_shapes_the_tests_claim():
    mid = pack_trees(mid_segment_tree())
    deep = pack_trees(deep_tree())
    two = pack_trees(two_root_tree())
    tree = mid.trees[0]
    assert any(len(n.children) >= 2 and not any(n.sampled) for n in tree.nodes)  # split inside the context
    assert any(len(n.children) >= 2 and n.sampled[-1] for n in tree.nodes)       # split inside an output
    assert len(two.trees[0].roots) == 2
    depth = [0] * deep.num_nodes
    for n, par in enumerate(deep.node_parent.tolist()):
        depth[n] = depth[par] + 1 if par >= 0 else 0
    branching = [n for n in range(deep.num_nodes) if int((deep.node_parent == n).sum()) >= 2]
    assert max(depth) >= 4 and len(branching) >= 3


def test_forward_segments_merge_only_children():
    p = pack_trees(mid_segment_tree())
    segs = forward_segments(p)
    assert [s[0] for s in segs[1:]] == [s[1] for s in segs[:-1]] and segs[0][0] == 0 and segs[-1][1] == p.num_tokens
    assert len(segs) < p.num_nodes  # the node after the mid-output split has one child: one forward for both
    for k, (start, _, parent) in enumerate(segs):
        assert parent < k and (parent < 0) == (int(p.position_ids[start]) == 0)
        if parent >= 0:  # the segment starts right after one of its parent's tokens on the path
            assert int(p.predecessor[start]) == segs[parent][1] - 1


@pytest.mark.parametrize("name", list(TREES))
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_hidden_states_and_logprobs_equal_dense_and_per_path(model, tokenizer, name, impl):
    vl = len(tokenizer)
    p = packed_of(name)
    model.set_attn_implementation(impl)
    try:
        assert forward_form(model, p) == "prefix_cache"
        with torch.no_grad():
            h_cache = packed_hidden_states(model, p, "prefix_cache")
            h_dense = packed_hidden_states(model, p, "additive")
            lp_auto = token_logprobs(model, p, chunk_size=61, vocab_limit=vl)
            lp_dense = token_logprobs(model, p, chunk_size=61, vocab_limit=vl, mask_form="additive")
    finally:
        model.set_attn_implementation("sdpa")
    assert h_cache.shape == h_dense.shape == (p.num_tokens, model.config.hidden_size)
    assert (h_cache - h_dense).abs().max() < TOL
    assert (lp_auto - lp_dense).abs().max() < TOL and float(lp_auto[p.predecessor < 0].abs().sum()) == 0.0
    with torch.no_grad():
        for k, (ti, leaf) in enumerate(p.path_leaves):
            h_ref, lp_ref = path_forward(model, p.trees[ti].sequence(leaf)[0], vl)
            assert (h_cache[p.paths[k]] - h_ref).abs().max() < TOL
            assert (lp_auto[p.paths[k][1:]] - lp_ref).abs().max() < TOL


def _grads(model):
    return {n: q.grad.detach().clone() for n, q in model.named_parameters() if q.grad is not None}


@pytest.mark.parametrize("name", list(TREES))
def test_gradients_equal_dense_and_per_path(model, tokenizer, name):
    """Loss: the mean over every path's sampled tokens (shared ones once per path) ⇔ packed × path_counts
    / their count (a mean, as the trainers' losses are: fp32 gradients of a sum reach ~10 here and
    differ by ~1e-6 of that between ANY two of the three forms). Gradients of a child's tokens reach
    its ancestors only through the cached keys/values."""
    vl = len(tokenizer)
    p = packed_of(name)
    scale = 1.0 / float((p.path_counts * p.target_mask).sum())  # 1 / sampled tokens over all paths
    w = p.path_counts * p.target_mask * scale
    grads, totals = {}, {}
    for form in ("prefix_cache", "additive"):
        model.zero_grad()
        loss = (token_logprobs(model, p, chunk_size=64, vocab_limit=vl, mask=p.target_mask, mask_form=form) * w).sum()
        loss.backward()
        grads[form], totals[form] = _grads(model), float(loss.detach())
    model.zero_grad()
    total = 0.0
    for ti, leaf in p.path_leaves:
        toks, flags, _ = p.trees[ti].sequence(leaf)
        loss = (path_forward(model, toks, vl)[1] * torch.tensor(flags[1:])).sum() * scale
        loss.backward()
        total += float(loss.detach())
    grads["per_path"] = _grads(model)
    model.zero_grad()
    assert abs(totals["prefix_cache"] - totals["additive"]) < TOL and abs(totals["prefix_cache"] - total) < TOL
    ref = grads["prefix_cache"]
    assert ref and "model.layers.0.self_attn.k_proj.weight" in ref
    for other in ("additive", "per_path"):
        assert grads[other].keys() == ref.keys()
        for n in ref:
            assert (grads[other][n] - ref[n]).abs().max() < TOL, (other, n)


def test_gradient_flows_into_ancestors_through_the_cache(model):
    """A loss on one leaf's last hidden state reaches every token of the shared root (run in its own
    forward) only through the cached keys/values: none of them may be detached."""
    p = packed_of("deep")
    embedded = []
    hook = model.get_input_embeddings().register_forward_hook(lambda mod, inp, out: embedded.append(out))
    try:
        h = packed_hidden_states(model, p, "prefix_cache")
    finally:
        hook.remove()
    assert len(embedded) == len(forward_segments(p)) > 1  # one forward per segment
    for e in embedded:
        e.retain_grad()
    h[p.paths[-1][-1]].pow(2).sum().backward()
    model.zero_grad()
    root = embedded[0].grad
    assert root is not None and bool((root[0].abs().sum(-1) > 0).all())


def test_auto_forms_and_no_dense_mask(model, tokenizer, monkeypatch):
    chain = CallTree.from_calls(calls_of([(rand_ids(random.Random(4), 20), 5)]))
    p = packed_of("several_trees")
    assert forward_form(model, pack_trees(chain)) == "causal"
    assert forward_form(model, p, "additive") == "additive"

    def boom(self):
        raise AssertionError("auto built a dense T x T mask")

    monkeypatch.setattr(PackedTree, "dense_mask", boom)
    with torch.no_grad():
        token_logprobs(model, p, vocab_limit=len(tokenizer))  # auto: no dense mask anywhere
    monkeypatch.undo()
    model.set_attn_implementation("flex_attention")
    try:
        assert forward_form(model, p) == "block"
    finally:
        model.set_attn_implementation("sdpa")


def test_gradient_checkpointing_falls_back_to_the_dense_mask(tokenizer):
    net = build_tiny_qwen3(tokenizer, seed=1)
    net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    net.train()
    p = packed_of("mid_segment")
    assert forward_form(net, p) == "additive"  # the layers would drop a KV cache
    with pytest.raises(ConfigError, match="gradient checkpointing"):
        packed_hidden_states(net, p, "prefix_cache")
    with torch.no_grad():  # no backward to replay: the cache is kept, so prefix caching is fine
        assert forward_form(net, p) == "prefix_cache"
        net.gradient_checkpointing_disable()
        ref = packed_hidden_states(net, p, "additive")
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        assert (packed_hidden_states(net, p) - ref).abs().max() < TOL


def test_value_head_reads_the_same_hidden_states(model):
    """A shared critic (PPO's forward_pack) reads packed_hidden_states; a trunk alone runs it too."""
    p = packed_of("deep")
    critic = Critic.on_policy(model, seed=0)
    with torch.no_grad():
        dense = critic.values_from_hidden(packed_hidden_states(model, p, "additive"), p, p.target_mask)
        auto = critic.values_from_hidden(packed_hidden_states(model, p), p, p.target_mask)
        trunk = packed_hidden_states(model.model, p)
    assert (auto - dense).abs().max() < TOL and float(auto.abs().sum()) > 0
    assert (trunk - packed_hidden_states(model, p, "additive").detach()).abs().max() < TOL


def grpo_episodes(n: int = 4):
    """A GRPO group over random ids: shared system prompt + task, then diverging multi-call episodes."""
    rng = random.Random(5)
    shared = rand_ids(rng, 48)
    out = []
    for e in range(n):
        seqs, prompt = [], list(shared) + rand_ids(rng, 2 * (e % 2))  # two branch points inside the context
        for c in range(2 + e % 2):
            output = rand_ids(random.Random(100 + c if c == 0 else 7 * e + c), 6)  # call 0's output is shared
            seqs.append((prompt + output, len(output)))
            prompt = prompt + output + rand_ids(rng, 5)
        rec = EpisodeRecord(episode_id=f"g{e}", task_id="t", suite="unit", harness="mini", policy="tiny", status="ok",
                            reward=float(e % 2 == 0), num_calls=len(seqs))
        out.append((rec, calls_of(seqs, episode=f"g{e}", seed=e)))
    return out


def test_grpo_loss_and_update_with_auto_equal_the_dense_mask(tokenizer, monkeypatch):
    packs = pack_groups(make_groups(grpo_episodes()))
    assert len(packs) == 1 and not packs[0].packed.is_chain and packs[0].packed.num_nodes >= 5
    base = TrainablePolicy(PolicyConfig(model="tiny", seed=3), tokenizer=tokenizer)
    assert forward_form(base.causal_lm, packs[0].packed) == "prefix_cache"
    args = grpo.Args(learning_rate=1.0, max_grad_norm=1e9, clip_eps=0.2)
    dense_logprobs = grpo_update.token_logprobs
    results = {}
    for form in ("auto", "additive"):
        pol = copy.deepcopy(base)
        if form != "auto":
            monkeypatch.setattr(grpo_update, "token_logprobs",
                                lambda *a, form=form, **k: dense_logprobs(*a, **{**k, "mask_form": form}))
        before = {n: q.detach().clone() for n, q in pol.causal_lm.named_parameters()}
        pk = packs[0]
        old = grpo._score(pol, pol.causal_lm, pk, args).detach()
        isw = torch.where(pk.trainable, torch.exp(old - pk.packed.rollout_logprobs).clamp(max=2.0),
                          torch.zeros_like(old))
        loss, _ = grpo.grpo_loss(grpo._score(pol, pol.causal_lm, pk, args), old, isw, pk, clip_low=0.2, clip_high=0.2)
        stats = grpo.grpo_update(pol, torch.optim.SGD(pol.trainable_parameters(), lr=1.0), packs, args)
        step = {n: q.detach() - before[n] for n, q in pol.causal_lm.named_parameters()}  # = -grad (SGD, lr 1)
        results[form] = (float(loss.detach()), stats, step)
        monkeypatch.undo()
    (la, sa, da), (ld, sd, dd) = results["auto"], results["additive"]
    assert abs(la - ld) < 1e-6 and la != 0.0
    assert sa["loss"] == pytest.approx(sd["loss"], abs=1e-6)
    assert sa["grad_norm"] == pytest.approx(sd["grad_norm"], rel=1e-5)
    assert sa["grad_norm"] > 0
    for n in da:
        assert (da[n] - dd[n]).abs().max() < TOL, n
