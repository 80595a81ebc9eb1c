"""One error module: every error is named by the boundary it crossed.

Invariant: an error that reaches a user says what went wrong *and* what to do about it.
Failed rollouts are records (see :class:`clawgym_env.capture.records.EpisodeRecord`), not
exceptions: these errors are raised for bad input and broken infrastructure only.
"""

from __future__ import annotations


class ClawGymError(Exception):
    """Base class of every error this project raises on purpose."""


class TaskError(ClawGymError):
    """A task or suite could not be loaded or is malformed (names the file and the problem)."""


class SandboxError(ClawGymError):
    """A sandbox could not be created, used or destroyed (infrastructure, not the agent's fault)."""


class HarnessError(ClawGymError):
    """A harness adapter could not be installed, configured or launched."""


class ProxyError(ClawGymError):
    """The serving proxy could not start, or a request to it was malformed.

    ``status`` is the HTTP status the proxy answers with; ``field`` names the offending request field.
    """

    def __init__(self, message: str, *, status: int = 400, field: str | None = None,
                 code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.code = code


class PolicyError(ClawGymError):
    """A policy backend could not be built or failed to generate."""


class ConfigError(ClawGymError, ValueError):
    """A configuration (training args, a run's options, a config file) is invalid: names the field, what it holds
    and what would be accepted. Raised before anything runs; a ``ValueError`` too, so generic handlers catch it."""


class RegistrationError(ClawGymError):
    """A name of a plugin kind that cannot be used: unknown (the message lists close and available names), or a
    plugin that is broken: its module raised on import, its entry point is misnamed (no such module or
    attribute), or two distributions declare it. A broken plugin's message names the kind, the name, the
    entry point's target, its distribution (name and version) and the fix; the original exception is chained."""


class WorkspaceError(ClawGymError):
    """A workspace or task folder could not be copied or read (names the path and the fix)."""


class CopyLimitError(WorkspaceError):
    """A copy crossed one of its limits; ``limit`` names which (``bytes``, ``entries`` or ``time``) and
    ``report`` is the partial :class:`~clawgym_env.files.workspace.CopyReport`."""

    def __init__(self, message: str, *, report: object = None, limit: str = "bytes") -> None:
        super().__init__(message)
        self.report = report
        self.limit = limit
