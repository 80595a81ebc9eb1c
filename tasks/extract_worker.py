"""The extraction worker: a child interpreter that parses an agent's files under hard limits.

The grading process never parses a structured deliverable itself: :class:`ExtractWorker` starts
a child interpreter (:func:`serve`, with a minimal environment: no secret of the grader) and sends
it one file at a time (a JSON line: path, kind); the child answers one JSON line (the first
``max_chars`` characters of the text, its full length, and the bound or error, if any). The child
lowers its own limits before it reads anything: ``RLIMIT_AS`` = ``memory_mb`` (so a bomb fails
there with MemoryError, never in the grader), no core files, a small ``RLIMIT_FSIZE`` (it writes
no files) and a CPU-time backstop; then it loads the parsers and proves some headroom.

Invariants:
  * each file has a deadline: the child stops itself at ``file_timeout_s`` where the parser lets it
    (keeping the text so far); the parent kills the child ``kill_grace_s`` later where it does not,
    reports the file as bounded by time, and starts a fresh child for the next file;
  * a child that dies, or that reached its memory limit, is replaced for the next file; its file is
    reported with the reason, never raised: what an agent wrote is the agent's outcome;
  * only a child that cannot start at all (before any agent file is read) raises
    :class:`~clawgym_env.errors.TaskError`: that is the host's fault, not the agent's;
  * at most :data:`MAX_CONCURRENT` workers run at once in one process (they are held for a whole
    folder), so concurrent gradings cannot together take more than that many ``memory_mb``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from clawgym_env.errors import TaskError
from tasks.extract_bounds import Bounded, Collector, ExtractLimits

MAX_CONCURRENT = 4
_slots = threading.BoundedSemaphore(MAX_CONCURRENT)
_START_TIMEOUT_S = 120.0
_MAX_ERROR_CHARS = 4000
_ROOT = Path(__file__).resolve().parent.parent
_ENTRY = "from tasks.extract_worker import serve; serve()"
_ENV_KEPT = {"PATH", "LANG", "TMPDIR", "PYTHONHOME", "PYTHONPYCACHEPREFIX", "VIRTUAL_ENV"}


@dataclass(frozen=True)
class WorkerAnswer:
    """One file's extraction: ``head`` is at most ``max_chars`` characters of the text, ``chars``
    the length of the whole text extracted; ``bounded`` (a bound was reached: the reason) and
    ``error`` (the parser rejected the file, or its process died: the reason) are None otherwise;
    ``missing_module`` names a parser package that is not installed."""

    head: str
    chars: int
    bounded: str | None = None
    error: str | None = None
    missing_module: str | None = None


class ExtractWorker:
    """A pool of one child extraction process, restarted as needed (see the module doc). Use as a
    context manager, or call :meth:`close`; holds one of :data:`MAX_CONCURRENT` slots while open."""

    def __init__(self, limits: ExtractLimits | None = None) -> None:
        self.limits = limits or ExtractLimits()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._stderr: IO[bytes] | None = None
        self._slot = False
        self.waited_s = 0.0  # seconds spent waiting for a slot held by other gradings (not this folder's time)

    def __enter__(self) -> ExtractWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen[bytes]:
        if not self._slot:
            t0 = time.monotonic()
            _slots.acquire()
            self._slot = True
            self.waited_s += time.monotonic() - t0
        # the parsers need no secret of the grading process (judge keys, tokens): a minimal environment
        env = {k: v for k, v in os.environ.items() if k in _ENV_KEPT or k.startswith("LC_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self._stderr = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen([sys.executable, "-c", _ENTRY, json.dumps(self.limits.to_json())],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
                                    cwd="/", start_new_session=True)
        except OSError as e:
            raise TaskError(f"cannot start the extraction worker ({sys.executable} -c {_ENTRY!r}): {e}") from e
        self._proc, self._buf = proc, b""
        line = self._read_line(time.monotonic() + _START_TIMEOUT_S)
        if line != b'"ready"':
            said = f"{line.decode('utf-8', 'replace')[:300]}; " if line else ""
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            death = self._death()
            self._stop()
            raise TaskError(f"the extraction worker did not start ({said}{death}); check that "
                            f"`{sys.executable} -c {_ENTRY!r}` runs and that memory_mb="
                            f"{self.limits.memory_mb} leaves room for the parsers")
        return proc

    def _read_line(self, deadline: float) -> bytes | None:
        """One line from the child, or None at EOF or past ``deadline``."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _death(self) -> str:
        """How the child ended, and the last line it wrote to stderr."""
        proc = self._proc
        code = proc.poll() if proc is not None else None
        how = "still running" if code is None else (
            f"killed by signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
            else f"exit status {code}")
        tail = ""
        if self._stderr is not None:
            self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, self._stderr.tell() - 2000))
            lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
            tail = f": {lines[-1][:500]}" if lines else ""
        return how + tail

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def extract(self, path: str | Path, kind: str, *, max_chars: int, sqlite_rows: int) -> WorkerAnswer:
        """Extract one regular file of a structured ``kind`` in the child; never raises for the file."""
        if self._proc is not None and self._proc.poll() is not None:
            self._stop()
        proc = self._proc if self._proc is not None else self._start()
        assert proc.stdin is not None
        req = {"path": os.path.abspath(path), "kind": kind, "max_chars": max_chars, "sqlite_rows": sqlite_rows}
        t0 = time.monotonic()
        try:
            proc.stdin.write(json.dumps(req).encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            pass  # the child is gone: reported below
        line = self._read_line(t0 + self.limits.file_timeout_s + self.limits.kill_grace_s)
        if line is None:
            timed_out = proc.poll() is None
            if timed_out:
                proc.kill()
                proc.wait()
            death = self._death()
            self._stop()
            if timed_out:
                return WorkerAnswer("", 0, bounded=f"its extraction took longer than {self.limits.file_timeout_s:g} s "
                                                   f"(the parser was stopped)")
            return WorkerAnswer("", 0, error=f"the parser process died ({death}) while reading it (its memory "
                                             f"limit is {self.limits.memory_mb} MiB)")
        try:
            ans = json.loads(line)
            if not isinstance(ans, dict) or not isinstance(ans.get("head"), str):
                raise ValueError("not an answer object")
        except ValueError as e:  # our own child broke the protocol: its file gets the reason, the next a new child
            self._stop()
            return WorkerAnswer("", 0, error=f"the extraction worker answered nonsense ({e}; {line[:200]!r})")
        if ans.get("restart"):
            self._stop()
        return WorkerAnswer(ans["head"], int(ans["chars"]), ans.get("bounded"), ans.get("error"),
                            ans.get("missing_module"))

    def close(self) -> None:
        """Stop the child (if any) and give the slot back; safe to call twice."""
        self._stop()
        if self._slot:
            self._slot = False
            _slots.release()


# -- the child ---------------------------------------------------------------------------------------

def _lower(which: int, soft: int, hard: int | None = None) -> None:
    """Lower one resource limit (never above a hard limit this process already has)."""
    import resource

    _, cur_hard = resource.getrlimit(which)
    hard = soft if hard is None else hard
    if cur_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, cur_hard), min(hard, cur_hard)
    resource.setrlimit(which, (soft, hard))


