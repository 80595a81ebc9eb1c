"""Tree packing on a tiny random Qwen3 (fp32, real tokenizer): packed == per-path, values and gradients.

Trees are built by ``CallTree.from_calls`` from synthetic calls whose ids come from the real chat
template: a multi-turn chain, a subagent branching inside the system prompt, a retry forking at the
output, a compaction call that shares nothing (a second root), and a GRPO group of episodes.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from clawgym_env.capture.records import CallRecord, EpisodeRecord  # noqa: E402
from clawgym_env.capture.tree import CallTree  # noqa: E402
from clawgym_env.errors import ConfigError  # noqa: E402
from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids, render_prompt_text  # noqa: E402
from clawgym_env.policy.tiny import build_tiny_qwen3  # noqa: E402
from trainers.batch.logprobs import chunked_logprobs, mask_form_for, token_logprobs  # noqa: E402
from trainers.batch.packing import pack_batch, pack_trees, tree_tokens  # noqa: E402

SYSTEM = "You are a careful coding agent. Use the tools to inspect the workspace before answering."
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object",
                                                          "properties": {"path": {"type": "string"}}}}}]


def call(tok, i, prompt, out_text, episode="ep0", seed=0):
    out = list(tok.encode(out_text, add_special_tokens=False))
    rng = random.Random(seed * 1000 + i)
    return CallRecord(episode_id=episode, call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                      stream=False, request={}, prompt_token_ids=list(prompt), output_token_ids=out,
                      output_logprobs=[-rng.uniform(0.01, 5.0) for _ in out], finish_reason="stop")


def agent_calls(tok, task="Count the lines of notes.txt", episode="ep0", turns=3, seed=0):
    """A token-exact agent episode: each prompt = previous prompt + previous output + a tool-result tail."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    calls: list[CallRecord] = []
    prompt = render_prompt_ids(tok, msgs, TOOLS)
    for t in range(turns):
        path = f"f{t + 1}.txt"
        text = (assistant_text("", tool_calls=[("read_file", {"path": path})])
                if t < turns - 1 else assistant_text(f"There are {seed + 3} lines."))
        prev = call(tok, t, prompt, text, episode, seed)
        calls.append(prev)
        msgs = msgs + [{"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{t}", "type": "function", "function": {"name": "read_file", "arguments": {"path": path}}}]},
            {"role": "tool", "tool_call_id": f"c{t}", "content": f"line {t} of {episode}"}]
        rendered = render_prompt_text(tok, msgs, TOOLS)
        tail = rendered[rendered.rindex("</tool_call><|im_end|>") + len("</tool_call><|im_end|>"):]
        prompt = prev.prompt_token_ids + prev.output_token_ids + list(tok.encode(tail, add_special_tokens=False))
    return calls


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_qwen3(tokenizer, seed=0)


@pytest.fixture(scope="module")
def branchy_tree(tokenizer):
    """Chain + subagent (branch inside the system prompt) + forked retry + a compaction root."""
    calls = agent_calls(tokenizer)
    sub_prompt = render_prompt_ids(tokenizer, [{"role": "system", "content": SYSTEM[:40] + " Summarise files."},
                                               {"role": "user", "content": "Summarise f1.txt"}])
    calls.append(call(tokenizer, 3, sub_prompt, assistant_text("It is short.")))
    forked = calls[1]
    calls.append(call(tokenizer, 4, forked.prompt_token_ids, assistant_text("I will stop here."), seed=9))
    compact = list(tokenizer.encode("Summary of the conversation so far: two files read.",
                                    add_special_tokens=False))
    calls.append(call(tokenizer, 5, compact, assistant_text("Continue with f3.txt.")))
    tree = CallTree.from_calls(calls)
    tree.validate()
    return tree


