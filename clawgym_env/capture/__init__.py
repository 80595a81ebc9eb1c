"""Call capture: typed records of every model call an episode made."""

from clawgym_env.capture.records import CallRecord, EpisodeRecord, EpisodeStatus, InputChange, WorkspaceChange
from clawgym_env.capture.tree import CallTree, TreeNode, TreeStats, expected_tree_tokens

__all__ = ["CallRecord", "EpisodeRecord", "EpisodeStatus", "InputChange", "WorkspaceChange", "CallTree", "TreeNode",
           "TreeStats", "expected_tree_tokens"]
