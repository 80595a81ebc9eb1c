"""GRPO over call trees on a tiny random Qwen3 (fp32, real tokenizer and chat template).

Episodes are synthetic but shaped like captured ones: multi-call chains whose next prompt extends
the last prompt and output, groups whose episodes share the task prefix, two episodes that sampled
an identical first turn (a shared *sampled* node), an infrastructure failure, a constant-reward
group, a call recorded as not token-exact, and two harness labels.
"""

from __future__ import annotations

import copy
import hashlib
import random

import pytest

torch = pytest.importorskip("torch")

from clawgym_env.capture.records import CallRecord, EpisodeRecord  # noqa: E402
from clawgym_env.errors import PolicyError  # noqa: E402
from clawgym_env.policy.chat_format import assistant_text, render_prompt_ids  # noqa: E402
from trainers.batch.tree_batch import make_groups, pack_groups  # noqa: E402
from trainers.grpo.train import Args, grpo_loss, grpo_update  # noqa: E402
from trainers.metrics import rollout_metrics  # noqa: E402
from trainers.policy import PolicyConfig, TrainablePolicy  # noqa: E402

SYSTEM = "You are a careful agent. Use the tools, then answer."


def fake_logprob(seq: list[int]) -> float:
    """A rollout logprob that depends only on the token and its prefix (equal for equal prefixes)."""
    h = int(hashlib.sha1(str(seq).encode()).hexdigest()[:8], 16)
    return -0.05 - (h % 1000) / 400.0