def group_tree(tok, n=3):
    eps = []
    for e in range(n):
        calls = agent_calls(tok, episode=f"g{e}", turns=2 + e, seed=e)
        rec = EpisodeRecord(episode_id=f"g{e}", task_id="count", suite="unit", harness="mini", policy="tiny",
                            status="ok", reward=float(e % 2))
        eps.append((rec, calls))
    return CallTree.from_episodes(eps)


def path_logprobs(model, ids, vocab_limit):
    """Reference: an ordinary causal forward over one sequence; logprob of ids[1:]."""
    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, :-1, :vocab_limit].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_layout_positions_predecessors_and_counts(branchy_tree):
    tree = branchy_tree
    assert len(tree.roots) == 2 and len(tree.leaves()) >= 4
    assert any(len(n.children) >= 2 and not any(n.sampled) for n in tree.nodes)  # branch inside context
    p = pack_trees(tree)
    assert p.num_tokens == tree_tokens(tree) == sum(len(n.tokens) for n in tree.nodes)
    assert int(p.node_offsets[-1]) == p.num_tokens and (p.node_parent < torch.arange(p.num_nodes)).all()
    visits = Counter(n for leaf in tree.leaves() for n in tree.path(leaf))
    for k, leaf in enumerate(tree.leaves()):
        assert p.path_leaves[k] == (0, leaf)
        toks, flags, lps = tree.sequence(leaf)
        idx = p.paths[k]
        assert p.input_ids[idx].tolist() == toks and p.sampled[idx].tolist() == flags
        assert p.position_ids[idx].tolist() == list(range(len(toks)))
        assert p.predecessor[idx].tolist() == [-1] + idx[:-1].tolist()
        known = [lp is not None for lp in lps]
        assert p.logprob_known[idx].tolist() == known
        assert torch.allclose(p.rollout_logprobs[idx][torch.tensor(known)],
                              torch.tensor([lp for lp in lps if lp is not None]))
    for nid, node in enumerate(tree.nodes):
        sl = p.node_slice(0, nid)
        assert p.input_ids[sl].tolist() == node.tokens
        assert set(p.path_counts[sl].tolist()) == {float(visits[nid])}
    for c in tree.call_leaf:
        assert p.input_ids[p.call_indices(0, c)].tolist() == tree.call_sequence(c)[0]
    # the dense mask is exactly "ancestors + own node up to self"
    mask, node_of = p.dense_mask(), p.token_node
    i, j = 40, 3
    assert bool(mask[i, j]) and not bool(mask[j, i])
    for a, b in itertools.product(range(p.num_nodes), repeat=2):
        na, nb = (node_of == a).nonzero()[0, 0], (node_of == b).nonzero()[0, 0]
        ancestor = b in [int(x) for x in _chain(p, a)]
        assert bool(mask[na, nb]) == (ancestor and nb <= na)


def _chain(p, n):
    out = []
    while n >= 0:
        out.append(n)
        n = int(p.node_parent[n])
    return out


@pytest.mark.parametrize("impl,form", [("sdpa", "bool"), ("sdpa", "additive"), ("eager", "additive"),
                                       ("flex_attention", "block")])
def test_packed_logprobs_equal_per_path(model, tokenizer, branchy_tree, impl, form):
    vl = len(tokenizer)
    model.set_attn_implementation(impl)
    try:
        p = pack_trees(branchy_tree)
        with torch.no_grad():
            lp = token_logprobs(model, p, chunk_size=97, vocab_limit=vl, mask_form=form)
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            for k, leaf in enumerate(branchy_tree.leaves()):
                ref = path_logprobs(model, branchy_tree.sequence(leaf)[0], vl)
                assert (lp[p.paths[k][1:]] - ref).abs().max() < 1e-5
        assert float(lp[p.predecessor < 0].abs().sum()) == 0.0
    finally:
        model.set_attn_implementation("sdpa")


