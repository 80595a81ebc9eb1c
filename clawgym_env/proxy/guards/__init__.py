"""The proxy's defences: per-request limits and per-episode / overall resource bounds."""
