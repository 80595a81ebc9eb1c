"""The one place where ClawGym's environment ids are registered (lazy ``module:Class`` entry points).

Episodes are not reproducible bit for bit (process timing, ids in harness prompts), so every id is
registered ``nondeterministic=True``; ``reset(seed=...)`` still picks the same task for a seed.
"""

from __future__ import annotations

import difflib

import gymnasium as gym

ENTRY_POINT = "clawgym_env.envs.env:ClawGymEnv"

#: env id → the harness it runs
ENV_IDS: dict[str, str] = {
    "ClawGym/Mini-v0": "mini",
    "ClawGym/OpenClaw-v0": "openclaw",
    "ClawGym/ClaudeCode-v0": "claude-code",
    "ClawGym/Codex-v0": "codex",
    "ClawGym/QwenCode-v0": "qwen-code",
}


def register_all() -> None:
    """Register every id of :data:`ENV_IDS` with Gymnasium (idempotent: ids already registered are kept)."""
    for env_id, harness in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"harness": harness},
                         nondeterministic=True, disable_env_checker=False)


def env_id_for(harness: str) -> str:
    """The env id of a harness name, with a helpful error for unknown names."""
    from clawgym_env.errors import RegistrationError

    for env_id, h in ENV_IDS.items():
        if h == harness:
            return env_id
    close = difflib.get_close_matches(harness, ENV_IDS.values(), n=3)
    raise RegistrationError(f"no environment runs harness {harness!r}" + (f"; did you mean {close}?" if close else ""))