def test_eager_with_bool_mask_is_wrong_so_auto_uses_additive(model, tokenizer, branchy_tree):
    p = pack_trees(branchy_tree)
    model.set_attn_implementation("eager")
    try:
        assert mask_form_for(model) == "additive"
        with torch.no_grad():
            bad = token_logprobs(model, p, vocab_limit=len(tokenizer), mask_form="bool")
            good = token_logprobs(model, p, vocab_limit=len(tokenizer))
    finally:
        model.set_attn_implementation("sdpa")
    assert (bad - good).abs().max() > 1e-2  # the bool mask was added to the scores, not applied


def test_group_and_multi_tree_packs_equal_per_path(model, tokenizer):
    vl = len(tokenizer)
    group = group_tree(tokenizer)
    assert len(group.roots) == 1 and len(group.leaves()) == 3
    singles = [CallTree.from_calls(agent_calls(tokenizer, episode=f"s{e}", turns=2, seed=e)) for e in range(3)]
    packs = pack_batch([group] + singles, max_tokens=tree_tokens(group) + tree_tokens(singles[0]))
    assert [len(p.trees) for p in packs] == [2, 2]
    with torch.no_grad():
        for p in packs:
            lp = token_logprobs(model, p, vocab_limit=vl)
            for k, (ti, leaf) in enumerate(p.path_leaves):
                ref = path_logprobs(model, p.trees[ti].sequence(leaf)[0], vl)
                assert (lp[p.paths[k][1:]] - ref).abs().max() < 1e-5
            starts = [s for s, _ in p.tree_ranges]
            assert p.position_ids[starts].tolist() == [0] * len(starts)
            assert not p.dense_mask()[starts[1]:, :starts[1]].any()  # trees never see each other


def test_single_chain_runs_causal_without_a_mask(model, tokenizer, branchy_tree):
    chain = CallTree.from_calls(agent_calls(tokenizer, turns=3))
    p = pack_trees(chain)
    assert p.is_chain and not pack_trees(branchy_tree).is_chain and not pack_trees([chain, chain]).is_chain
    with torch.no_grad():
        fast = token_logprobs(model, p, vocab_limit=len(tokenizer))
        masked = token_logprobs(model, p, vocab_limit=len(tokenizer), mask_form="bool")
    assert (fast - masked).abs().max() < 1e-5 and fast[p.target_mask].abs().min() > 0
    with pytest.raises(ConfigError, match="one chain"):
        token_logprobs(model, pack_trees(branchy_tree), mask_form="causal")


def _grads(model):
    return {n: q.grad.detach().clone() for n, q in model.named_parameters() if q.grad is not None}


@pytest.mark.parametrize("weighting", ["per_path", "once"])
def test_packed_gradients_equal_per_path(model, tokenizer, branchy_tree, weighting):
    """per_path: each path counts its sampled tokens (shared ones once per path) ⇔ packed × path_counts.
    once: every distinct sampled token once ⇔ per-path terms divided by the number of paths through it."""
    vl = len(tokenizer)
    tree = branchy_tree
    p = pack_trees(tree)
    visits = Counter(n for leaf in tree.leaves() for n in tree.path(leaf))
    model.zero_grad()
    lp = token_logprobs(model, p, chunk_size=128, vocab_limit=vl, mask=p.target_mask)
    w = p.path_counts if weighting == "per_path" else torch.ones_like(p.path_counts)
    (lp * w * p.target_mask).sum().backward()
    packed = _grads(model)
    model.zero_grad()
    total = 0.0
    for leaf in tree.leaves():
        toks, flags, _ = tree.sequence(leaf)
        node_of = [nid for nid in tree.path(leaf) for _ in tree.nodes[nid].tokens]
        ref = path_logprobs(model, toks, vl)
        scale = torch.tensor([1.0 if weighting == "per_path" else 1.0 / visits[node_of[i]]
                              for i in range(1, len(toks))])
        loss = (ref * torch.tensor(flags[1:]) * scale).sum()
        loss.backward()
        total += float(loss.detach())
    per_path = _grads(model)
    model.zero_grad()
    assert abs(total - float((lp * w * p.target_mask).sum())) < 1e-3
    assert packed.keys() == per_path.keys() and packed
    for name in packed:
        assert (packed[name] - per_path[name]).abs().max() < 1e-5, name


