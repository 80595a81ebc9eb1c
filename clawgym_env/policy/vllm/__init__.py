"""vLLM as a policy: the HTTP backend, the server launcher, and weight sync (files or NCCL broadcast)."""
