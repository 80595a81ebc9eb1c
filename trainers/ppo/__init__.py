"""PPO with a critic over call trees: the loop, the update, value targets and the value model."""
