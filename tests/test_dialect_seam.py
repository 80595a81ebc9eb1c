"""The dialect seam: a dialect registered at runtime declares its own routes, the proxy mounts them when it starts,
its calls are recorded under its name, and a module that breaks the contract is refused with the fix named."""

from __future__ import annotations

import types
from typing import Any

import httpx
import pytest

from clawgym_env.capture.records import CallRecord
from clawgym_env.errors import RegistrationError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.plugins import dialects
from clawgym_env.proxy.dialects.contract import DialectSpec, Route
from clawgym_env.proxy.dialects.openai_chat import dialect as openai_chat
from clawgym_env.proxy.dialects.registry import registered, spec
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.proxy.sessions import TurnRequest, TurnResult
from clawgym_env.testing import EchoScriptPolicy


def toy_module(name: str = "toy_dialect", routes: tuple[Route, ...] | None = None) -> types.ModuleType:
    """A toy dialect: ``{"say": text}`` in, ``{"said": text}`` out, errors as ``{"oops": message}``; its
    turn route carries the model in the path and a side route counts characters."""
    module = types.ModuleType(name)

    def parse_request(body: Any) -> TurnRequest:
        if not isinstance(body, dict) or not isinstance(body.get("say"), str):
            from clawgym_env.errors import ProxyError
            raise ProxyError("'say' must be a string", field="say")
        return TurnRequest(messages=[{"role": "user", "content": body["say"]}], tools=[], max_tokens=32)

    def render_response(res: TurnResult, model: str) -> JSONObject:
        return {"said": res.message.get("content"), "model": model, "tokens": res.completion_tokens}

    def error_body(status: int, message: str, field: str | None = None, code: str | None = None) -> JSONObject:
        return {"oops": message, "status": status}

    def count_chars(body: Any, tokenizer: Any) -> JSONObject:
        return {"chars": len(str(body.get("say", "")))}

    module.DIALECT = DialectSpec(  # type: ignore[attr-defined]
        routes=routes or (Route("/toy/{model}:say"), Route("/toy/{model}:count", side="count_chars")),
        history_key="say")
    module.parse_request = parse_request  # type: ignore[attr-defined]
    module.render_response = render_response  # type: ignore[attr-defined]
    module.stream_response = openai_chat.stream_response  # type: ignore[attr-defined]
    module.keepalive = openai_chat.keepalive  # type: ignore[attr-defined]
    module.error_body = error_body  # type: ignore[attr-defined]
    module.count_chars = count_chars  # type: ignore[attr-defined]
    return module


@pytest.fixture(scope="module")
def policy(tokenizer):
    return EchoScriptPolicy(tokenizer)


def test_a_runtime_dialect_is_served_on_its_own_routes_and_recorded_under_its_name(policy):
    with dialects.registered("toy", toy_module()), ProxyServer(policy) as server:
        s = server.open_episode()
        root = s.base_url(server.url).removesuffix("/v1")
        answer = httpx.post(f"{root}/toy/any-model:say", json={"say": "hello there"}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["said"] == "Echo: hello there"
        side = httpx.post(f"{root}/toy/any-model:count", json={"say": "four"}, timeout=60)
        assert side.json() == {"chars": 4}
        bad = httpx.post(f"{root}/toy/any-model:say", json={"say": 3}, timeout=60)
        assert bad.status_code == 400 and "'say' must be a string" in bad.json()["oops"]  # its own envelope
        lost = httpx.post(f"{root}/toy/any-model:sing", json={"say": "x"}, timeout=60)
        assert lost.status_code == 404 and lost.json()["status"] == 404  # under its prefix: its envelope too
        assert lost.json()["oops"] == "no route for POST /ep/<redacted>/toy/any-model:sing"  # the token redacted
        chat = httpx.post(f"{s.base_url(server.url)}/chat/completions", timeout=60,
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200  # the built-ins are still served beside it
        calls = server.close_episode(s.token)
    toy = [c for c in calls if c.path.endswith(":say")]
    assert [c.dialect for c in toy] == ["toy"]  # the failed call is not recorded; the side call never is
    assert toy[0].request == {"say": "hello there"}
    assert policy.tokenizer.decode(toy[0].output_token_ids).startswith("Echo: hello there")
    assert {c.dialect for c in calls} == {"toy", "openai_chat"}


def test_without_the_registration_its_routes_are_gone_and_its_records_are_refused(policy):
    with ProxyServer(policy) as server:
        s = server.open_episode()
        root = s.base_url(server.url).removesuffix("/v1")
        assert httpx.post(f"{root}/toy/m:say", json={"say": "x"}, timeout=60).status_code == 404
        server.close_episode(s.token)
    fields = dict(episode_id="e", call_index=0, path="/toy/m:say", stream=False, request={}, prompt_token_ids=[1],
                  output_token_ids=[2], output_logprobs=[0.0], finish_reason="stop")
    with pytest.raises(ValueError, match=r"unknown dialect 'toy'.*available: anthropic-messages.*clawgym\.dialects"):
        CallRecord(dialect="toy", **fields)
    with dialects.registered("toy", toy_module()):
        assert CallRecord(dialect="toy", **fields).dialect == "toy"


def test_two_dialects_on_one_route_are_refused_naming_both():
    clash = toy_module(routes=(Route("/v1/chat/completions"),))
    with dialects.registered("toy", clash), pytest.raises(RegistrationError, match="'openai_chat' and 'toy' both"):
        registered()


def test_a_module_that_breaks_the_contract_is_refused_with_the_fix():
    bare = types.ModuleType("bare_dialect")
    with dialects.registered("bare", bare), pytest.raises(RegistrationError, match="declares no DIALECT"):
        spec("bare")
    missing = toy_module(routes=(Route("/toy/x", parse="parse_toy"),))
    with dialects.registered("toy", missing), pytest.raises(RegistrationError, match="lacks the function.*parse_toy"):
        spec("toy")
    with pytest.raises(ValueError, match="starts with '/'"):
        Route("v1/x")
    with pytest.raises(ValueError, match="at least one turn route"):
        DialectSpec(routes=(Route("/x", side="f"),), history_key="messages")
