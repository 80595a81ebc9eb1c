"""A third-party RL loop on ClawGym: only ``gym.make`` and serialised call trees, no ``trainers``.

This is what a user of another RL framework writes. ClawGym provides the environment (one
``step`` = one sandboxed harness episode, graded) and the data (every model call at token level);
the algorithm, the model and the optimiser are the user's own. Here: plain REINFORCE with a group
baseline on a tiny Qwen3, in about a hundred lines.

The loop, per step:

1. ``env.reset(options={"task_id": ...})`` / ``env.step(action)`` ``G`` times per task: the action sets
   the sampling temperature and the policy version recorded on every call; ``info`` holds the
   episode record and the captured calls (exact prompt ids, sampled ids, logprobs).
2. The group's calls become one call tree (``CallTree.from_episodes``) written as JSON lines by
   ``write_trees_jsonl`` — the hand-off format; a trainer in any language reads it
   (one object per tree: ``nodes`` with ``tokens``/``sampled``/``parent``, ``call_leaf``, ``meta``
   with per-episode rewards and ``call_episode``).
3. The file is read back with plain ``json``; each call's sequence is rebuilt by walking ``parent``
   links from its leaf, and each episode's sampled tokens get ``A_e = r_e - mean(r)``.
4. One REINFORCE step on ``-Σ A_e · mean log p(sampled tokens of e)``, then the new weights go to
   the serving policy (``update_weights`` bumps its version).

Run: ``python examples/third_party_loop.py --steps 2`` (CPU, a few minutes; needs bubblewrap).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import gymnasium as gym
import torch

# importing clawgym_env registers the ClawGym/* environment ids; its public API is importable from it
from clawgym_env import (
    CallRecord,
    CallTree,
    EpisodeRecord,
    TransformersPolicy,
    load_suite,
    make_policy,
    write_trees_jsonl,
)

SUITE = Path(__file__).resolve().parents[1] / "tasks" / "families" / "count_errors_train"


def call_sequences(tree: dict) -> list[tuple[int, list[int], list[bool]]]:
    """(episode, tokens, sampled flags) of every call of a tree read as plain JSON."""
    nodes = {n["id"]: n for n in tree["nodes"]}
    call_episode = tree["meta"].get("call_episode")  # absent or null: the whole tree is one episode
    out = []
    for call, leaf in tree["call_leaf"]:
        chain, nid = [], leaf
        while nid is not None:
            chain.append(nodes[nid])
            nid = nodes[nid]["parent"]
        tokens = [t for n in reversed(chain) for t in n["tokens"]]
        sampled = [s for n in reversed(chain) for s in n["sampled"]]
        out.append((call_episode[call] if call_episode else 0, tokens, sampled))
    return out


def reinforce_loss(model, tree: dict, vocab: int) -> torch.Tensor:
    """-Σ_e A_e · (mean logprob of e's distinct sampled tokens) / G for one group tree."""
    rewards = [ep["reward"] for ep in tree["meta"]["episodes"]]
    mean = sum(rewards) / len(rewards)
    per_episode: dict[int, dict[tuple, torch.Tensor]] = {}
    for e, tokens, sampled in call_sequences(tree):
        logits = model(input_ids=torch.tensor([tokens])).logits[0, :, :vocab].float()
        logp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]
        for j in range(1, len(tokens)):
            if sampled[j]:  # a token shared by several calls of one episode counts once
                per_episode.setdefault(e, {}).setdefault(tuple(tokens[:j + 1]), logp[j - 1])
    loss = torch.zeros(())
    for e, toks in per_episode.items():
        loss = loss - (rewards[e] - mean) * torch.stack(list(toks.values())).mean() / len(rewards)
    return loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(SUITE))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tasks-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", default="runs/third_party")
    args = ap.parse_args()

    serving = make_policy("tiny", seed=0)                # the serving copy of a tiny random Qwen3 ...
    assert isinstance(serving, TransformersPolicy)       # (in-process weights: update_weights below)
    model = copy.deepcopy(serving.model).train()         # ... and the user's own, trained here
    tok = serving.tokenizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    env = gym.make("ClawGym/Mini-v0", policy=serving, suite=args.suite)
    task_ids = [t.id for t in load_suite(args.suite)]
    out = Path(args.out)
    for step in range(args.steps):
        trees_file = out / f"trees_step{step}.jsonl"
        trees = []
        for task_id in task_ids[step * args.tasks_per_step:(step + 1) * args.tasks_per_step]:
            group = []
            for _ in range(args.group_size):
                env.reset(options={"task_id": task_id})
                _, reward, _, _, info = env.step({"temperature": args.temperature, "top_p": 1.0,
                                                  "max_tokens": args.max_tokens, "policy_version": serving.version})
                if info["is_infra_failure"]:
                    continue  # the sandbox failed: not a 0 for the policy, just no data
                group.append((EpisodeRecord.model_validate(info["episode"]),
                              [CallRecord.model_validate(c) for c in info["calls"]]))
            if group and any(calls for _, calls in group):
                trees.append(CallTree.from_episodes(group))
        write_trees_jsonl(trees, trees_file)

        optimizer.zero_grad()
        rewards, loss = [], torch.zeros(())
        with trees_file.open() as fh:
            for line in fh:
                tree = json.loads(line)
                rewards += [ep["reward"] for ep in tree["meta"]["episodes"]]
                loss = loss + reinforce_loss(model, tree, len(tok))
        if loss.requires_grad:
            loss.backward()
            optimizer.step()
        version = serving.update_weights(model.state_dict())
        print(f"step {step}: {len(rewards)} episodes, mean reward {sum(rewards) / max(1, len(rewards)):.3f}, "
              f"loss {float(loss.detach()):.4f}, serving version {version}, trees in {trees_file}")
    env.close()


if __name__ == "__main__":
    main()