def _lower_limits(limits: ExtractLimits) -> None:
    import resource

    _lower(resource.RLIMIT_AS, limits.memory_mb * 2**20)
    _lower(resource.RLIMIT_CORE, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails instead of killing
    _lower(resource.RLIMIT_FSIZE, 4 * 2**20)
    # a backstop for a child left behind by a parent that died: it cannot spin longer than a folder may
    cpu = int(limits.total_timeout_s + limits.file_timeout_s + limits.kill_grace_s) + 10
    _lower(resource.RLIMIT_CPU, cpu, cpu + 5)


def _near_memory_limit(limits: ExtractLimits) -> bool:
    """Whether this process's peak address space came within 10% of its limit (Linux)."""
    try:
        with open("/proc/self/status") as f:
            peak_kb = next(int(line.split()[1]) for line in f if line.startswith("VmPeak:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return peak_kb * 1024 > 0.9 * limits.memory_mb * 2**20


def _answer(req: dict, limits: ExtractLimits) -> dict:
    from tasks.extract_formats import parse

    out = Collector(limits, time.monotonic() + limits.file_timeout_s)
    ans: dict = {}
    path = Path(req["path"])
    try:
        if path.is_symlink() or not path.is_file():
            raise ValueError("not a regular file")
        parse(req["kind"], path, out, sqlite_rows=int(req["sqlite_rows"]))
    except Bounded as b:
        ans["bounded"] = str(b)
    except MemoryError:
        ans["bounded"] = f"it needs more than the parser's memory limit of {limits.memory_mb} MiB"
    except ImportError as e:
        ans.update(error=f"missing module {e.name}", missing_module=str(e.name or e))
    except Exception as e:  # noqa: BLE001 - corrupt file: a note, never a crash
        if _near_memory_limit(limits):  # e.g. lxml reports an allocation failure as a syntax error
            ans["bounded"] = f"it needs more than the parser's memory limit of {limits.memory_mb} MiB"
        else:
            ans["error"] = f"{type(e).__name__}: {e}"[:_MAX_ERROR_CHARS]
    text = out.text()
    ans.update(head=text[:int(req["max_chars"])], chars=len(text))
    if _near_memory_limit(limits):  # the next file gets a fresh process (and a fresh peak)
        ans["restart"] = True
    return ans


def _warm_up() -> None:
    """Import the parsers (a missing one is reported per file) and prove 64 MiB of headroom, under
    the lowered limits: MemoryError here means ``memory_mb`` is too low for any file."""
    import importlib

    for name in ("lxml.etree", "docx", "openpyxl", "pypdf", "pptx", "tasks.extract_formats"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    probe = bytearray(64 * 2**20)
    del probe


def serve(argv: list[str] | None = None) -> None:
    """The child's loop: one JSON request line in, one JSON answer line out, until stdin closes."""
    args = sys.argv[1:] if argv is None else argv
    limits = ExtractLimits.from_json(json.loads(args[0]))
    _lower_limits(limits)
    out = os.fdopen(os.dup(1), "wb")  # the answers' channel; fd 1 itself now goes where stderr goes,
    os.dup2(2, 1)  # so nothing a parser prints (Python or C) can break the protocol
    sys.stdout = sys.stderr
    try:
        _warm_up()
    except Exception as e:  # noqa: BLE001 - too low a limit for the parsers themselves: the host's setting
        out.write(json.dumps(f"no room for the parsers under the memory limit ({type(e).__name__}: {e})"[:300])
                  .encode() + b"\n")
        out.flush()
        return
    out.write(b'"ready"\n')
    out.flush()
    for line in sys.stdin.buffer:
        ans = _answer(json.loads(line), limits)
        out.write(json.dumps(ans).encode() + b"\n")
        out.flush()
        if ans.get("restart"):
            return


if __name__ == "__main__":
    serve()
