"""The ``TypedDict`` s that type ``**options`` name exactly the keywords of the callable they feed."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from clawgym_env.policy.factories import TinyModelOptions, VLLMSpecOptions
from clawgym_env.policy.tiny import build_tiny_qwen3
from clawgym_env.policy.vllm.backend import VLLMPolicy
from clawgym_env.policy.vllm.options import VLLMPolicyOptions, VLLMServerOptions
from clawgym_env.policy.vllm.server import VLLMServer
from clawgym_env.proxy.server import ProxyServer, ProxyServerOptions


def _keywords(fn: Callable[..., object], *, skip: frozenset[str] = frozenset(), keyword_only: bool = False) -> set[str]:
    params = inspect.signature(fn).parameters.values()
    return {p.name for p in params if p.name not in {"self", *skip}
            and (p.kind is p.KEYWORD_ONLY or not keyword_only)}


def test_proxy_server_options_are_its_keyword_only_parameters() -> None:
    assert set(ProxyServerOptions.__annotations__) == _keywords(ProxyServer.__init__, keyword_only=True)


def test_vllm_options_are_the_constructors_keywords() -> None:
    policy, server = set(VLLMPolicyOptions.__annotations__), set(VLLMServerOptions.__annotations__)
    assert policy == _keywords(VLLMPolicy.__init__, skip=frozenset({"base_url", "model", "server"}))
    assert server == _keywords(VLLMServer.__init__, skip=frozenset({"model_dir"}))
    assert set(VLLMSpecOptions.__annotations__) | policy == {*policy, "model", *(f"server_{k}" for k in server)}


def test_tiny_options_are_the_builders_keywords() -> None:
    assert set(TinyModelOptions.__annotations__) == _keywords(build_tiny_qwen3, skip=frozenset({"tokenizer"}))
