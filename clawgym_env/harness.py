"""The harness seam: how to install a harness, launch it for a task against an endpoint, and read
its final answer. Harnesses are black boxes: they speak to the serving proxy over HTTP only.

An adapter never runs anything itself; it describes a launch (:class:`LaunchSpec`) that the
episode runner executes inside a sandbox, and it interprets the finished process's output.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from clawgym_env.capture.records import CallKind, CallRecord
from clawgym_env.task import Task


@dataclasses.dataclass
class Endpoint:
    """Where the harness reaches the model, as seen from inside the sandbox."""

    base_url: str  # e.g. http://127.0.0.1:18080/ep/<token>/v1
    api_key: str   # the episode token (harnesses need *some* key)
    model: str = "clawgym-policy"

    @property
    def root_url(self) -> str:
        """The base URL without the trailing ``/v1`` (Anthropic-style clients add it themselves)."""
        return self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url


@dataclasses.dataclass
class LaunchSpec:
    """How to start a harness inside the sandbox: argv (absolute paths), extra environment, files, cwd."""

    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    files: dict[str, str | bytes] = dataclasses.field(default_factory=dict)
    """Files to write inside the sandbox before launch (path inside → content), e.g. configs in HOME."""
    cwd: str | None = None


@dataclasses.dataclass
class HarnessOutput:
    """What a finished harness process said: its final answer (None: it gave none) and its transcript."""

    final_message: str | None
    transcript: list[dict] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class EpisodeResources:
    """What one episode of a harness needs on its node (the harness's processes, not the sandbox's files):
    the fleet schedules episodes so that a node's running episodes fit its CPUs and memory."""

    cpus: float = 0.5
    """CPU cores one episode keeps busy on average (the harness's own processes; the model runs elsewhere)."""
    memory_mb: int = 512
    """Peak resident memory of one episode's process tree, in MiB (measured, with headroom)."""


KindVerdict = tuple[CallKind, str] | None
"""An adapter's verdict on one call: ``(kind, reason)``, or None to leave the call to the structural default."""


def verdicts_per_call(calls: Sequence[CallRecord], judge: Callable[[CallRecord], KindVerdict]) -> list[KindVerdict]:
    """``judge`` applied to every call, a call it cannot read (it raised) left to the structural default (None):
    the usual body of :meth:`HarnessAdapter.call_kinds`. Never raises; answers for every call."""
    out: list[KindVerdict] = []
    for call in calls:
        try:
            out.append(judge(call))
        except Exception:  # noqa: BLE001 - a malformed record is left to the structural default
            out.append(None)
    return out


class HarnessAdapter(abc.ABC):
    """The harness seam. A harness package exports exactly one subclass; it is registered by name in
    :data:`clawgym_env.plugins.harnesses` (entry-point group ``clawgym.harnesses``)."""

    name: str = "harness"
    dialect: str = "openai_chat"
    resources: EpisodeResources = EpisodeResources()
    """What one episode of this harness needs on its node (see :class:`EpisodeResources`)."""

    def install(self, cache_dir: Path | None = None) -> None:
        """Install the harness (idempotent). The reference harness needs nothing."""
        return None

    def ro_paths(self) -> list[Path]:
        """Extra host paths the harness needs read-only inside the sandbox (its install dir)."""
        return []

    def missing(self) -> str | None:
        """Why this harness cannot run here, with the command that fixes it (e.g. its pinned package is
        not installed: "run `clawgym harness install NAME`"), or None when it can. Cheap and side-effect
        free: it installs and launches nothing. The reference harness needs nothing."""
        return None

    @abc.abstractmethod
    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        """Describe how to start the harness on ``task`` (cwd = the task's workspace)."""

    @abc.abstractmethod
    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        """The final answer (None if the harness gave none) from the finished process's output."""

    def call_kinds(self, calls: Sequence[CallRecord]) -> list[KindVerdict]:
        """Per captured call of one episode (in ``call_index`` order), ``(kind, reason)`` where this harness
        marks the call itself (its system prompt, tool set, headers such as a subagent id, request shape), or
        None to leave it to the structural default (:func:`clawgym_env.capture.call_kinds.classify_calls`).
        Must return exactly ``len(calls)`` items and never raise on what a model made the harness send. The
        default marks nothing."""
        return [None] * len(calls)

    def discarded_calls(self, calls: Sequence[CallRecord]) -> dict[int, int]:
        """``{call_index of an abandoned call: call_index of the later call that retried it}`` for retries this
        harness makes in its own way (not by re-sending the identical prompt, which
        :func:`clawgym_env.capture.call_kinds.find_discarded` already pairs), on evidence only the harness
        writes. Must never raise on what a model made the harness send. The default marks nothing."""
        return {}
