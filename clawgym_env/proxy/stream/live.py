"""Live streaming: a streaming request served while the policy's answer is still arriving.

A learned policy generates a whole turn before the proxy streams it (:mod:`~clawgym_env.proxy.server`).
A text-level backend that streams (``policy.streams_text``, e.g. a passthrough to an upstream API, see
:meth:`~clawgym_env.policy.base.PolicyBackend.generate_stream`) is served live instead, for dialects
whose module has a ``live(req, body, model, start)`` writer (:class:`LiveStream`): the prompt is prepared as
for any call (:func:`~clawgym_env.proxy.turn.prepare_turn`), the policy's stream is pumped by a task of
its own, its text deltas go to the client as they arrive, and when the stream ends the call is
recorded (:func:`~clawgym_env.proxy.turn.finish_turn`) and the rest of the answer (tool calls, finish
reason, usage) is sent, consistent with what was already sent.

Invariants:
  * The record is the one :func:`~clawgym_env.proxy.turn.run_turn` makes for the same final generation:
    streaming changes when bytes leave, never what is captured.
  * What the client is sent is a prefix of what the record says, then the rest of it: text is held back
    while it may still be cut or trimmed (:class:`LiveText`: a possible stop string at the end, trailing
    whitespace the parser strips, anything from a stop string or ``<tool_call>`` on). Two cases escape,
    and are logged: the proxy cuts the re-encoded output at ``max_tokens`` (counted in the policy's tokens,
    not the upstream's), or a stop string cuts inside the reasoning; the client has then seen more than
    the record keeps.
  * Failures before anything is sent are HTTP errors as for any call; after that (a keep-alive or a delta
    went out) a failure is the dialect's in-stream error event, and it is kept on ``session.failures``.
  * Keep-alives (the dialect's ``tick``) go out whenever nothing arrived for ``keepalive_s`` (0: never).
  * A client that goes away cancels only the sending: the policy's stream runs on, the call is recorded,
    and a failure is still noted.
  * A small call makes no thread hop: the app prepares it on the loop and the pump records a short answer
    there too (``inline``; bounds in :mod:`~clawgym_env.proxy.turn`); a large one runs both in workers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Executor
from typing import Literal, Protocol

from clawgym_env.errors import PolicyError, ProxyError
from clawgym_env.policy.base import Generation, PolicyBackend, TextDelta
from clawgym_env.proxy.sessions import EpisodeSession, TurnMeta, TurnRequest, TurnResult
from clawgym_env.proxy.stream.keepalive import Failure
from clawgym_env.proxy.turn import INLINE_OUTPUT_TOKENS, PreparedTurn, finish_turn

log = logging.getLogger("clawgym.proxy")

Kind = Literal["content", "reasoning"]
_TIMEOUT = object()
_PUMPS: set[asyncio.Task] = set()  # running pumps, kept referenced until they end


@dataclasses.dataclass(frozen=True)
class LiveStart:
    """What a live writer knows before any text: the prompt's length and the policy that answers."""

    prompt_tokens: int
    policy_name: str
    policy_version: int


class LiveStream(Protocol):
    """A dialect's writer for one live streaming answer (its module's ``live(req, body, model, start)``)."""

    def tick(self) -> str:
        """A keep-alive (as :class:`~clawgym_env.proxy.stream.keepalive.KeepAliveStream` sends it)."""
        ...

    def head(self) -> str:
        """The events that open the answer, sent once before the first text."""
        ...

    def delta(self, kind: Kind, text: str) -> str:
        """The event(s) carrying ``text`` of ``kind`` (reasoning never follows content)."""
        ...

    def finish(self, res: TurnResult, sent: dict[Kind, str]) -> Iterator[str]:
        """The rest of the answer for the recorded turn, after ``sent`` text of each kind (use :func:`rest`)."""
        ...

    def error(self, status: int, message: str, field: str | None, code: str | None) -> str:
        """The dialect's in-stream error event(s) (the stream ends after it)."""
        ...


def rest(sent: str, final: str, kind: str) -> str:
    """What of the recorded ``final`` text is still to send after ``sent`` (see the module invariants)."""
    if final.startswith(sent):
        return final[len(sent):]
    log.warning("the streamed %s is not a prefix of the recorded one (the output was cut at max_tokens in the "
                "policy's tokens); the record keeps its own", kind)
    return ""


class LiveText:
    """The text of a live answer that is safe to send: always a prefix of what the record will hold."""

    def __init__(self, stops: Sequence[str]) -> None:
        stops = [s for s in stops if s]
        self.marks: dict[Kind, list[str]] = {"content": [*stops, "<tool_call>"], "reasoning": [*stops, "</think>"]}
        self.raw: dict[Kind, str] = {"reasoning": "", "content": ""}
        self.sent: dict[Kind, str] = {"reasoning": "", "content": ""}

    def push(self, kind: Kind, text: str) -> str:
        """Add ``text`` of ``kind``; the part of it that may be sent now ("" while held back)."""
        if kind == "reasoning" and self.raw["content"]:
            return ""  # reasoning after content: recorded, but a stream cannot go back to it
        self.raw[kind] += text
        raw, marks = self.raw[kind], self.marks[kind]
        hits = [i for i in (raw.find(m) for m in marks) if i >= 0]
        raw = raw[:min(hits)] if hits else raw[:len(raw) - _held(raw, marks)]
        safe = raw.strip("\n") if kind == "reasoning" else raw.strip()  # as the parser trims the record's
        sent = self.sent[kind]
        if len(safe) <= len(sent) or not safe.startswith(sent):
            return ""
        self.sent[kind] = safe
        return safe[len(sent):]


