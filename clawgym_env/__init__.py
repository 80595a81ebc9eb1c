"""ClawGym: black-box RL of LLM agents through real agent harnesses.

``import clawgym_env`` registers the Gymnasium environment ids (see :mod:`clawgym_env.registration`).
"""

__version__ = "0.1.0"
