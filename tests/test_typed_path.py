"""The typed path from tree to loss: TreeMeta (also from older files), one batch builder, TrainSummary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from clawgym_env.capture.tree import CallTree, TreeNode
from clawgym_env.capture.tree_io import read_jsonl, to_jsonl, tree_to_dict
from clawgym_env.capture.tree_meta import EpisodeSummary, TreeMeta
from trainers.batch.advantages import episode_own_tokens, node_episodes
from trainers.summary import ExpertCounts, TrainSummary, read_summary

ROOT = Path(__file__).resolve().parents[1]


def branched_tree(meta: TreeMeta | None = None) -> CallTree:
    """root [1 2 3] (context) → [4 5] (sampled, shared) → {[6 7] (7 sampled) | [8] (sampled)}."""
    nodes = [TreeNode(0, None, [1, 2, 3], [False] * 3, [None] * 3, [0, 1], [1]),
             TreeNode(1, 0, [4, 5], [True, True], [-0.1, -0.2], [0, 1], [2, 3], depth=3),
             TreeNode(2, 1, [6, 7], [False, True], [None, -0.3], [0], [], depth=5),
             TreeNode(3, 1, [8], [True], [-0.4], [1], [], depth=5)]
    return CallTree(nodes, [0], meta or TreeMeta(call_episode=[0, 1]), {0: 2, 1: 3})


def test_a_tree_file_written_with_a_plain_meta_mapping_still_reads(tmp_path):
    line = tree_to_dict(branched_tree())
    line["meta"] = {"tree_id": "old", "call_episode": [0, 1], "episodes": [{"episode_id": "a", "reward": 1.0},
                                                                          {"episode_id": "b", "reward": 0.0}],
                    "inexact_calls": [1], "harness": "mini", "custom": {"kept": True}}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (tree,) = read_jsonl(path)
    m = tree.meta
    assert isinstance(m, TreeMeta) and m.tree_id == "old" and m.harness == "mini"
    assert m.prompt_lengths is None and m.num_calls is None and m.build.retries == 0  # not recorded
    assert m.episodes[1] == EpisodeSummary(episode_id="b", reward=0.0) and m.episode_rewards() == [1.0, 0.0]
    assert tree.stats().num_calls == 2  # falls back to the calls with a leaf
    assert node_episodes(tree) == [[0, 1], [0, 1], [0], [1]]
    assert episode_own_tokens(tree)[1] == {0: [True, True], 1: [True, True]}  # no prompt lengths: node.sampled
    back = read_jsonl(to_jsonl([tree], tmp_path / "new.jsonl"))
    assert back == [tree] and (back[0].meta.model_extra or {})["custom"] == {"kept": True}


def test_tree_meta_is_frozen_and_typed():
    meta = TreeMeta(call_episode=[0, 1])
    with pytest.raises(ValidationError):
        meta.reward = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        TreeMeta.model_validate({"episodes": [{"reward": "not a number"}]})
    assert TreeMeta().episode_count() == 1 and meta.episode_count() == 2 and meta.episode_of(1) == 1


def test_no_reader_treats_tree_meta_as_a_dict():
    """Tree meaning is read by attribute everywhere (the typed record replaced the ``meta`` dict)."""
    offenders = []
    for folder in ("trainers", "clawgym_env/capture"):
        for path in sorted((ROOT / folder).rglob("*.py")):  # every concept folder of the package
            text = path.read_text(encoding="utf-8")
            for needle in ('meta.get(', 'meta["', "meta['", '"meta", None'):
                if needle in text:
                    offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert not offenders


def test_the_trainable_rule_has_one_implementation():
    """Only trainers/batch/packing.py combines the masks into the trainable rule; every trainer calls it."""
    copies = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "trainers").rglob("*.py"))
              if "logprob_known & ~" in p.read_text(encoding="utf-8") or
              "inexact_token_mask(" in p.read_text(encoding="utf-8")]
    assert copies == ["trainers/batch/packing.py"], copies


def test_ppo_loss_weights_come_from_the_one_batch_builder():
    torch = pytest.importorskip("torch")
    from trainers.batch.tree_batch import TrainPack, rollout_pack
    from trainers.ppo.targets import loss_weights

    batch = rollout_pack([branched_tree()])
    assert isinstance(batch, TrainPack) and [e.trainable_tokens for e in batch.episodes] == [3, 3]
    assert torch.equal(batch.trainable, batch.packed.target_mask & batch.packed.logprob_known)
    w, denom = loss_weights(batch, "tree")
    third = torch.tensor(1 / 3, dtype=torch.float32)
    expect = [0.0, 0.0, 0.0, float(third + third), float(third + third), 0.0, float(third), float(third)]
    assert w.tolist() == pytest.approx(expect) and denom == 2.0
    w_tok, denom_tok = loss_weights(batch, "token")
    assert w_tok.tolist() == [0.0, 0.0, 0.0, 2.0, 2.0, 0.0, 1.0, 1.0] and denom_tok == 6.0


def test_train_summary_round_trips_through_summary_json(tmp_path):
    s = TrainSummary(algo="sft", out_dir=str(tmp_path), steps=3, metrics=str(tmp_path / "metrics.jsonl"),
                     last={"step": 3, "loss": 0.5, "eval/pass_rate": 0.25, "eval/mini/episodes": 4},
                     expert=ExpertCounts(episodes=4, kept=3, infra_failures=1, reward_mean=0.75), episodes=3)
    path = s.write()
    assert path == tmp_path / "summary.json" and read_summary(tmp_path) == s
    assert json.loads(path.read_text())["expert"]["kept"] == 3
    assert s.eval_metrics == {"eval/pass_rate": 0.25, "eval/mini/episodes": 4} and s.final_loss == 0.5
    assert s.expert is not None and s.expert.as_metrics()["expert_kept"] == 3
