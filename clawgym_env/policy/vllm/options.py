"""The keyword options of the vLLM policy and server, as ``TypedDict`` s (typed ``**options``).

:class:`VLLMPolicyOptions` are :class:`~clawgym_env.policy.vllm.backend.VLLMPolicy`'s keywords other
than the server's address, its model name and the server handle; :class:`VLLMServerOptions` are
:class:`~clawgym_env.policy.vllm.server.VLLMServer`'s keywords. Both are total=False: a missing key
takes the constructor's default. This module imports nothing, so a factory can name them cheaply.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from clawgym_env.policy.rope import RopeScaling


class VLLMPolicyOptions(TypedDict, total=False):
    """Keywords of :class:`~clawgym_env.policy.vllm.backend.VLLMPolicy` besides ``base_url``, ``model``,
    ``server``."""

    tokenizer: object
    owns_server: bool
    api_key: str | None
    timeout_s: float
    retries: int
    backoff_s: float
    stop_token_ids: Iterable[int] | None
    vocab_size: int | None
    check_tokenizer: bool
    name: str | None


class VLLMServerOptions(TypedDict, total=False):
    """Keywords of :class:`~clawgym_env.policy.vllm.server.VLLMServer` besides the model folder."""

    port: int | None
    host: str
    venv: str | os.PathLike[str] | None
    served_model_name: str | None
    dtype: str
    max_model_len: int
    kv_cache_gib: int
    enforce_eager: bool
    dev_mode: bool
    extra_args: Iterable[str]
    env: dict[str, str] | None
    log_path: str | os.PathLike[str] | None
    startup_timeout_s: float
    grace_s: float
    worker_extension: bool
    rope_scaling: RopeScaling | None
    lora_rank: int
    sleep_mode: bool
