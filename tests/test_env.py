"""The Gymnasium environment: check_env passes and an episode returns calls with token ids."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import clawgym_env  # noqa: F401 - registers the ids
from clawgym_env.errors import RegistrationError


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = gym.make("ClawGym/Mini-v0", policy="scripted:expert", out_dir=tmp_path_factory.mktemp("env"))
    yield e
    e.close()


def test_check_env_passes(env):
    check_env(env.unwrapped, skip_render_check=True)


def test_episode_through_gym_make_returns_token_ids(env, tokenizer):
    obs, info = env.reset(seed=3)
    assert obs in env.observation_space and obs["calls"] == () and obs["status"] == ""
    task_id = obs["task_id"]
    obs, reward, terminated, truncated, info = env.step(None)
    assert terminated and not truncated
    assert obs in env.observation_space
    assert obs["task_id"] == task_id and obs["status"] == "ok"
    assert reward == 1.0 and info["status"] == "ok" and info["subscores"]
    assert len(obs["calls"]) == info["episode"]["num_calls"] >= 2
    for call, rec in zip(obs["calls"], info["calls"]):
        assert call["prompt_token_ids"].dtype == np.int64
        assert list(call["output_token_ids"]) == rec["output_token_ids"]
        assert len(call["output_logprobs"]) == len(call["output_token_ids"])
    text = tokenizer.decode(obs["calls"][0]["prompt_token_ids"])
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


def test_reset_by_seed_is_deterministic_and_by_task_id(env, builtin_suite):
    a, _ = env.reset(seed=11)
    b, _ = env.reset(seed=11)
    assert a["task_id"] == b["task_id"]
    target = builtin_suite.tasks[-1]
    c, _ = env.reset(options={"task_id": target.full_id})
    assert c["task_id"] == target.full_id


def test_action_sets_sampling_and_policy_version(env):
    env.reset(seed=0)
    action = {"temperature": np.float32(0.5), "top_p": np.float32(0.9), "max_tokens": 0, "policy_version": 7}
    _, _, _, _, info = env.step(action)
    for call in info["calls"]:
        assert call["policy_version"] == 7
        assert call["sampling"]["temperature"] == pytest.approx(0.5)
        assert call["sampling"]["top_p"] == pytest.approx(0.9)


def test_step_before_reset_and_unknown_harness():
    with pytest.raises(RegistrationError, match="unknown harness"):
        gym.make("ClawGym/Mini-v0", harness="minii")
