"""A call whose client gave up is still recorded when it ends before ``close_episode`` has drained it.

A slow model may finish a call after the harness's client timed out (and retried, and even ended its
episode): the proxy records that abandoned answer, so the episode's calls show the dead attempt
(:func:`~clawgym_env.capture.call_kinds.find_discarded`). ``close_episode`` waits up to ``drain_s`` for the
calls in flight; with ``drain_s=0`` it does not wait and the late answer is not recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx2
import openai
import pytest

from clawgym_env.policy.base import GenerationContext, SamplingParams
from clawgym_env.proxy.server import ProxyServer
from clawgym_env.testing import EchoScriptPolicy

SLOW_S = 1.2
GIVE_UP = httpx2.Timeout(connect=5, read=0.3, write=5, pool=5)


class _StreamingEcho(EchoScriptPolicy):
    """The echo policy as a text-streaming backend: the proxy serves its streaming calls live (a pump task)."""

    streams_text = True

    async def generate_stream(self, prompt_ids: list[int], params: SamplingParams,
                              ctx: GenerationContext) -> AsyncIterator[object]:
        yield await asyncio.to_thread(self.generate, prompt_ids, params, ctx)  # off the loop: it sleeps


def _give_up(base_url: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=GIVE_UP)
    with pytest.raises(openai.APITimeoutError):
        out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                             stream=stream)
        if stream:
            list(out)


@pytest.mark.parametrize("live", [False, True], ids=["whole-turn", "live-stream"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_abandoned_call_is_recorded_once_it_ends(tokenizer, live, stream):
    policy = (_StreamingEcho if live else EchoScriptPolicy)(tokenizer, delay_s=SLOW_S)
    with ProxyServer(policy, keepalive_s=0, drain_s=10) as server:
        session = server.open_episode(harness="pytest")
        _give_up(session.base_url(server.url), stream)
        assert session.in_flight == 1  # the client is gone, the policy is still answering
        calls = server.close_episode(session.token)
    assert len(calls) == 1 and session.in_flight == 0
    assert calls[0].stream is stream and calls[0].output_token_ids
    assert tokenizer.decode(calls[0].output_token_ids).startswith("Echo: hi")


def test_without_draining_the_late_answer_is_not_recorded(tokenizer):
    policy = EchoScriptPolicy(tokenizer, delay_s=SLOW_S)
    with ProxyServer(policy, keepalive_s=0, drain_s=0) as server:
        session = server.open_episode(harness="pytest")
        _give_up(session.base_url(server.url), False)
        assert server.close_episode(session.token) == []
        assert session.wait_idle(5 * SLOW_S) == 0  # it ended after the close, and was refused


def test_drain_s_must_not_be_negative(tokenizer):
    with pytest.raises(ValueError, match="drain_s"):
        ProxyServer(EchoScriptPolicy(tokenizer), drain_s=-1)
