"""The built-in policy factories, registered by spec scheme in :data:`clawgym_env.plugins.policies`.

A factory takes the spec's rest after ``SCHEME:`` (``""`` when there is none) and its backend's own
keywords (named here, or a ``TypedDict`` of them), and returns a
:class:`~clawgym_env.policy.base.PolicyBackend`. Backends are imported lazily, so importing this module
needs neither torch nor a model.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from clawgym_env.errors import PolicyError
from clawgym_env.policy.base import PolicyBackend
from clawgym_env.policy.vllm.options import VLLMPolicyOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from clawgym_env.policy.rope import RopeScaling
    from clawgym_env.policy.vllm.options import VLLMServerOptions

UPSTREAM_BASE_URL_ENV = "CLAWGYM_UPSTREAM_BASE_URL"
UPSTREAM_API_KEY_ENV = "CLAWGYM_UPSTREAM_API_KEY"


class TinyModelOptions(TypedDict, total=False):
    """The keywords of :func:`~clawgym_env.policy.tiny.build_tiny_qwen3` that the ``tiny`` spec takes."""

    hidden_size: int
    num_layers: int
    heads: int
    kv_heads: int
    intermediate: int
    seed: int
    save_dir: str | Path | None


class VLLMSpecOptions(VLLMPolicyOptions, total=False):
    """The ``vllm:`` spec's keywords: :class:`~clawgym_env.policy.vllm.backend.VLLMPolicy`'s (``model`` and
    :class:`~clawgym_env.policy.vllm.backend.VLLMPolicyOptions`) and, for ``vllm:MODEL_DIR``,
    :class:`~clawgym_env.policy.vllm.server.VLLMServer`'s (:class:`~clawgym_env.policy.vllm.server.VLLMServerOptions`)
    with a ``server_`` prefix."""

    model: str | None
    server_port: int | None
    server_host: str
    server_venv: str | os.PathLike[str] | None
    server_served_model_name: str | None
    server_dtype: str
    server_max_model_len: int
    server_kv_cache_gib: int
    server_enforce_eager: bool
    server_dev_mode: bool
    server_extra_args: Iterable[str]
    server_env: dict[str, str] | None
    server_log_path: str | os.PathLike[str] | None
    server_startup_timeout_s: float
    server_grace_s: float
    server_worker_extension: bool
    server_rope_scaling: RopeScaling | None
    server_lora_rank: int
    server_sleep_mode: bool


def scripted(rest: str, *, tokenizer: object = None, think: bool = False) -> PolicyBackend:
    """``scripted[:expert|wrong|noop|file:PATH]``: the scripted expert through the real tokenizer."""
    from clawgym_env.policy.scripted import ScriptedPolicy

    return ScriptedPolicy(rest or "expert", tokenizer, think=think)


def tiny(rest: str, *, tokenizer: object = None, device: str | None = None,
         **model: Unpack[TinyModelOptions]) -> PolicyBackend:
    """``tiny``: a tiny random-init Qwen3 built in-process (``tokenizer``, ``device`` and
    :func:`~clawgym_env.policy.tiny.build_tiny_qwen3`'s arguments, :class:`TinyModelOptions`)."""
    from clawgym_env.policy.tiny import build_tiny_qwen3
    from clawgym_env.policy.tokenizer import load_tokenizer
    from clawgym_env.policy.transformers_backend import TransformersPolicy

    if rest:
        raise PolicyError(f"policy 'tiny' takes no argument after 'tiny:' (got {rest!r})")
    tokenizer = tokenizer or load_tokenizer()
    build_args = set(inspect.signature(build_tiny_qwen3).parameters)
    unknown = sorted(set(model) - build_args)
    if unknown:
        raise PolicyError(f"policy 'tiny' does not take {unknown}; it takes tokenizer, device, "
                          f"{', '.join(sorted(build_args - {'tokenizer'}))}")
    built = build_tiny_qwen3(tokenizer=tokenizer, **model)
    return TransformersPolicy(built, tokenizer, device=device, name="tiny")


def transformers(rest: str, *, device: str | None = None, dtype: object = None, tokenizer: object = None,
                 name: str | None = None, stop_token_ids: list[int] | tuple[int, ...] | None = None
                 ) -> PolicyBackend:
    """``transformers:MODEL_DIR``: a local Hugging Face causal LM (``device``, ``dtype``, ``tokenizer``,
    ``name``, ``stop_token_ids``: see :meth:`TransformersPolicy.from_pretrained`)."""
    from clawgym_env.policy.transformers_backend import TransformersPolicy

    if not rest:
        raise PolicyError("policy 'transformers' needs a model folder: transformers:MODEL_DIR")
    return TransformersPolicy.from_pretrained(Path(rest).expanduser(), device=device, dtype=dtype,
                                              tokenizer=tokenizer, name=name, stop_token_ids=stop_token_ids)


def passthrough(rest: str, *, base_url: str | None = None, api_key: str | None = None, tokenizer: object = None,
                timeout: float = 300.0, max_retries: int = 2, client: object = None, async_client: object = None,
                silence_s: float | None = None, max_stream_bytes: int | None = None) -> PolicyBackend:
    """``passthrough:PROVIDER:MODEL``. Base URL and key: ``base_url``/``api_key`` keywords, else
    ``CLAWGYM_UPSTREAM_BASE_URL``/``CLAWGYM_UPSTREAM_API_KEY``, else the SDK's own variables
    (``OPENAI_BASE_URL``/``OPENAI_API_KEY`` or ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``). The other
    keywords are :class:`~clawgym_env.policy.passthrough.policy.PassthroughPolicy`'s."""
    from clawgym_env.policy.passthrough.policy import PROVIDERS, PassthroughPolicy

    spec = f"passthrough:{rest}"
    provider, _, model = rest.partition(":")
    if provider not in PROVIDERS or not model:
        raise PolicyError(f"bad passthrough spec {spec!r}; use passthrough:openai:MODEL or passthrough:anthropic:MODEL")
    base_url = base_url or os.environ.get(UPSTREAM_BASE_URL_ENV) or None
    api_key = api_key or os.environ.get(UPSTREAM_API_KEY_ENV) or None
    sdk_key, sdk_url = ("OPENAI_API_KEY", "OPENAI_BASE_URL") if provider == "openai" else \
        ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
    if not api_key and not os.environ.get(sdk_key):
        if not (base_url or os.environ.get(sdk_url)):
            raise PolicyError(f"{spec}: no API key; set {UPSTREAM_API_KEY_ENV} or {sdk_key} (and "
                              f"{UPSTREAM_BASE_URL_ENV} or {sdk_url} for a non-default endpoint)")
        api_key = "unused"  # a custom endpoint without auth (the SDKs insist on some key)
    return PassthroughPolicy(provider, model, base_url=base_url, api_key=api_key, tokenizer=tokenizer,
                             timeout=timeout, max_retries=max_retries, client=client, async_client=async_client,
                             silence_s=silence_s, max_stream_bytes=max_stream_bytes)


def vllm(rest: str, **options: Unpack[VLLMSpecOptions]) -> PolicyBackend:
    """``vllm:URL`` / ``http(s)://...`` → a :class:`VLLMPolicy` of that server; ``vllm:MODEL_DIR`` → start a
    :class:`VLLMServer` on the folder (the ``server_*`` keywords go to it, unprefixed) and return its
    policy, which stops the server on ``close()``. The keywords: :class:`VLLMSpecOptions`."""
    from clawgym_env.policy.vllm.backend import VLLMPolicy

    spec, target = f"vllm:{rest}", rest
    rest_kw: dict[str, object] = dict(options)
    if target.startswith(("http://", "https://")):
        model = cast("str | None", rest_kw.pop("model", None))
        return VLLMPolicy(target, model, **cast("VLLMPolicyOptions", rest_kw))
    if not target or not Path(target).expanduser().is_dir():
        raise PolicyError(f"bad vLLM spec {spec!r}; use vllm:http://HOST:PORT or vllm:MODEL_DIR")
    from clawgym_env.policy.vllm.server import VLLMServer

    server_kw = {k[len("server_"):]: rest_kw.pop(k) for k in list(rest_kw) if k.startswith("server_")}
    server = VLLMServer(target, **cast("VLLMServerOptions", server_kw)).start()
    try:
        rest_kw["owns_server"] = True  # the policy stops the server it started
        return server.policy(**cast("VLLMPolicyOptions", rest_kw))
    except BaseException:
        server.stop()
        raise
