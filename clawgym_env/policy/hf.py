"""The Hugging Face objects the policies hold, named by their role.

The third-party classes are untyped (or typed in ways that reject ordinary use, such as ``model.to(device)``),
so these names are aliases of ``Any`` to the type checker: they say what a parameter is, not what it checks.
This module imports nothing, so any module may name them.
"""

from __future__ import annotations

from typing import Any, TypeAlias

Tokenizer: TypeAlias = Any
"""A Hugging Face tokenizer (``transformers.PreTrainedTokenizerBase``: the Qwen3 one unless a model folder brings
its own)."""

CausalLM: TypeAlias = Any
"""A Hugging Face causal language model (``transformers.PreTrainedModel`` with a language-modelling head)."""
