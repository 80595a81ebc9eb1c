"""File-system utilities shared by sandboxes and graders: bounded walks and copies, workspace snapshots."""
