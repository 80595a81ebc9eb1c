"""Keep-alive streaming: what a streaming client receives while its turn is still running.

The proxy generates a whole turn before it streams it (:mod:`~clawgym_env.proxy.server`). Behind a slow
policy (a big model, queueing behind other episodes) a streaming client would receive nothing for that
long, and harnesses with read or idle timeouts abort. So when a streaming turn is still running after
``keepalive_s`` seconds, the proxy answers ``200`` and sends one keep-alive every ``keepalive_s`` until the
turn ends, then the real events. What a keep-alive is belongs to each dialect (its module's
``keepalive(req, body, model)`` returns a :class:`KeepAliveStream`); the timing is here.

Per dialect (chosen from what the official SDKs' SSE decoders and the harnesses do with it):
  * Anthropic Messages: the API's own ``event: ping`` / ``{"type": "ping"}``; both SDKs skip it.
  * OpenAI Chat Completions: an empty ``chat.completion.chunk`` of the answer (its ``id``, ``created`` and
    ``model``, ``"choices": []``, ``"usage": null``), the shape of OpenAI's own usage chunk. An SSE comment
    would not do: the SDKs' decoders drop comments, so an idle timer kept on parsed chunks (Qwen Code's
    ``QWEN_STREAM_IDLE_TIMEOUT_MS``, OpenClaw's first-event timeout) never sees them. Clients already meet
    empty-choices chunks before the role chunk (Azure OpenAI opens streams with one) and after the finish
    chunk (the usage chunk), and skip them: the official SDKs' accumulators (Python
    ``ChatCompletionStreamState``, Node ``ChatCompletionStream``) loop over ``choices``; Qwen Code, pi and
    OpenClaw (``chunk.choices?.[0]``), the Vercel AI SDK (``choices[0]`` guarded) and LiteLLM
    (``len(choices) > 0``) read ``choices[0]`` only when present. The Python accumulator and the Vercel AI
    SDK take ``id`` / ``created`` / ``model`` from the first chunk, which is why a keep-alive carries the
    answer's own. Code iterating the raw SDK stream sees these chunks and must guard ``choices[0]`` as it
    must for the usage chunk.
  * OpenAI Responses: the API's own ``response.created`` + ``response.in_progress`` when keep-alives start,
    then one more ``response.in_progress`` per keep-alive (same response id, ``sequence_number`` counting
    on into the real events). Codex's idle timer (``stream_idle_timeout_ms``) is reset by *events* only
    (its SSE parser swallows comment lines) and it ignores event types it does not act on; the OpenAI
    SDK's ``responses.stream()`` helper requires ``response.created`` first and accepts repeated lifecycle
    events of the same response, so no invented event type is needed.

Invariants:
  * A streaming turn that ends (or fails) within ``keepalive_s`` is answered exactly as without
    keep-alives: same status line and headers; a failure stays an HTTP error.
  * Once a keep-alive was sent (200 is out), a failure of the turn is sent as the dialect's in-stream error
    (:meth:`KeepAliveStream.error`) and still kept on ``session.failures`` (through ``on_failure``).
  * Keep-alives are never part of the answer: the recorded :class:`~clawgym_env.capture.records.CallRecord`
    is the turn's, whether or not keep-alives were sent.
  * A client that disconnects while waiting cancels only the sending: the turn runs to its end in its
    worker thread and is recorded; its failure, if any, is still noted.
  * ``keepalive_s <= 0`` turns keep-alives off.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from clawgym_env.proxy.sessions import TurnResult

#: The sent form of a failure: (status, message, field, code), as the dialect error bodies take it.
Failure = tuple[int, str, "str | None", "str | None"]


class KeepAliveStream(Protocol):
    """One streaming answer whose keep-alives have started (a dialect's ``keepalive(...)`` result)."""

    def tick(self) -> str:
        """The next keep-alive (SSE text; the first call may open the stream, as Responses does)."""
        ...

    def answer(self, res: TurnResult) -> Iterator[str]:
        """The real events for the finished turn, consistent with the keep-alives already sent."""
        ...

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """The dialect's in-stream error event(s) for a failed turn (the stream ends after it)."""
        ...


async def first_wait(fut: asyncio.Future[TurnResult], keepalive_s: float) -> bool:
    """Wait for the turn up to ``keepalive_s`` (forever when off); True when it is done."""
    if keepalive_s <= 0:
        await asyncio.wait({fut})
        return True
    done, _ = await asyncio.wait({fut}, timeout=keepalive_s)
    return bool(done)


async def keepalive_body(fut: asyncio.Future[TurnResult], keepalive_s: float, stream: KeepAliveStream,
                         classify: Callable[[BaseException], Failure],
                         on_failure: Callable[[Failure], None]) -> AsyncIterator[str]:
    """The body of a streaming answer whose turn outlived ``keepalive_s``: keep-alives, then the answer
    (or the in-stream error). See the module invariants."""
    sent_all = False
    try:
        yield stream.tick()
        while True:
            done, _ = await asyncio.wait({fut}, timeout=keepalive_s)
            if done:
                break
            yield stream.tick()
        sent_all = True
        try:
            chunks = list(stream.answer(fut.result()))  # rendered whole first: a failure is still sendable
        except Exception as exc:  # noqa: BLE001 - the turn's failure (or a rendering bug) becomes an error event
            failure = classify(exc)
            on_failure(failure)
            yield stream.error(*failure)
            return
        for chunk in chunks:
            yield chunk
    finally:
        if not sent_all:  # the client went away first: still note the turn's failure once it ends
            def settle(done: asyncio.Future[TurnResult]) -> None:
                if not done.cancelled() and done.exception() is not None:
                    on_failure(classify(done.exception()))  # type: ignore[arg-type]
            if fut.done():
                settle(fut)
            else:
                fut.add_done_callback(settle)
