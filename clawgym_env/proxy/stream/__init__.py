"""Streaming a turn to a client: live (as the policy generates) and keep-alive (while a slow turn runs)."""
