"""The bubblewrap sandbox backend: plan, run, host-side files and cgroups, the relay holder."""