def make_calls(tok, episode_id: str, task: str, outputs: list[str]) -> list[CallRecord]:
    prompt = render_prompt_ids(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}])
    calls = []
    for i, text in enumerate(outputs):
        out = list(tok.encode(text, add_special_tokens=False))
        lps = [fake_logprob(prompt + out[:j + 1]) for j in range(len(out))]
        calls.append(CallRecord(episode_id=episode_id, call_index=i, dialect="openai_chat", path="/v1/chat/completions",
                                stream=False, request={}, prompt_token_ids=list(prompt), output_token_ids=out,
                                output_logprobs=lps, finish_reason="stop"))
        tail = list(tok.encode(f"\n<|im_start|>user\n<tool_response>\nresult {i} of {episode_id}\n</tool_response>"
                               "<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False))
        prompt = prompt + out + tail
    return calls


def episode(tok, eid, task, outputs, reward, harness="mini", status="ok"):
    rec = EpisodeRecord(episode_id=eid, task_id=task.split()[0], suite="unit", harness=harness, policy="tiny",
                        status=status, reward=reward, num_calls=len(outputs))
    return rec, make_calls(tok, eid, task, outputs)


def tool(path):
    return assistant_text("", tool_calls=[("read_file", {"path": path})])


@pytest.fixture(scope="module")
def episodes(tokenizer):
    a = "alpha Count the lines of a.txt"
    b = "beta Report the size of b.txt"
    c = "gamma Say hello"
    return [
        episode(tokenizer, "a0", a, [tool("a.txt"), tool("b.txt"), assistant_text("It has 3 lines.")], 1.0),
        episode(tokenizer, "a1", a, [tool("a.txt"), tool("b.txt"), assistant_text("It has 4 lines.")], 0.0),
        episode(tokenizer, "a2", a, [tool("c.txt"), assistant_text("I could not tell.")], 0.5),
        episode(tokenizer, "a3", a, [tool("a.txt")], 0.0, status="infra_error"),
        episode(tokenizer, "b0", b, [tool("b.txt"), assistant_text("12 bytes.")], 1.0, harness="claude-code"),
        episode(tokenizer, "b1", b, [assistant_text("No idea.")], 0.0, harness="claude-code"),
        episode(tokenizer, "c0", c, [assistant_text("hello")], 1.0),
        episode(tokenizer, "c1", c, [assistant_text("hello!")], 1.0),
    ]


@pytest.fixture(scope="module")
def policy(tokenizer):
    return TrainablePolicy(PolicyConfig(model="tiny", seed=3), tokenizer=tokenizer)


def test_groups_exclude_infra_and_constant(episodes):
    groups = make_groups(episodes)
    by_task = {g.key[1]: g for g in groups}
    assert set(by_task) == {"alpha", "beta", "gamma"}
    alpha = by_task["alpha"]
    assert alpha.infra_excluded == 1 and [r.episode_id for r, _ in alpha.episodes] == ["a0", "a1", "a2"]
    assert abs(sum(alpha.advantages)) < 1e-9 and alpha.skipped is None
    assert by_task["gamma"].skipped == "constant_reward" and by_task["gamma"].tree is None
    packs = pack_groups(groups)
    assert {e.task_id for p in packs for e in p.episodes} == {"alpha", "beta"}
    assert all(e.episode_id != "a3" for p in packs for e in p.episodes)
    # weights: each trained group contributes (episodes with tokens) / G, averaged over 2 groups
    total = sum(float(p.pair_weight.sum()) for p in packs)
    assert total == pytest.approx(1.0, abs=1e-6)


def test_shared_sampled_tokens_are_one_token_many_pairs(episodes):
    alpha = next(g for g in make_groups(episodes) if g.key[1] == "alpha")
    pack = pack_groups([alpha])[0]
    # all three episodes sampled the same tool-call opening, a0 and a1 the same first call: those
    # tokens exist once in the pack, with one pair per episode that sampled them
    tokens, counts = torch.unique(pack.pair_token, return_counts=True)
    assert int(counts.max()) == 3 and bool((counts == 2).any())
    assert pack.num_trainable == tokens.numel() < int(pack.pair_token.numel())
    w = torch.zeros(pack.num_tokens).index_add_(0, pack.pair_token, pack.pair_weight)
    assert torch.allclose(w, pack.token_weight)


def test_inexact_calls_are_masked(episodes, tokenizer):
    rec, calls = episode(tokenizer, "a9", "alpha Count the lines of a.txt", [tool("z.txt"), assistant_text("9.")], 0.2)
    calls = [c.model_copy(update={"token_exact": i != 1}) for i, c in enumerate(calls)]
    eps = [e for e in episodes if e[0].task_id == "alpha"] + [(rec, calls)]
    pack = pack_groups(make_groups(eps))[0]
    assert pack.masked_inexact_tokens == len(calls[1].output_token_ids)
    out_ids = calls[1].output_token_ids
    assert sum(e.trainable_tokens for e in pack.episodes if e.episode_id == "a9") == len(calls[0].output_token_ids)
    assert len(out_ids) > 0


def per_call_loss(model, policy, episodes, old_model, ref_model, args):
    """The GRPO loss built independently: every call a separate causal sequence, no tree."""
    from trainers.batch.advantages import group_advantages

    def logps(m, seq, start):
        out = m(input_ids=torch.tensor([seq])).logits[0].float() / args.temperature
        lp = torch.log_softmax(out[:, :policy.vocab_limit], -1)
        return {j: lp[j - 1, seq[j]] for j in range(start, len(seq))}

    groups: dict = {}
    for rec, calls in episodes:
        if rec.status != "infra_error":
            groups.setdefault((rec.task_id, rec.harness), []).append((rec, calls))
    live = {k: v for k, v in groups.items() if len({r.reward for r, _ in v}) > 1}
    total = 0.0
    for eps in live.values():
        adv = group_advantages([r.reward for r, _ in eps], normalize_std=args.normalize_std)
        G = len(eps)
        for (_rec, calls), a in zip(eps, adv):
            toks: dict = {}  # prefix -> (logp, old, rollout, ref) of this episode's distinct sampled tokens
            for c in calls:
                seq = list(c.prompt_token_ids) + list(c.output_token_ids)
                start = len(c.prompt_token_ids)
                cur, old, ref = logps(model, seq, start), logps(old_model, seq, start), logps(ref_model, seq, start)
                for j in range(start, len(seq)):
                    toks.setdefault(tuple(seq[:j + 1]), (cur[j], old[j].detach(), c.output_logprobs[j - start],
                                                         ref[j].detach()))
            n = len(toks)
            for cur, old, roll, ref in toks.values():
                ratio = torch.exp(cur - old)
                w = torch.clamp(torch.exp(old - roll), max=args.is_clip)
                surr = torch.minimum(ratio * a, ratio.clamp(1 - args.clip_eps, 1 + args.clip_eps) * a)
                d = ref - cur
                total = total + (-w * surr + args.kl_coef * (torch.exp(d) - d - 1)) / (G * n * len(live))
    return total


def test_packed_tree_loss_and_grads_equal_per_call(episodes, tokenizer):
    args = Args(clip_eps=0.1, is_clip=1.5, kl_coef=0.3, temperature=1.0, normalize_std=True)
    pol = TrainablePolicy(PolicyConfig(model="tiny", seed=5), tokenizer=tokenizer)
    old_model = copy.deepcopy(pol.causal_lm).eval()
    ref_model = copy.deepcopy(pol.causal_lm).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the current model drifted from the old one, so ratios leave the clip range
        for p in pol.causal_lm.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    for p in ref_model.parameters():
        p.data.add_(torch.randn(p.shape, generator=g) * 0.02)
    from trainers.batch.logprobs import token_logprobs

    packs = pack_groups(make_groups(episodes))
    packed_total = 0.0
    clipped = 0.0
    for pack in packs:
        with torch.no_grad():
            old = token_logprobs(old_model, pack.packed, mask=pack.trainable, vocab_limit=pol.vocab_limit)
            ref = token_logprobs(ref_model, pack.packed, mask=pack.trainable, vocab_limit=pol.vocab_limit)
        isw = torch.where(pack.trainable, torch.exp(old - pack.packed.rollout_logprobs).clamp(max=args.is_clip),
                          torch.zeros_like(old))
        cur = token_logprobs(pol.causal_lm, pack.packed, mask=pack.trainable, vocab_limit=pol.vocab_limit)
        loss, st = grpo_loss(cur, old, isw, pack, clip_low=args.clip_eps, clip_high=args.clip_eps,
                             kl_coef=args.kl_coef, logp_ref=ref)
        packed_total = packed_total + loss
        clipped += st["clipped_tokens"]
    assert clipped > 0, "the test should exercise clipping"
    params = [p for p in pol.causal_lm.parameters()]
    g_packed = torch.autograd.grad(packed_total, params)
    flat_total = per_call_loss(pol.causal_lm, pol, episodes, old_model, ref_model, args)
    g_flat = torch.autograd.grad(flat_total, params)
    assert float(packed_total.detach()) == pytest.approx(float(flat_total.detach()), abs=1e-5)
    for a, b in zip(g_packed, g_flat):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), float((a - b).abs().max())


def test_grpo_step_changes_parameters_and_lowers_loss(episodes, tokenizer):
    pol = TrainablePolicy(PolicyConfig(model="tiny", seed=7), tokenizer=tokenizer)
    args = Args(learning_rate=1e-4, clip_eps=0.2, max_grad_norm=10.0)
    packs = pack_groups(make_groups(episodes))
    before = {k: v.detach().clone() for k, v in pol.causal_lm.named_parameters()}

    def loss_now(olds, weights):
        with torch.no_grad():
            total = 0.0
            for pack, old, w in zip(packs, olds, weights):
                cur = token_logprobs(pol.causal_lm, pack.packed, mask=pack.trainable, vocab_limit=pol.vocab_limit)
                total += float(grpo_loss(cur, old, w, pack, clip_low=0.2, clip_high=0.2)[0])
            return total

    from trainers.batch.logprobs import token_logprobs

    with torch.no_grad():
        olds = [token_logprobs(pol.causal_lm, p.packed, mask=p.trainable, vocab_limit=pol.vocab_limit) for p in packs]
    for p, o in zip(packs, olds):  # on-policy: the rollout sampled from this very model
        p.packed.rollout_logprobs = torch.where(p.trainable, o, torch.zeros_like(o))
    weights = [p.trainable.float() for p in packs]
    start = loss_now(olds, weights)  # -Σ W·A at ratio 1: 0, advantages are centred per group
    assert abs(start) < 1e-6
    opt = torch.optim.AdamW(pol.trainable_parameters(), lr=args.learning_rate)
    stats = grpo_update(pol, opt, packs, args)
    assert stats["updates"] == 1 and stats["trainable_tokens"] > 0
    assert stats["loss"] == pytest.approx(start, abs=1e-6)  # the update's own loss at ratio 1
    changed = sum(not torch.equal(before[k], v) for k, v in pol.causal_lm.named_parameters())
    assert changed == len(before)
    assert stats["is_weight_mean"] == pytest.approx(1.0, abs=1e-6) and stats["kl_rollout"] == pytest.approx(0, abs=1e-9)
    assert loss_now(olds, weights) < start - 1e-3


def test_mix_harness_metrics_and_groups(episodes):
    m = rollout_metrics(episodes)
    assert m["mini/episodes"] == 5 and m["mini/infra_failures"] == 1
    assert m["claude-code/episodes"] == 2 and m["claude-code/pass_rate"] == pytest.approx(0.5)
    assert m["mini/reward_mean"] == pytest.approx((1 + 0 + 0.5 + 1 + 1) / 5)
    assert m["infra_failures"] == 1 and m["episodes"] == 7
    harnesses = {e.harness for p in pack_groups(make_groups(episodes)) for e in p.episodes}
    assert harnesses == {"mini", "claude-code"}


def test_lora_serving_weights_are_merged(tokenizer):
    pol = TrainablePolicy(PolicyConfig(model="tiny", seed=1, lora_rank=4, lora_alpha=8.0,
                                       lora_targets=["q_proj", "v_proj", "down_proj"]), tokenizer=tokenizer)
    trainable, total = pol.num_parameters()
    assert 0 < trainable < total / 100
    with torch.no_grad():
        for n, p in pol.module.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)  # B starts at zero; make the adapters matter
    state = pol.serving_state_dict()
    plain = pol.serving_copy()
    assert set(state) == set(plain.state_dict())
    ids = torch.tensor([list(range(100, 140))])
    with torch.no_grad():
        want = pol.causal_lm(input_ids=ids).logits
        got = plain(input_ids=ids).logits
        with pol.reference() as ref:
            base = ref(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5)
    assert not torch.allclose(want, base, atol=1e-3)

    from trainers.scale.weight_sync import InProcessSync

    sync = InProcessSync.for_policy(pol)
    with torch.no_grad():
        for n, p in pol.module.named_parameters():
            if "lora_A" in n:
                p.add_(0.05)
    assert sync.push(pol, 1) == 1 and sync.serving.version == 1
    with torch.no_grad():
        assert torch.allclose(sync.serving.model(input_ids=ids).logits, pol.causal_lm(input_ids=ids).logits, atol=1e-5)
    with pytest.raises(PolicyError):
        sync.push(pol, 1)  # versions must increase
    random.seed(0)


