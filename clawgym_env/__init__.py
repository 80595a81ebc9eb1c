"""ClawGym: black-box RL of LLM agents through real agent harnesses.

``import clawgym_env`` registers the Gymnasium environment ids (see :mod:`clawgym_env.registration`)::

    import gymnasium as gym, clawgym_env
    env = gym.make("ClawGym/Mini-v0", policy="scripted:expert")
"""

from clawgym_env.registration import register_all as _register_all

__version__ = "0.1.0"

_register_all()
