"""Code that runs inside a vLLM server process (its own venv): torch and the standard library only.

:mod:`clawgym_env.policy.vllm.server` puts this folder on the server's ``PYTHONPATH``, so its modules
import there as top-level modules (``clawgym_vllm_ext``) without importing ``clawgym_env`` itself,
whose dependencies the vLLM venv lacks.
"""
