"""Reference trainers over call trees (GRPO, PPO with a critic)."""
