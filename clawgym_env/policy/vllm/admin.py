"""The vLLM engine's admin calls for colocated training: sleep/wake and runtime LoRA adapters.

* **Sleep mode** (``--enable-sleep-mode``, dev-mode endpoints ``VLLM_SERVER_DEV_MODE=1``): ``POST /sleep?level=1``
  offloads the weights to host memory and drops the KV cache, so a trainer on the same GPU gets that memory for its
  forward/backward; ``POST /wake_up`` brings both back; ``GET /is_sleeping``. Level 1 keeps the weights (a wake
  serves exactly what was served before the sleep; level 2 would drop them, which an adapter-only sync cannot
  refill, so it is not offered). vLLM implements it with its CUDA memory pool: on any other platform the engine
  refuses ``--enable-sleep-mode`` at start ("not supported on current platform"), so :func:`sleep_mode_problem`
  names that before anything starts.
* **Runtime LoRA** (``--enable-lora --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``):
  ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` loads a peft adapter folder into the engine (an error
  when the engine cannot: a rank above ``R``, a module it has no LoRA layer for); a request then names the adapter as
  its ``model``; ``POST /v1/unload_lora_adapter {"lora_name"}`` forgets the name. A new name per version gives the
  adapter a new id, so no prefix-cache block computed with older adapter weights is reused.

Invariants: every call either succeeds or raises one :class:`PolicyError` naming the endpoint, the server's answer
and the fix; :func:`sleep` asks vLLM to wait for requests in flight (``mode=wait``), never to abort them.
"""

from __future__ import annotations

from typing import Any

from clawgym_env.errors import PolicyError
from clawgym_env.jsontypes import JSONObject

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM 0.32 accepts."""
SLEEP_LEVEL = 1
"""The sleep level used: weights offloaded to host memory (kept), KV cache dropped."""


def max_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds adapters of ``rank`` (:class:`PolicyError` above
    the largest)."""
    for allowed in LORA_RANKS:
        if allowed >= int(rank):
            return allowed
    raise PolicyError(f"LoRA rank {rank} is above the largest vLLM serves ({LORA_RANKS[-1]}); lower policy.lora_rank "
                      "or sync merged weights (scale.generation.sync: inplace or restart)")


def sleep_mode_problem(*, cuda: bool) -> str | None:
    """Why the engines cannot sleep (None when they can): vLLM's sleep mode needs its CUDA memory pool, so an
    engine without a GPU (``cuda`` False: the CPU build) refuses it."""
    if cuda:
        return None
    return ("scale.generation.sleep: true needs vLLM engines on a GPU (sleep mode offloads through vLLM's CUDA memory "
            "pool; the CPU engine refuses --enable-sleep-mode); set scale.generation.sleep: false, or run on a GPU "
            "where engines and trainer share it")


def admin_post(client: Any, path: str, *, timeout_s: float = 600.0, params: JSONObject | None = None,
               json: JSONObject | None = None, hint: str = "") -> Any:
    """``POST path`` on the engine (``client``: an ``httpx.Client`` on the server root); any failure is a
    :class:`PolicyError` (a 404 names the flags that enable the endpoint, ``hint``)."""
    import httpx

    try:
        resp = client.post(path, params=params, json=json, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise PolicyError(f"POST {path} to the vLLM server failed: {exc}") from exc
    if resp.status_code == 404:
        raise PolicyError(f"the vLLM server has no {path} endpoint{': ' + hint if hint else ''}")
    if resp.status_code >= 400:
        raise PolicyError(f"POST {path} answered {resp.status_code}: {resp.text[:500]}")
    return resp


SLEEP_HINT = "start it with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (VLLMServer(sleep_mode=True) does)"
LORA_HINT = ("start it with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "
             "(VLLMServer(lora_rank=...) does)")


def sleep(client: Any, *, level: int = SLEEP_LEVEL, timeout_s: float = 600.0) -> None:
    """Put the engine to sleep at ``level`` once its requests in flight finished."""
    admin_post(client, "/sleep", params={"level": int(level), "mode": "wait"}, timeout_s=timeout_s, hint=SLEEP_HINT)


def wake_up(client: Any, *, timeout_s: float = 600.0) -> None:
    """Wake the engine (weights and KV cache back on the device); a no-op for an engine awake."""
    admin_post(client, "/wake_up", timeout_s=timeout_s, hint=SLEEP_HINT)


def is_sleeping(client: Any, *, timeout_s: float = 60.0) -> bool:
    """Whether the engine sleeps (``GET /is_sleeping``)."""
    import httpx

    try:
        resp = client.get("/is_sleeping", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise PolicyError(f"GET /is_sleeping on the vLLM server failed: {exc}") from exc
    if resp.status_code >= 400:
        raise PolicyError(f"GET /is_sleeping answered {resp.status_code}: {SLEEP_HINT}")
    return bool(resp.json().get("is_sleeping"))


def load_adapter(client: Any, name: str, path: str, *, timeout_s: float = 600.0) -> None:
    """Load the peft adapter folder ``path`` into the engine under ``name`` (requests then name it as ``model``)."""
    admin_post(client, "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)},
               timeout_s=timeout_s, hint=LORA_HINT)


def unload_adapter(client: Any, name: str, *, timeout_s: float = 600.0) -> None:
    """Forget the adapter ``name`` (requests naming it fail from now on)."""
    admin_post(client, "/v1/unload_lora_adapter", json={"lora_name": name}, timeout_s=timeout_s, hint=LORA_HINT)
