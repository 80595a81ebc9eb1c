"""Call capture: typed records of every model call an episode made."""

from clawgym_env.capture.records import CallRecord, EpisodeRecord, EpisodeStatus, WorkspaceChange

__all__ = ["CallRecord", "EpisodeRecord", "EpisodeStatus", "WorkspaceChange"]
