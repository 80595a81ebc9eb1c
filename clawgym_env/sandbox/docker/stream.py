"""Host side of one ``docker exec`` stream: feed stdin, demultiplex stdout/stderr, honour a deadline.

Docker multiplexes a non-TTY exec's output on one hijacked socket as frames: an 8-byte header
(stream id: 1 stdout, 2 stderr; 3 zero bytes; 4-byte big-endian length) and the payload.

Invariants of :func:`pump`:
  * stdin is written as the process reads it (never a deadlock with a chatty process) and the write
    side is half-closed after the last byte, so the process sees EOF; an exec without stdin gets
    ``/dev/null`` from Docker and nothing is written;
  * a frame split across reads is reassembled; output of other stream ids is ignored;
  * with ``keep`` set, each stream keeps only its last ``keep`` bytes, prefixed by
    ``[... N bytes dropped ...]`` when anything was dropped (the bwrap backend's format);
  * at ``deadline`` (read afresh at every check: an extendable
    :class:`~clawgym_env.sandbox.deadline.Deadline` holds as it is extended) it calls ``on_deadline()`` once
    (which must kill the process tree), then drains for at most ``GRACE_S`` more seconds and returns
    ``timed_out=True``;
  * it uses a selector, not ``select()``, so sockets numbered above 1024 work.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
from collections.abc import Callable

from clawgym_env.sandbox.deadline import Deadline

GRACE_S = 5.0
_HEADER = struct.Struct(">BxxxL")


def pump(raw: socket.socket, stdin: bytes | None, deadline: Deadline | None, keep: int | None,
         on_deadline: Callable[[], None]) -> tuple[bytes, bytes, bool]:
    """Run the exchange on ``raw`` until EOF; returns (stdout, stderr, timed_out)."""
    bufs = {1: bytearray(), 2: bytearray()}
    dropped = {1: 0, 2: 0}
    pending, partial, timed_out = memoryview(stdin or b""), bytearray(), False
    with selectors.DefaultSelector() as sel:
        sel.register(raw, selectors.EVENT_READ | (selectors.EVENT_WRITE if stdin else 0))
        if stdin is not None and not stdin:
            raw.shutdown(socket.SHUT_WR)
        while True:
            wait = None if deadline is None else deadline.poll_s()
            if wait is not None and wait <= 0:
                if timed_out:
                    break  # something kept the stream open past the grace period
                timed_out = True
                on_deadline()
                deadline = Deadline.after(GRACE_S)
                continue
            events = sel.select(wait)
            mask = events[0][1] if events else 0
            if mask & selectors.EVENT_WRITE:
                try:
                    pending = pending[raw.send(pending[:65536]):]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:  # the command closed its stdin early
                    pending = memoryview(b"")
                if not pending:
                    with contextlib.suppress(OSError):
                        raw.shutdown(socket.SHUT_WR)
                    sel.modify(raw, selectors.EVENT_READ)
            if mask & selectors.EVENT_READ:
                try:
                    data = raw.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    break
                partial += data
                while len(partial) >= _HEADER.size:
                    kind, size = _HEADER.unpack_from(partial)
                    if len(partial) < _HEADER.size + size:
                        break
                    if kind in bufs:
                        buf = bufs[kind]
                        buf += partial[_HEADER.size:_HEADER.size + size]
                        if keep is not None and len(buf) > 2 * keep:
                            dropped[kind] += len(buf) - keep
                            del buf[:-keep]
                    del partial[:_HEADER.size + size]
    out = []
    for kind in (1, 2):
        buf = bufs[kind]
        if keep is not None and len(buf) > keep:
            dropped[kind] += len(buf) - keep
            del buf[:-keep]
        out.append(b"[... %d bytes dropped ...]\n" % dropped[kind] + bytes(buf) if dropped[kind] else bytes(buf))
    return out[0], out[1], timed_out
