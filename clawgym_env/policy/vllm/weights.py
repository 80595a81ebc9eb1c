"""Weight sync with a running vLLM server, shared by the policy and the server launcher.

:class:`~clawgym_env.policy.vllm.backend.VLLMPolicy` and
:class:`~clawgym_env.policy.vllm.server.VLLMServer` both reload weights in place; this module holds
what they share (so neither imports the other for it): the in-place reload protocol, the check
whether a model folder ties its embeddings, and :class:`WeightReloader`, what a policy needs of the
server behind it. The reload methods and vLLM's limits are described in
:mod:`clawgym_env.policy.vllm.server`.

Invariants: :func:`reload_inplace` resumes generation even when the reload fails, and every failure
is a :class:`PolicyError`; :func:`ties_embeddings` counts a folder without the flag as tied (the
safe answer: tied weights are never reloaded in place).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from clawgym_env.errors import PolicyError
from clawgym_env.jsontypes import JSONObject


class WeightReloader(Protocol):
    """The server behind a policy, as far as a weight sync needs it (a ``VLLMServer``)."""

    def reload(self, model_dir: str | os.PathLike, method: str = "auto") -> str:
        """Serve the checkpoint in ``model_dir``; returns the method used (``inplace`` or ``restart``)."""
        ...

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        ...


def reload_inplace(client: Any, model_dir: str | os.PathLike, timeout_s: float = 600.0) -> None:
    """In-place weight reload on a running dev-mode vLLM server (see :mod:`~clawgym_env.policy.vllm.server`).

    ``client`` is an ``httpx.Client`` whose ``base_url`` is the server root. Generation is resumed even
    when the reload fails; a failure raises :class:`PolicyError`.
    """
    import httpx

    def post(path: str, **kw: Any) -> Any:
        try:
            resp = client.post(path, timeout=timeout_s, **kw)
        except httpx.HTTPError as exc:
            raise PolicyError(f"weight sync: POST {path} to the vLLM server failed: {exc}") from exc
        if resp.status_code == 404:
            raise PolicyError(f"weight sync: the vLLM server has no {path} endpoint; start it with "
                              "VLLM_SERVER_DEV_MODE=1 (VLLMServer does), or use reload(method='restart')")
        if resp.status_code >= 400:
            raise PolicyError(f"weight sync: POST {path} answered {resp.status_code}: {resp.text[:500]}")
        return resp

    post("/pause", params={"mode": "wait"})
    try:
        post("/collective_rpc", json={"method": "reload_weights",
                                      "kwargs": {"weights_path": str(Path(model_dir).resolve())}})
        post("/reset_prefix_cache")
    except BaseException:
        try:
            post("/resume")
        except PolicyError:
            pass  # the reload's own error is the one to report
        raise
    post("/resume")


def model_config(model_dir: str | os.PathLike) -> JSONObject:
    """The ``config.json`` of a model folder (:class:`PolicyError` when it cannot be read)."""
    try:
        config: JSONObject = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise PolicyError(f"cannot read {model_dir}/config.json: {exc}") from exc
    return config


def ties_embeddings(model_dir: str | os.PathLike) -> bool:
    """``tie_word_embeddings`` of a model folder (a missing flag counts as tied: the safe answer)."""
    cfg = model_config(model_dir)
    return bool(cfg.get("tie_word_embeddings", (cfg.get("text_config") or {}).get("tie_word_embeddings", True)))


def has_experts(model_dir: str | os.PathLike) -> bool:
    """Whether a model folder's config describes routed MoE experts (``num_experts`` / ``num_local_experts`` > 0,
    or an architecture named ``*Moe*``)."""
    cfg = model_config(model_dir)
    text = {**(cfg.get("text_config") or {}), **cfg}
    experts = text.get("num_experts") or text.get("num_local_experts") or 0
    return bool(experts) or any("moe" in str(a).lower() for a in cfg.get("architectures") or [])
