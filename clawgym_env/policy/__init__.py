"""Policy backends behind the serving proxy (token ids in → token ids + logprobs out).

:func:`make_policy` builds one from a spec string through the policy registry
(:data:`clawgym_env.plugins.policies`). Backends are imported lazily, so importing this package needs
neither torch nor a model.
"""

from __future__ import annotations

from pathlib import Path

from clawgym_env.errors import PolicyError
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams
from clawgym_env.policy.factories import UPSTREAM_API_KEY_ENV, UPSTREAM_BASE_URL_ENV
from clawgym_env.registry import Registry

__all__ = ["Generation", "GenerationContext", "PolicyBackend", "SamplingParams", "make_policy", "POLICY_SPECS",
           "UPSTREAM_API_KEY_ENV", "UPSTREAM_BASE_URL_ENV", "policies"]

policies: Registry[PolicyBackend] = Registry("policy", "clawgym.policies", builtins={
    "scripted": "clawgym_env.policy.factories:scripted",
    "transformers": "clawgym_env.policy.factories:transformers",
    "tiny": "clawgym_env.policy.factories:tiny",
    "passthrough": "clawgym_env.policy.factories:passthrough",
    "vllm": "clawgym_env.policy.factories:vllm",
    "remote": "clawgym_env.policy.remote:from_spec"})
"""Policy factories by spec scheme, also :data:`clawgym_env.plugins.policies`: ``SCHEME[:REST]`` calls factory
``(REST, **options) -> PolicyBackend`` (its own keywords)."""

POLICY_SPECS = (
    "scripted:expert | scripted:wrong | scripted:noop | scripted:file:PATH  (scripted policies)",
    "transformers:MODEL_DIR, or a bare model directory  (a local Hugging Face causal LM)",
    "tiny  (a tiny random-init Qwen3 built in-process, for demos and tests)",
    "passthrough:openai:MODEL | passthrough:anthropic:MODEL  (forward to an upstream API; text-level capture)",
    "vllm:URL or a bare http(s):// URL  (a running vLLM server); vllm:MODEL_DIR  (launch one from its venv)",
    "remote:http://HOST:PORT  (a policy served by clawgym_env.policy.remote.serve_policy, e.g. a trainer's; "
    "token in CLAWGYM_REMOTE_POLICY_TOKEN)",
)


def make_policy(spec: str, **options: object) -> PolicyBackend:
    """Build a policy from ``spec`` (see :data:`POLICY_SPECS`); ``options`` are that backend's own keywords
    (each factory names its own, e.g. :func:`clawgym_env.policy.factories.tiny`), passed through unchanged.

    The spec's scheme (``SCHEME:REST``) names a factory in :data:`clawgym_env.plugins.policies`
    (built-ins: :mod:`clawgym_env.policy.factories`; plugins add theirs as entry points of group
    ``clawgym.policies``). A bare ``http(s)://`` URL means ``vllm:URL``; a bare model folder means
    ``transformers:DIR``. Raises :class:`PolicyError` for an unknown spec, naming the accepted forms.
    """
    spec = (spec or "").strip()
    if spec.startswith(("http://", "https://")):
        scheme, rest = "vllm", spec
    elif ":" not in spec and spec not in policies and spec and Path(spec).expanduser().is_dir():
        scheme, rest = "transformers", spec
    else:
        scheme, _, rest = spec.partition(":")
    if not scheme or scheme not in policies:
        hint = str(policies.unknown(scheme or spec, "policy"))
        raise PolicyError(f"{hint}; accepted forms: " + "; ".join(POLICY_SPECS))
    return policies.load(scheme)(rest, **options)
