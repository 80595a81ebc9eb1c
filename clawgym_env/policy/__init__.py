"""Policy backends behind the serving proxy (token ids in → token ids + logprobs out).

:func:`make_policy` builds one from a spec string. Backends are imported lazily, so importing this
package needs neither torch nor a model.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from clawgym_env.errors import PolicyError
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams

__all__ = ["Generation", "GenerationContext", "PolicyBackend", "SamplingParams", "make_policy", "POLICY_SPECS"]

POLICY_SPECS = (
    "scripted:expert | scripted:wrong | scripted:noop | scripted:file:PATH  (scripted policies)",
    "transformers:MODEL_DIR, or a bare model directory  (a local Hugging Face causal LM)",
    "tiny  (a tiny random-init Qwen3 built in-process, for demos and tests)",
    "passthrough:openai:MODEL | passthrough:anthropic:MODEL  (forward to an upstream API; text-level capture)",
    "vllm:URL or a bare http(s):// URL  (a running vLLM server); vllm:MODEL_DIR  (launch one from its venv)",
)
UPSTREAM_BASE_URL_ENV = "CLAWGYM_UPSTREAM_BASE_URL"
UPSTREAM_API_KEY_ENV = "CLAWGYM_UPSTREAM_API_KEY"


def _passthrough(spec: str, kwargs: dict[str, Any]) -> PolicyBackend:
    """``passthrough:PROVIDER:MODEL``. Base URL and key: ``base_url``/``api_key`` kwargs, else
    ``CLAWGYM_UPSTREAM_BASE_URL``/``CLAWGYM_UPSTREAM_API_KEY``, else the SDK's own variables
    (``OPENAI_BASE_URL``/``OPENAI_API_KEY`` or ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``)."""
    import os

    from clawgym_env.policy.passthrough import PROVIDERS, PassthroughPolicy

    provider, _, model = spec[len("passthrough:"):].partition(":")
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


def _vllm(spec: str, kwargs: dict[str, Any]) -> PolicyBackend:
    """``vllm:URL`` / ``http(s)://...`` → a :class:`VLLMPolicy` of that server; ``vllm:MODEL_DIR`` → start a
    :class:`VLLMServer` on the folder (``server_*`` kwargs go to it) and return its policy, which stops
    the server on ``close()``."""
    from clawgym_env.policy.vllm_backend import VLLMPolicy

    target = spec[len("vllm:"):] if spec.startswith("vllm:") else spec
    if target.startswith(("http://", "https://")):
        return VLLMPolicy(target, **kwargs)
    if not target or not Path(target).expanduser().is_dir():
        raise PolicyError(f"bad vLLM spec {spec!r}; use vllm:http://HOST:PORT or vllm:MODEL_DIR")
    from clawgym_env.policy.vllm_server import VLLMServer

    server_kw = {k[len("server_"):]: kwargs.pop(k) for k in list(kwargs) if k.startswith("server_")}
    server = VLLMServer(target, **server_kw).start()
    try:
        return server.policy(owns_server=True, **kwargs)
    except BaseException:
        server.stop()
        raise


def make_policy(spec: str, **kwargs: Any) -> PolicyBackend:
    """Build a policy from ``spec`` (see :data:`POLICY_SPECS`); ``kwargs`` go to the backend.

    ``scripted:*`` takes ``tokenizer``, ``think``; ``transformers:DIR`` takes ``device``, ``dtype``,
    ``tokenizer``; ``tiny`` takes ``tokenizer``, ``device`` and :func:`build_tiny_qwen3`'s arguments;
    ``passthrough:PROVIDER:MODEL`` takes ``base_url``, ``api_key``, ``tokenizer``, ``timeout``
    (see :func:`_passthrough`); ``vllm:*``/``http(s)://`` take :class:`VLLMPolicy`'s arguments (see :func:`_vllm`).
    Raises :class:`PolicyError` for an unknown or not-yet-supported spec.
    """
    spec = (spec or "").strip()
    if spec.startswith("passthrough:"):
        return _passthrough(spec, dict(kwargs))
    if spec == "scripted" or spec.startswith("scripted:"):
        from clawgym_env.policy.scripted import ScriptedPolicy

        mode = spec.partition(":")[2] or "expert"
        return ScriptedPolicy(mode, **kwargs)
    if spec.startswith(("http://", "https://", "vllm:")):
        return _vllm(spec, dict(kwargs))
    if spec == "tiny":
        from clawgym_env.policy.tiny import build_tiny_qwen3
        from clawgym_env.policy.tokenizer import load_tokenizer
        from clawgym_env.policy.transformers_backend import TransformersPolicy

        tokenizer = kwargs.pop("tokenizer", None) or load_tokenizer()
        device = kwargs.pop("device", None)
        build_args = set(inspect.signature(build_tiny_qwen3).parameters)
        unknown = sorted(set(kwargs) - build_args)
        if unknown:
            raise PolicyError(f"policy 'tiny' does not take {unknown}; it takes tokenizer, device, "
                              f"{', '.join(sorted(build_args - {'tokenizer'}))}")
        model = build_tiny_qwen3(tokenizer=tokenizer, **kwargs)
        return TransformersPolicy(model, tokenizer, device=device, name="tiny")
    model_dir = spec[len("transformers:"):] if spec.startswith("transformers:") else None
    if model_dir is None and spec and Path(spec).expanduser().is_dir():
        model_dir = spec
    if model_dir:
        from clawgym_env.policy.transformers_backend import TransformersPolicy

        return TransformersPolicy.from_pretrained(Path(model_dir).expanduser(), **kwargs)
    raise PolicyError(f"unknown policy {spec!r}; accepted forms: " + "; ".join(POLICY_SPECS))
