"""One episode, start to end: workspace, sandbox, harness, proxy, grade, and the record it leaves."""
