"""GRPO over call trees: ``train.py`` (the loop, readable top to bottom) and ``update.py`` (loss and step)."""