@pytest.mark.parametrize("dtype,recompute,ent_only", [("float32", True, False), ("float32", False, False),
                                                      ("float64", True, False), ("float64", True, True)])
def test_chunked_logprobs_equal_unchunked(model, tokenizer, recompute, dtype, ent_only):
    """Values (and entropies) within 1e-5 in fp32; gradients exact in float64 (1e-10). In fp32 the head's
    gradient sums 151k vocabulary terms in another order, so there it is checked to 1e-4 of its scale."""
    vl, temp = len(tokenizer) - 5, 0.7
    net = model if dtype == "float32" else build_tiny_qwen3(tokenizer, seed=0).double()
    ids = render_prompt_ids(tokenizer, [{"role": "user", "content": "Say something short about packing."}])
    x = torch.tensor([ids])
    targets = torch.tensor(ids[1:])
    head = net.get_output_embeddings()
    results = {}
    for chunk in (None, 1, 7, 1024):
        net.zero_grad()
        h = net.model(input_ids=x, use_cache=False).last_hidden_state[0, :-1]
        if chunk is None:  # unchunked reference: full logits, plain autograd
            logits = head(h)[:, :vl]
            logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temp, -1)
            lp = logp_all.gather(1, targets[:, None])[:, 0]
            ent = -(logp_all.exp() * logp_all).sum(-1)
        else:
            lp, ent = chunked_logprobs(h, head, targets, chunk, temp, vl, return_entropy=True, recompute=recompute)
        assert lp.dtype == getattr(torch, dtype)
        ((0.0 if ent_only else lp.sum()) + 0.3 * ent.sum()).backward()
        results[chunk] = (lp.detach(), ent.detach(), _grads(net))
    ref_lp, ref_ent, ref_g = results[None]
    for chunk in (1, 7, 1024):
        lp, ent, g = results[chunk]
        # fp32 sums over a 151k vocabulary: about 1e-6 relative to the values (entropy ~12 nats)
        assert (lp - ref_lp).abs().max() < 1e-5 * max(1.0, float(ref_lp.abs().max()))
        assert (ent - ref_ent).abs().max() < 1e-5 * max(1.0, float(ref_ent.abs().max()))
        assert g.keys() == ref_g.keys() and "model.embed_tokens.weight" in g  # tied head gets its gradient
        for name in ref_g:
            tol = 1e-10 if dtype == "float64" else 1e-4 * max(1.0, float(ref_g[name].abs().max()))
            assert (g[name] - ref_g[name]).abs().max() < tol, (chunk, name)
    net.zero_grad()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_prefix_cache_forward_equals_per_path_and_is_auto(model, tokenizer, branchy_tree, impl):
    """The branchy tree (chat-template ids, two roots, a branch inside the system prompt) through the
    prefix-KV-reuse forward: what ``auto`` runs under sdpa/eager, equal to the dense mask and per path."""
    from trainers.batch.logprobs import forward_form

    vl = len(tokenizer)
    p = pack_trees([branchy_tree, group_tree(tokenizer)])
    model.set_attn_implementation(impl)
    try:
        assert forward_form(model, p) == "prefix_cache"
        with torch.no_grad():
            lp = token_logprobs(model, p, chunk_size=97, vocab_limit=vl)
            dense = token_logprobs(model, p, chunk_size=97, vocab_limit=vl, mask_form="additive")
    finally:
        model.set_attn_implementation("sdpa")
    assert (lp - dense).abs().max() < 1e-5
    with torch.no_grad():
        for k, (ti, leaf) in enumerate(p.path_leaves):
            ref = path_logprobs(model, p.trees[ti].sequence(leaf)[0], vl)
            assert (lp[p.paths[k][1:]] - ref).abs().max() < 1e-5