def test_third_party_example_uses_only_the_env_and_serialised_trees(episodes, tmp_path):
    """The example imports nothing from ``trainers`` and rebuilds every call exactly from the tree JSONL."""
    import ast
    import importlib.util
    import json
    from pathlib import Path

    from clawgym_env.capture.tree import CallTree
    from clawgym_env.capture.tree_io import to_jsonl

    path = Path(__file__).resolve().parents[1] / "examples" / "third_party_loop.py"
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [n])}
    assert not any(m == "trainers" or m.startswith("trainers.") for m in imported)
    assert "gymnasium" in imported and "clawgym_env" in imported  # the env and its public API (tree JSONL)
    spec = importlib.util.spec_from_file_location("third_party_loop", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    group = [e for e in episodes if e[0].task_id == "alpha" and e[0].status == "ok"]
    to_jsonl([CallTree.from_episodes(group)], tmp_path / "t.jsonl")
    tree = json.loads((tmp_path / "t.jsonl").read_text())
    got = example.call_sequences(tree)
    want = [(e, list(c.prompt_token_ids) + list(c.output_token_ids))
            for e, (_, calls) in enumerate(group) for c in calls]
    assert [(e, toks) for e, toks, _ in got] == want
    for (_e, _toks, sampled), (_, c) in zip(got, [(e, c) for e, (_, calls) in enumerate(group) for c in calls]):
        assert all(sampled[len(c.prompt_token_ids):])  # its own outputs are sampled tokens


def test_directory_sync_writes_loadable_versions(tokenizer, tmp_path):
    from clawgym_env.policy.transformers_backend import TransformersPolicy
    from trainers.scale.weight_sync import DirectorySync, WeightSync

    pol = TrainablePolicy(PolicyConfig(model="tiny", seed=4), tokenizer=tokenizer)
    seen = []
    sync = DirectorySync(tmp_path / "weights", notify=lambda path, v: seen.append((path.name, v)), keep=1)
    assert isinstance(sync, WeightSync)
    assert sync.push(pol, 1) == 1
    with torch.no_grad():
        next(pol.causal_lm.parameters()).add_(0.5)
    assert sync.push(pol, 2) == 2 and seen == [("v1", 1), ("v2", 2)]
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2"]  # keep=1 pruned v1
    served = TransformersPolicy.from_pretrained(tmp_path / "weights" / "v2", device="cpu")
    name, param = next(iter(pol.causal_lm.named_parameters()))
    assert torch.equal(dict(served.model.named_parameters())[name], param.detach())
    with pytest.raises(PolicyError):
        sync.push(pol, 2)
