"""The results file of an evaluation run: append-only JSONL of :class:`~leaderboards.schema.ResultRow`.

Invariants (see :mod:`leaderboards.run`): exclusively ``flock``-ed while open (a second runner on the
same file fails at once); a torn last line is cut on open (a complete row whose newline was lost is
kept); each row is one redacted ``write`` under a lock, fsync'd before it counts; a failed write cuts the
file back to its last complete line and raises :class:`ResultsWriteError` naming the fix; the file is 0600.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import Any

from clawgym_env.capture.records import dump_record
from clawgym_env.errors import TaskError
from leaderboards.schema import ResultRow, parse_lines


class ResultsWriteError(TaskError):
    """A results row could not be written (disk full, I/O error); the file was cut back to its last
    complete line. The message names the file, the cause and the fix."""


class ResultsFile:
    """Append-only JSONL of :class:`ResultRow`, exclusively locked while open (a context manager)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.rows: list[ResultRow] = []
        self.bad_lines = 0
        self.repaired_tail = False

    def __enter__(self) -> ResultsFile:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TaskError(f"{self.path} is being written by another evaluation run; wait for it, or "
                            "write to another --out file") from None
        self._fd = fd
        os.fchmod(fd, 0o600)  # run outputs are private to the user
        self._load_and_repair(fd)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the file, releasing its lock; idempotent."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)  # also releases the flock
                self._fd = None

    def _load_and_repair(self, fd: int) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            tail = data[cut:].decode("utf-8", errors="replace")
            if parse_lines([tail]).rows:  # complete row whose newline was lost: keep it
                os.write(fd, b"\n")
                data += b"\n"
            else:  # torn write: drop it, the episode runs again
                os.ftruncate(fd, cut)
                data = data[:cut]
            os.fsync(fd)
            self.repaired_tail = True
        parsed = parse_lines(data.decode("utf-8", errors="replace").splitlines())
        self.rows, self.bad_lines = parsed.rows, parsed.bad_lines

    def append(self, row: ResultRow) -> None:
        """Append one row (redacted), durably; on any write failure cut the file back to where it
        was and raise :class:`ResultsWriteError`."""
        line = (dump_record(row) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise TaskError(f"{self.path} is closed")
            end = os.fstat(self._fd).st_size
            try:
                n = os.write(self._fd, line)  # O_APPEND: one write, at the end
                if n != len(line):
                    raise OSError(28, f"short write ({n} of {len(line)} bytes)")
                os.fsync(self._fd)
            except OSError as exc:
                try:
                    os.ftruncate(self._fd, end)
                    os.fsync(self._fd)
                except OSError:
                    pass
                raise ResultsWriteError(
                    f"could not write a row to {self.path}: {exc.strerror or exc}; the file is intact up to its "
                    "last complete row. Free space on that disk (or pass another --out), then run the same "
                    "command again: finished episodes are skipped") from exc
            self.rows.append(row)
