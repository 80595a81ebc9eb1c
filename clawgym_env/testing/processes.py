"""Left-behind process checks for harness authors: mark a harness's processes, then look for them.

A harness adapter must not leave processes behind when its episode ends (finished, failed or timed
out). To check that for your own adapter, wrap it in :class:`Marked`, run an episode, and assert
that no process carrying the marker survives.

Invariants:
  * :class:`Marked` launches the wrapped adapter's :class:`~clawgym_env.harness.LaunchSpec`
    unchanged except for one environment variable, ``CLAWGYM_TEST_MARKER=<marker>`` (and, when
    asked, a wrong episode token in the endpoint, so the real proxy answers 404);
  * :func:`survivors` finds every host process whose command line or environment carries the marker
    (harnesses that rename their process, as OpenClaw does, keep their environment), never the
    calling process itself;
  * :class:`Watch` polls :func:`survivors` while an episode runs, so a test can show that the check
    saw the processes it later expects gone (a check that sees nothing proves nothing).

Usage::

    from clawgym_env.testing import Marked, Watch, assert_no_survivors

    adapter = Marked(MyAdapter())
    with Watch(adapter.marker) as watch:
        runtime.run(task, adapter)
    assert watch.seen                       # the check could see the harness while it ran
    assert_no_survivors(adapter.marker)     # ... and nothing of it is left
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

from clawgym_env.harness import Endpoint, HarnessAdapter, HarnessOutput, LaunchSpec
from clawgym_env.task import Task

MARKER_ENV = "CLAWGYM_TEST_MARKER"
"""The environment variable :class:`Marked` adds to the harness's process."""


class Marked(HarnessAdapter):
    """A real adapter, launched as is, plus ``CLAWGYM_TEST_MARKER=<marker>`` in its environment."""

    def __init__(self, inner: HarnessAdapter, marker: str | None = None, *, wrong_token: bool = False) -> None:
        self.inner = inner
        self.marker = marker or uuid.uuid4().hex
        self.wrong_token = wrong_token
        """Give the harness a wrong episode token (the proxy answers 404 to every call)."""
        self.name = inner.name
        self.dialect = inner.dialect

    def install(self, cache_dir: Path | None = None) -> None:
        """Install the wrapped harness."""
        self.inner.install(cache_dir)

    def ro_paths(self) -> list[Path]:
        """The wrapped harness's read-only paths."""
        return self.inner.ro_paths()

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """The wrapped harness's launch, plus the marker in its environment."""
        if self.wrong_token:
            bogus = f"wrong{self.marker}"
            endpoint = Endpoint(base_url=endpoint.base_url.replace(endpoint.api_key, bogus), api_key=bogus,
                                model=endpoint.model)
        spec = self.inner.launch(task, endpoint, home=home)
        spec.env = {**spec.env, MARKER_ENV: self.marker}
        return spec

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The wrapped harness's reading of its output."""
        return self.inner.read_output(stdout, stderr)


def survivors(marker: str) -> list[str]:
    """Host processes (``pid: command``) whose command line or environment holds ``marker``."""
    me = str(os.getpid())
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    found = [ln for ln in out.splitlines() if ln.split(" ", 1)[0] != me]
    needle = f"{MARKER_ENV}={marker}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or proc.name == me:
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name}: {cmd[:200]}")
        except OSError:
            continue
    return found


class Watch:
    """Polls :func:`survivors` in a thread while an episode runs; what it saw is in ``seen``."""

    def __init__(self, marker: str, every_s: float = 0.5) -> None:
        self.marker, self.every_s = marker, every_s
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            self.seen.extend(p for p in survivors(self.marker) if p not in self.seen)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def assert_no_survivors(marker: str, grace_s: float = 5.0) -> None:
    """Raise ``AssertionError`` if a process carrying ``marker`` is left after up to ``grace_s``
    (processes being reaped get that long to go)."""
    deadline = time.monotonic() + grace_s
    left = survivors(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = survivors(marker)
    if left:
        raise AssertionError(f"harness processes survived the episode: {left}")
