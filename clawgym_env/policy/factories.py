"""The built-in policy factories, registered by spec scheme in :data:`clawgym_env.plugins.policies`.

A factory takes the spec's rest after ``SCHEME:`` (``""`` when there is none) and the caller's keyword
arguments, and returns a :class:`~clawgym_env.policy.base.PolicyBackend`. Backends are imported
lazily, so importing this module needs neither torch nor a model.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from clawgym_env.errors import PolicyError
from clawgym_env.policy.base import PolicyBackend

UPSTREAM_BASE_URL_ENV = "CLAWGYM_UPSTREAM_BASE_URL"
UPSTREAM_API_KEY_ENV = "CLAWGYM_UPSTREAM_API_KEY"


def scripted(rest: str, **kwargs: Any) -> PolicyBackend:
    """``scripted[:expert|wrong|noop|file:PATH]``: the scripted expert through the real tokenizer."""
    from clawgym_env.policy.scripted import ScriptedPolicy

    return ScriptedPolicy(rest or "expert", **kwargs)


def tiny(rest: str, **kwargs: Any) -> PolicyBackend:
    """``tiny``: a tiny random-init Qwen3 built in-process (``tokenizer``, ``device`` and
    :func:`~clawgym_env.policy.tiny.build_tiny_qwen3`'s arguments)."""
    from clawgym_env.policy.tiny import build_tiny_qwen3
    from clawgym_env.policy.tokenizer import load_tokenizer
    from clawgym_env.policy.transformers_backend import TransformersPolicy

    if rest:
        raise PolicyError(f"policy 'tiny' takes no argument after 'tiny:' (got {rest!r})")
    tokenizer = kwargs.pop("tokenizer", None) or load_tokenizer()
    device = kwargs.pop("device", None)
    build_args = set(inspect.signature(build_tiny_qwen3).parameters)
    unknown = sorted(set(kwargs) - build_args)
    if unknown:
        raise PolicyError(f"policy 'tiny' does not take {unknown}; it takes tokenizer, device, "
                          f"{', '.join(sorted(build_args - {'tokenizer'}))}")
    model = build_tiny_qwen3(tokenizer=tokenizer, **kwargs)
    return TransformersPolicy(model, tokenizer, device=device, name="tiny")


def transformers(rest: str, **kwargs: Any) -> PolicyBackend:
    """``transformers:MODEL_DIR``: a local Hugging Face causal LM (``device``, ``dtype``, ``tokenizer``)."""
    from clawgym_env.policy.transformers_backend import TransformersPolicy

    if not rest:
        raise PolicyError("policy 'transformers' needs a model folder: transformers:MODEL_DIR")
    return TransformersPolicy.from_pretrained(Path(rest).expanduser(), **kwargs)


def passthrough(rest: str, **kwargs: Any) -> PolicyBackend:
    """``passthrough:PROVIDER:MODEL``. Base URL and key: ``base_url``/``api_key`` kwargs, else
    ``CLAWGYM_UPSTREAM_BASE_URL``/``CLAWGYM_UPSTREAM_API_KEY``, else the SDK's own variables
    (``OPENAI_BASE_URL``/``OPENAI_API_KEY`` or ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``)."""
    from clawgym_env.policy.passthrough.policy import PROVIDERS, PassthroughPolicy

    spec = f"passthrough:{rest}"
    provider, _, model = rest.partition(":")
    if provider not in PROVIDERS or not model:
        raise PolicyError(f"bad passthrough spec {spec!r}; use passthrough:openai:MODEL or passthrough:anthropic:MODEL")
    kwargs.setdefault("base_url", os.environ.get(UPSTREAM_BASE_URL_ENV) or None)
    kwargs.setdefault("api_key", os.environ.get(UPSTREAM_API_KEY_ENV) or None)
    sdk_key, sdk_url = ("OPENAI_API_KEY", "OPENAI_BASE_URL") if provider == "openai" else \
        ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
    if not kwargs["api_key"] and not os.environ.get(sdk_key):
        if not (kwargs["base_url"] or os.environ.get(sdk_url)):
            raise PolicyError(f"{spec}: no API key; set {UPSTREAM_API_KEY_ENV} or {sdk_key} (and "
                              f"{UPSTREAM_BASE_URL_ENV} or {sdk_url} for a non-default endpoint)")
        kwargs["api_key"] = "unused"  # a custom endpoint without auth (the SDKs insist on some key)
    return PassthroughPolicy(provider, model, **kwargs)


def vllm(rest: str, **kwargs: Any) -> PolicyBackend:
    """``vllm:URL`` / ``http(s)://...`` → a :class:`VLLMPolicy` of that server; ``vllm:MODEL_DIR`` → start a
    :class:`VLLMServer` on the folder (``server_*`` kwargs go to it) and return its policy, which stops
    the server on ``close()``."""
    from clawgym_env.policy.vllm.backend import VLLMPolicy

    spec, target = f"vllm:{rest}", rest
    if target.startswith(("http://", "https://")):
        return VLLMPolicy(target, **kwargs)
    if not target or not Path(target).expanduser().is_dir():
        raise PolicyError(f"bad vLLM spec {spec!r}; use vllm:http://HOST:PORT or vllm:MODEL_DIR")
    from clawgym_env.policy.vllm.server import VLLMServer

    server_kw = {k[len("server_"):]: kwargs.pop(k) for k in list(kwargs) if k.startswith("server_")}
    server = VLLMServer(target, **server_kw).start()
    try:
        return server.policy(owns_server=True, **kwargs)
    except BaseException:
        server.stop()
        raise
