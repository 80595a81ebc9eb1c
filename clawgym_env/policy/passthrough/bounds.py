"""What one upstream answer streamed to the passthrough policy may cost: text, bytes and silence.

An upstream API is outside our control (a misbehaving or hostile endpoint, a proxy in between): without
bounds, an endless answer fills the proxy's memory, and an upstream that only sends keep-alives holds a
call until the harness gives up. :class:`StreamBounds` states the three bounds of one call; the stream
readers of :mod:`~clawgym_env.policy.passthrough.wire` apply them.

Invariants:
  * **Text.** Once the answer's text (content, reasoning and tool-call arguments, in characters) passes
    ``max_chars`` — :data:`CHARS_PER_TOKEN` per token of the call's ``max_tokens``, more than any answer the
    proxy would keep (it cuts the re-encoded answer at ``max_tokens``) — the reader stops reading, closes
    the upstream's response and ends the answer there with ``finish_reason="length"``.
  * **Bytes.** :func:`bounded_lines` reads at most ``max_bytes`` bytes of the raw stream (every byte: event
    data, comments, unknown fields, one endless line); past it, :class:`~clawgym_env.errors.PolicyError`
    naming the bound. What it holds at a time is one line (at most ``max_bytes``) and one chunk.
  * **Silence.** :class:`SilenceWatch` fails the call with a :class:`PolicyError` when no data event came
    for ``silence_s`` seconds; keep-alives (SSE comments, Anthropic ``ping`` events, OpenAI chunks without
    choices) do not count as data. It cancels the reading task and turns that cancellation into the error.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
from collections.abc import AsyncIterator
from types import TracebackType

from clawgym_env.errors import PolicyError

CHARS_PER_TOKEN = 16
"""Answer characters allowed per token of ``max_tokens`` (the proxy's prompt bound uses the same ratio): an
upstream's tokens are a few characters each, so the text of an answer that fits is never cut."""
BYTES_PER_TOKEN = 1024
"""Raw stream bytes allowed per token of ``max_tokens``: an OpenAI chunk or Anthropic event per token is
150-300 bytes."""
BASE_BYTES = 1 << 20
"""Raw stream bytes allowed on top of :data:`BYTES_PER_TOKEN` (headers of the stream, a final usage event)."""


@dataclasses.dataclass(frozen=True)
class StreamBounds:
    """The bounds of one streamed upstream answer (see the module invariants)."""

    max_chars: int
    """answer text read before the answer is ended as ``length``"""
    max_bytes: int
    """raw bytes of the stream read before the call fails"""
    silence_s: float
    """the longest wait for the next data event, keep-alives aside (<= 0: no bound)"""

    @classmethod
    def for_call(cls, max_tokens: int, silence_s: float, max_bytes: int | None = None) -> StreamBounds:
        """The bounds of a call that may sample ``max_tokens``; ``max_bytes`` None: derived from it."""
        tokens = max(1, int(max_tokens))
        return cls(max_chars=CHARS_PER_TOKEN * tokens,
                   max_bytes=max_bytes if max_bytes is not None else BASE_BYTES + BYTES_PER_TOKEN * tokens,
                   silence_s=float(silence_s))


class TextBudget:
    """Counts an answer's text against ``max_chars``; :attr:`full` once it has passed it."""

    def __init__(self, max_chars: int) -> None:
        self.left = max_chars
        self.full = False

    def take(self, text: str | None) -> bool:
        """Count ``text``; False once the answer is over its bound (the reader then stops)."""
        if text:
            self.left -= len(text)
            if self.left < 0:
                self.full = True
        return not self.full


async def bounded_lines(chunks: AsyncIterator[bytes], max_bytes: int, what: str) -> AsyncIterator[str]:
    """The lines of a UTF-8 byte stream (``\\n``, ``\\r\\n`` or ``\\r`` ended, without their ending), reading at
    most ``max_bytes`` bytes; past that a :class:`PolicyError` naming ``what`` and the bound."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    parts: list[str] = []  # the pieces of the line being read
    seen, cr = 0, False  # cr: a "\\r" ended the last piece
    async for chunk in chunks:
        seen += len(chunk)
        if seen > max_bytes:
            raise PolicyError(f"{what} sent more than {max_bytes} bytes in one streamed answer (the bound derived "
                              "from the call's max_tokens, or the passthrough's max_stream_bytes); the upstream "
                              "is misbehaving")
        text = decoder.decode(chunk)
        if cr and text.startswith("\n"):
            text = text[1:]  # the "\\n" of a "\\r\\n" split across two chunks
        cr = False
        if "\r" in text:
            cr = text.endswith("\r")
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        *done, rest = text.split("\n")
        if done:
            done[0] = "".join(parts) + done[0]
            parts = []
            for line in done:
                yield line
        if rest:
            parts.append(rest)
    tail = "".join(parts) + decoder.decode(b"", final=True)
    if tail:
        yield tail


class SilenceWatch:
    """An async context that fails the current task's work with a :class:`PolicyError` once
    :meth:`progress` has not been called for ``silence_s`` seconds (module invariants; <= 0: never)."""

    def __init__(self, silence_s: float, what: str) -> None:
        self.silence_s, self.what = silence_s, what
        self.fired = False
        self._handle: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> SilenceWatch:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._last = self._loop.time()
        if self.silence_s > 0 and self._task is not None:
            self._handle = self._loop.call_at(self._last + self.silence_s, self._check)
        return self

    def progress(self) -> None:
        """A data event arrived: the silence starts over."""
        self._last = self._loop.time()

    def _check(self) -> None:
        due = self._last + self.silence_s
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self.fired = True
        assert self._task is not None
        self._task.cancel()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        if self._handle is not None:
            self._handle.cancel()
        if not self.fired:
            return False
        uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+: this cancellation is handled here
        if uncancel is not None:
            uncancel()
        raise PolicyError(f"{self.what} sent no data for {self.silence_s:g} s (keep-alives aside): it is stalled; "
                          "the call fails (the passthrough's silence_s)") from None
