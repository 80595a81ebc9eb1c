"""Gemini CLI (npm ``@google/gemini-cli``): its wire dialect, the Gemini API, lives in :mod:`.dialect` (registered
by the entry point ``clawgym.dialects: gemini``)."""
