"""Secrets never leave the process in clear: one registry of secret values, one redaction function.

Every place that writes text an agent, a log reader or another user may see (proxy error bodies,
``episode.json``, ``calls.jsonl``, ``results.jsonl``, the eval log) passes it through :func:`redact`.

Invariants:
  * a registered secret (and any value of a well-known credential environment variable, see
    :data:`SECRET_ENV_VARS`) is replaced by ``<redacted>`` wherever it appears as a substring;
  * values shorter than :data:`MIN_SECRET_LEN` are never registered (they would redact ordinary text);
  * :func:`redact` is pure apart from reading the registry and the environment; it is thread safe;
  * :func:`redact_obj` walks dicts/lists/tuples iteratively (no recursion limit) and returns a copy.
"""

from __future__ import annotations

import os
import threading
from typing import Any

REDACTED = "<redacted>"
MIN_SECRET_LEN = 8
SECRET_ENV_VARS = ("CLAWGYM_UPSTREAM_API_KEY", "CLAWGYM_JUDGE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY",
                   "GEMINI_API_KEY", "HF_TOKEN")
"""Environment variables whose values are treated as secrets wherever they appear."""

_lock = threading.Lock()
_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Treat ``value`` as a secret from now on (ignored when empty or shorter than MIN_SECRET_LEN)."""
    if value and len(value) >= MIN_SECRET_LEN:
        with _lock:
            _secrets.add(value)


def forget_secret(value: str | None) -> None:
    """Stop redacting ``value`` (e.g. a closed episode's token); unknown values are ignored."""
    with _lock:
        _secrets.discard(value or "")


def _current() -> list[str]:
    with _lock:
        found = set(_secrets)
    found.update(v for k in SECRET_ENV_VARS if len(v := os.environ.get(k, "")) >= MIN_SECRET_LEN)
    return sorted(found, key=len, reverse=True)  # longest first: a secret containing another is whole


def redact(text: str) -> str:
    """``text`` with every known secret replaced by ``<redacted>``."""
    if not isinstance(text, str) or not text:
        return text
    for secret in _current():
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_obj(obj: Any) -> Any:
    """A copy of a JSON-like value (dict/list/tuple/str/...) with secrets redacted in every string,
    keys included. Walks iteratively, so arbitrarily deep values are fine."""
    secrets = _current()

    def one(s: str) -> str:
        for secret in secrets:
            if secret in s:
                s = s.replace(secret, REDACTED)
        return s

    if isinstance(obj, str):
        return one(obj)
    if not isinstance(obj, (dict, list, tuple)):
        return obj
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(obj, root, 0)]  # (source, parent container, key in parent)
    while stack:
        src, parent, key = stack.pop()
        if isinstance(src, dict):
            dst: Any = {}
            parent[key] = dst
            for k, v in src.items():
                nk = one(k) if isinstance(k, str) else k
                dst[nk] = None
                stack.append((v, dst, nk))
        elif isinstance(src, (list, tuple)):
            lst: list[Any] = [None] * len(src)
            parent[key] = lst
            stack.extend((v, lst, i) for i, v in enumerate(src))
        elif isinstance(src, str):
            parent[key] = one(src)
        else:
            parent[key] = src
    return root[0]
