"""Supervised fine-tuning on captured expert episodes (the warm start before RL)."""
