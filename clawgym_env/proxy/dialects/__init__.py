"""The wire dialects the proxy speaks, one folder each (request models, answer rendering, streaming), behind one
registry."""
