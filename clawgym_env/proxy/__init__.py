"""The serving proxy: harnesses talk to it as if it were a model API; it records every call."""
