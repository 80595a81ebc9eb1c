"""Advantage functions on hand-built trees, against values computed by hand."""

from __future__ import annotations

import pytest

from clawgym_env.capture.tree import CallTree, TreeNode
from clawgym_env.capture.tree_meta import TreeMeta
from trainers.batch.advantages import (
    episode_token_weights,
    group_advantages,
    is_constant,
    leaf_rewards,
    node_episodes,
    tree_gae,
)


def branched_tree() -> CallTree:
    """root [1 2 3] (context) → [4 5] (sampled, shared) → {[6 7] (7 sampled) | [8] (sampled)}."""
    nodes = [TreeNode(0, None, [1, 2, 3], [False] * 3, [None] * 3, [0, 1], [1]),
             TreeNode(1, 0, [4, 5], [True, True], [-0.1, -0.2], [0, 1], [2, 3], depth=3),
             TreeNode(2, 1, [6, 7], [False, True], [None, -0.3], [0], [], depth=5),
             TreeNode(3, 1, [8], [True], [-0.4], [1], [], depth=5)]
    return CallTree(nodes, [0], TreeMeta(call_episode=[0, 1]), {0: 2, 1: 3})


VALUES = [[0.0] * 3, [0.5, 0.4], [0.0, 0.6], [0.2]]


def test_grpo_group_advantages_by_hand():
    assert group_advantages([1.0, 0.0, 0.0, 1.0], normalize_std=False) == [0.5, -0.5, -0.5, 0.5]
    adv = group_advantages([1.0, 0.0], eps=0.0)
    assert adv == pytest.approx([1.0, -1.0])
    assert group_advantages([0.2, 0.4, 0.9], normalize_std=False) == pytest.approx([-0.3, -0.1, 0.4])
    assert is_constant([0.5, 0.5, 0.5]) and not is_constant([0.5, 0.6])


def test_episode_weights_count_shared_tokens_once_per_episode():
    tree = branched_tree()
    assert node_episodes(tree) == [[0, 1], [0, 1], [0], [1]]
    w = episode_token_weights(tree)
    # each episode sampled 3 distinct tokens (2 shared + 1 own); G = 2 → 1/6 per token per episode
    assert w[1] == pytest.approx({0: 1 / 6, 1: 1 / 6})
    assert w[2] == pytest.approx({0: 1 / 6}) and w[3] == pytest.approx({1: 1 / 6})
    # every episode's weights sum to 1/G over its sampled tokens
    for e in (0, 1):
        total = sum(w[n.id].get(e, 0.0) * sum(n.sampled) for n in tree.nodes)
        assert total == pytest.approx(0.5)


def test_gae_gamma_lambda_one_on_branched_tree():
    tree = branched_tree()
    rewards = leaf_rewards(tree, [1.0, 0.0])
    assert rewards == {2: 1.0, 3: 0.0}
    adv, ret = tree_gae(tree, VALUES, rewards)
    # per path A_t = R - V_t; the shared node takes the mean over the two paths
    assert adv[1] == pytest.approx([(0.5 - 0.5) / 2, (0.6 - 0.4) / 2])
    assert adv[2] == pytest.approx([0.0, 0.4]) and adv[3] == pytest.approx([-0.2])
    assert ret[1] == pytest.approx([0.5, 0.5]) and ret[2][1] == pytest.approx(1.0) and ret[3] == pytest.approx([0.0])
    assert adv[0] == [0.0, 0.0, 0.0]


def test_gae_discounted_by_hand():
    adv, _ = tree_gae(branched_tree(), VALUES, {2: 1.0, 3: 0.0}, gamma=0.9, lam=0.8)
    # leaf 2 path: 0.4, 0.428, 0.16816; leaf 3 path: -0.2, -0.364, -0.40208 (computed by hand)
    assert adv[2][1] == pytest.approx(0.4)
    assert adv[3][0] == pytest.approx(-0.2)
    assert adv[1] == pytest.approx([(0.16816 - 0.40208) / 2, (0.428 - 0.364) / 2])