def _held(raw: str, marks: Sequence[str]) -> int:
    """The length of the longest end of ``raw`` that begins one of ``marks`` (it may still become one)."""
    held = 0
    for mark in marks:
        for k in range(min(len(mark) - 1, len(raw)), held, -1):
            if raw.endswith(mark[:k]):
                held = k
                break
    return held


class LiveTurn:
    """One live call: the policy's stream pumped into a queue by its own task (see the module invariants).

    The caller has counted the call in flight (:meth:`EpisodeSession.call_started`); the pump ends it once
    the call is recorded or failed.
    """

    def __init__(self, session: EpisodeSession, policy: PolicyBackend, req: TurnRequest, meta: TurnMeta,
                 prep: PreparedTurn, executor: Executor, on_failure: Callable[[BaseException], None], *,
                 inline: bool = False) -> None:
        self.session, self.policy, self.req, self.meta, self.prep = session, policy, req, meta, prep
        self.executor = executor
        self.inline = inline  # a small request: a short answer is recorded on the loop (turn.py's invariants)
        self.on_failure = on_failure
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self._gone = False  # the client stopped reading: failures are noted by the pump
        task = asyncio.get_running_loop().create_task(self._pump())
        _PUMPS.add(task)
        task.add_done_callback(_PUMPS.discard)

    async def _pump(self) -> None:
        try:
            gen = await self._drain()
            if self.inline and len(gen.token_ids) <= INLINE_OUTPUT_TOKENS:
                self.queue.put_nowait(finish_turn(self.session, self.policy, self.req, self.meta, self.prep, gen))
                return
            loop = asyncio.get_running_loop()
            try:
                fut = loop.run_in_executor(self.executor, finish_turn, self.session, self.policy, self.req,
                                           self.meta, self.prep, gen)
            except RuntimeError as exc:  # the executor shut down under us
                raise ProxyError("the proxy is shutting down", status=503, code="unavailable") from exc
            self.queue.put_nowait(await fut)
        except Exception as exc:  # noqa: BLE001 - every failure reaches the client (or the failure list)
            self.queue.put_nowait(exc)
            if self._gone:
                self.on_failure(exc)
        finally:
            self.session.call_ended()  # begun by the app before prepare_turn

    async def _drain(self) -> Generation:
        """Forward the policy's text deltas to the queue; its final :class:`Generation`."""
        policy, prep = self.policy, self.prep
        gen: Generation | None = None
        stream = policy.generate_stream(list(prep.prompt_ids), prep.params, prep.ctx)
        try:
            async for item in stream:
                if isinstance(item, Generation):
                    gen = item
                elif gen is None and isinstance(item, TextDelta):
                    self.queue.put_nowait(item)
        except (PolicyError, ProxyError):
            raise
        except Exception as exc:  # noqa: BLE001 - any policy crash is a policy failure (502), not ours
            raise PolicyError(f"policy {policy.name!r} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        if gen is None:
            raise PolicyError(f"policy {policy.name!r} ended its stream without a final Generation")
        return gen

    async def next_item(self, timeout: float) -> object:
        """The next item (a :class:`TextDelta`, the :class:`TurnResult` or the failure), or ``_TIMEOUT``
        after ``timeout`` seconds (``timeout <= 0``: wait as long as it takes)."""
        try:
            return await asyncio.wait_for(self.queue.get(), timeout if timeout > 0 else None)
        except TimeoutError:
            return _TIMEOUT

    async def body(self, first: object, writer: LiveStream, keepalive_s: float,
                   classify: Callable[[BaseException], Failure],
                   note: Callable[[Failure], None]) -> AsyncIterator[str]:
        """The streamed answer, starting from ``first`` (an item of :meth:`next_item`)."""
        texts = LiveText(self.prep.params.stop)
        opened, item, done = False, first, False
        try:
            while True:
                if item is _TIMEOUT:
                    yield writer.tick()
                elif isinstance(item, BaseException):
                    done = True
                    failure = classify(item)
                    note(failure)
                    yield writer.error(*failure)
                    return
                elif isinstance(item, TextDelta):
                    text = texts.push(item.kind, item.text)
                    if not opened:
                        opened = True
                        yield writer.head()
                    if text:
                        yield writer.delta(item.kind, text)
                elif isinstance(item, TurnResult):
                    done = True
                    try:
                        chunks = ([] if opened else [writer.head()]) + list(writer.finish(item, texts.sent))
                    except Exception as exc:  # noqa: BLE001 - a rendering bug becomes an error event
                        failure = classify(exc)
                        note(failure)
                        yield writer.error(*failure)
                        return
                    for chunk in chunks:
                        yield chunk
                    return
                item = await self.next_item(keepalive_s)
        finally:
            if not done:  # the client went away first: a failure still waiting (or still to come) is noted
                self._gone = True
                while not self.queue.empty():
                    left = self.queue.get_nowait()
                    if isinstance(left, BaseException):
                        self.on_failure(left)
