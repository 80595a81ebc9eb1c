"""The trainer side of the weight broadcast into running vLLM engines (no files, no restart).

The pattern of vLLM's RLHF examples, built on torch.distributed alone (no vLLM import here): the trainer
(rank 0) hosts a private ``TCPStore``; every worker of every engine joins one extra process group
(``gloo`` on CPU, ``nccl`` on GPU) through the worker extension
:class:`clawgym_vllm_ext.WeightReceiverExtension` (started by ``VLLMServer(worker_extension=True)``),
reached over the dev-mode ``POST /collective_rpc`` endpoint. An update: ``POST /pause?mode=wait`` on each
engine; a ``collective_rpc`` per engine announcing the (name, dtype, shape) list, run in a thread
because it returns only when the worker has received everything; rank 0 broadcasts each tensor;
``/reset_prefix_cache`` and ``/resume``.

Invariants: the caller (the serving policy's write gate) guarantees no generation of ours is in
flight during :meth:`WeightBroadcaster.push`; the engines are resumed even when a push fails
(:class:`PolicyError`, naming the engine); a failed or timed-out push leaves possibly partly
updated weights (push again, or restart); world size = 1 + engines x tensor-parallel size.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from clawgym_env.errors import PolicyError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.vllm.ext.clawgym_vllm_ext import GroupSpec, WeightGroup, encode_meta, make_group


class WeightBroadcaster:
    """Rank 0 of the weight group over the engines at ``urls`` (see the module invariants).

    ``tensor_parallel_size``: workers per engine. ``backend``: ``gloo`` (CPU engines) or ``nccl``
    (GPU engines; tensors are moved to ``device``). ``host``: this machine's address as the engines
    reach it. ``timeout_s`` bounds the rendezvous and every broadcast.
    """

    def __init__(self, urls: Sequence[str], *, tensor_parallel_size: int = 1, backend: str = "gloo",
                 host: str = "127.0.0.1", timeout_s: float = 600.0, device: str | torch.device | None = None) -> None:
        import httpx
        import torch.distributed as dist

        if not urls:
            raise PolicyError("a weight broadcast needs at least one vLLM engine URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.tp = int(tensor_parallel_size)
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda") if backend == "nccl" else torch.device("cpu"))
        self.timeout_s = float(timeout_s)
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s + 30.0, connect=10.0))
        self._pool = cf.ThreadPoolExecutor(max_workers=len(self.urls), thread_name_prefix="weight-rpc")
        world = 1 + len(self.urls) * self.tp
        store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, world_size=world,
                              timeout=datetime.timedelta(seconds=timeout_s))
        self.spec = GroupSpec(host=host, port=int(store.port), world_size=world, backend=backend, timeout_s=timeout_s)
        futures = [self._pool.submit(self._rpc, url, "clawgym_init_weight_group",
                                     {"spec": self.spec.to_json(), "rank_offset": str(1 + i * self.tp)})
                   for i, url in enumerate(self.urls)]
        try:
            self.group: WeightGroup | None = make_group(self.spec, 0, store=store)
        except Exception as exc:  # noqa: BLE001 - re-raised by _fail as a PolicyError
            self._fail(futures, exc, "joining the weight group")
        for fut in futures:
            fut.result()
        self.last_seconds: float | None = None

    # -- HTTP to the engines ---------------------------------------------------------------------
    def _rpc(self, url: str, method: str, kwargs: dict[str, str]) -> list[Any]:
        return self._post(url, "/collective_rpc", json={"method": method, "kwargs": kwargs,
                                                        "timeout": self.timeout_s}).get("results") or []

    def _post(self, url: str, path: str, **kw: Any) -> JSONObject:
        import httpx

        try:
            resp = self._http.post(url + path, **kw)
        except httpx.HTTPError as exc:
            raise PolicyError(f"weight broadcast: POST {url}{path} failed: {type(exc).__name__}: {exc}") from exc
        if resp.status_code == 404:
            raise PolicyError(f"weight broadcast: {url} has no {path} endpoint; start it with "
                              "VLLMServer(dev_mode=True, worker_extension=True)")
        if resp.status_code >= 400:
            raise PolicyError(f"weight broadcast: POST {url}{path} answered {resp.status_code}: {resp.text[:500]}"
                              + (" (was the server started with worker_extension=True?)"
                                 if "clawgym_" in resp.text else ""))
        try:
            out: JSONObject = resp.json() if resp.content else {}
        except ValueError:
            out = {}
        return out

    def _fail(self, futures: list[cf.Future], exc: BaseException, what: str) -> None:
        """Report the engines' own errors first: they usually explain the local one."""
        for fut in futures:
            try:
                fut.result(timeout=5.0)
            except PolicyError as remote:
                raise PolicyError(f"{what}: {remote}") from exc
            except Exception:  # noqa: BLE001 - the local error below is then the one to report
                pass
        raise PolicyError(f"{what} failed: {type(exc).__name__}: {exc}") from exc

    # -- the update ------------------------------------------------------------------------------
    def push(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Broadcast ``(checkpoint name, tensor)`` pairs into every engine and reload them in place;
        returns the seconds it took. Raises :class:`PolicyError`; the engines are resumed either way."""
        if self.group is None:
            raise PolicyError("this WeightBroadcaster was closed; build a new one")
        items = [(name, t.detach()) for name, t in tensors]
        meta = encode_meta(items)
        t0 = time.monotonic()
        paused: list[str] = []
        try:
            for url in self.urls:
                self._post(url, "/pause", params={"mode": "wait"})
                paused.append(url)
            futures = [self._pool.submit(self._rpc, url, "clawgym_update_weights", {"meta": meta})
                       for url in self.urls]
            try:
                for _, t in items:
                    self.group.broadcast(t.to(self.device).contiguous())
            except Exception as exc:  # noqa: BLE001 - re-raised by _fail as a PolicyError
                self._fail(futures, exc, "broadcasting the weights")
            for url, fut in zip(self.urls, futures, strict=True):
                for answer in fut.result():
                    got = answer.get("received") if isinstance(answer, dict) else None
                    if got != len(items):
                        raise PolicyError(f"weight broadcast: a worker of {url} received {got} of {len(items)} "
                                          f"tensors ({answer})")
            for url in self.urls:
                self._post(url, "/reset_prefix_cache")
        finally:
            for url in paused:
                try:
                    self._post(url, "/resume")
                except PolicyError:
                    pass  # the push's own error (if any) is the one to report
        self.last_seconds = time.monotonic() - t0
        return self.last_seconds

    def close(self) -> None:
        """Leave the group on every engine and here (best effort, idempotent)."""
        group, self.group = self.group, None
        if group is None:
            return
        for url in self.urls:
            try:
                self._rpc(url, "clawgym_close_weight_group", {})
            except PolicyError:
                pass
        group.close()
        self._pool.shutdown(wait=False)
        self._http.close()
