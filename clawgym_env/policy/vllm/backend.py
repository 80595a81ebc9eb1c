"""A policy served by vLLM: token ids in, sampled token ids + logprobs out, over vLLM's HTTP API.

:class:`VLLMPolicy` sends the proxy's prompt ids to ``POST /v1/completions`` as a token-id ``prompt``
(no re-tokenisation on either side) and reads back the ids vLLM sampled (``return_token_ids``) and
their logprobs (``logprobs=0``, with ``return_tokens_as_token_ids`` so that each logprob entry names
its id, which is checked against ``token_ids``).

Invariants (on top of :class:`~clawgym_env.policy.base.Generation`'s):

* ``token_ids`` are exactly vLLM's sampled ids; a stop on ``<|im_end|>`` (or any id in
  ``stop_token_ids``) includes that id with ``finish_reason == "stop"``; ``max_tokens`` (capped by the
  server's ``max_model_len`` minus the prompt) gives ``"length"``. Stop *strings* are the proxy's job.
* Logprobs are those of the distribution sampled from when the server runs with
  ``--logprobs-mode processed_logprobs`` (:class:`VLLMServer` always does): after temperature and top-p,
  and the unmodified distribution for greedy (``temperature <= 1e-5``), as :class:`TransformersPolicy`.
  Every request pins ``top_k=0``, ``min_p=0`` and no penalties, so server defaults cannot change them.
* With ``vocab_size`` (the model's embedding rows) above ``len(tokenizer)``, the padding ids get a
  ``logit_bias`` of -100: they are never sampled and the distribution is the one over the real
  vocabulary, exactly as :class:`TransformersPolicy` samples it.
* ``version`` increases by one on every :meth:`sync_weights`; a generation's ``policy_version`` is the
  version of the weights that produced *all* its tokens: a sync waits until in-flight generations
  finish and holds new ones back until the server serves the new weights.
* The tokenizer must be the server's: at construction ``POST /tokenize`` of a probe text (special
  tokens, non-ASCII) must give the ids our tokenizer gives, or :class:`PolicyError` is raised.
* Never a sample while the engine sleeps: :meth:`sleep` holds new generations back, waits for those in flight,
  then puts the engine to sleep; :meth:`wake_up` wakes it, then lets generations through again.
* :meth:`serve_model` switches the served name (a LoRA adapter loaded by :meth:`load_adapter`, or the base
  model) with no generation in flight; every later request names it.
* Connection failures (refused, reset, server restarting) are retried ``retries`` times with
  exponential backoff; HTTP errors are not (a 400 says what was wrong) and become :class:`PolicyError`.
  Thread safe: one ``httpx.Client``; concurrent generations are batched by vLLM.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from clawgym_env.errors import PolicyError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams, SyncReport
from clawgym_env.policy.http_json import request_json
from clawgym_env.policy.vllm import admin
from clawgym_env.policy.vllm.weights import WeightReloader, reload_inplace, ties_embeddings

if TYPE_CHECKING:
    from clawgym_env.policy.hf import Tokenizer

GREEDY_EPS = 1e-5
TOKENIZER_PROBE = "Hello wörld 🤔 <|im_start|>user\nls -la<|im_end|>\n<think>\n</think>"
_RETRYABLE_STATUS = (502, 503, 504)


def normalize_base_url(url: str) -> str:
    """``http://host:port[/v1][/]`` → ``http://host:port`` (the server root)."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        raise PolicyError(f"not an http(s) URL: {url!r}; pass the vLLM server's address, "
                          "e.g. http://127.0.0.1:8000")
    return url


class FolderSyncReport(SyncReport):
    """A weight sync from a checkpoint folder: the :class:`SyncReport` and the ``model_dir`` reloaded."""

    model_dir: str


class VLLMPolicy(PolicyBackend):
    """A model served by a vLLM OpenAI-compatible server (see the module invariants).

    ``base_url``: the server (``/v1`` optional). ``model``: the served model name (default: the only
    or first one ``/v1/models`` lists). ``server``: the :class:`VLLMServer` behind it, needed by
    :meth:`sync_weights` for a restart reload; without it an in-place reload is asked of ``base_url``.
    ``owns_server``: :meth:`close` stops ``server``. ``stop_token_ids`` default to ``<|im_end|>`` and the
    tokenizer's eos.
    """

    name = "vllm"

    def __init__(self, base_url: str, model: str | None = None, tokenizer: Tokenizer = None, *,
                 server: WeightReloader | None = None, owns_server: bool = False, api_key: str | None = None,
                 timeout_s: float = 600.0, retries: int = 3, backoff_s: float = 0.5,
                 stop_token_ids: Iterable[int] | None = None, vocab_size: int | None = None,
                 check_tokenizer: bool = True, name: str | None = None) -> None:
        import httpx

        self.base_url = normalize_base_url(base_url)
        self.server = server
        self._owns_server = owns_server
        self.retries = max(0, int(retries))
        self.backoff_s = float(backoff_s)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=10.0),
                                    headers=headers)
        if tokenizer is None:
            from clawgym_env.policy.tokenizer import load_tokenizer

            tokenizer = load_tokenizer()
        self._tokenizer = tokenizer
        self.version = 0
        self.last_sync: FolderSyncReport | None = None
        self._gate = threading.Condition()
        self._in_flight = 0
        self._syncing = False
        self._asleep = False
        self._closed = False
        models = self._request("GET", "/v1/models").get("data") or []
        ids = [m.get("id") for m in models]
        if model is None:
            if not ids:
                raise PolicyError(f"the vLLM server at {self.base_url} serves no model")
            model = ids[0]
        elif model not in ids:
            raise PolicyError(f"the vLLM server at {self.base_url} does not serve {model!r}; it serves {ids}")
        self.model = model
        self.max_model_len = next((int(m["max_model_len"]) for m in models
                                   if m.get("id") == model and m.get("max_model_len")), None)
        self.name = name or f"vllm:{model}"
        stops = set(int(t) for t in stop_token_ids) if stop_token_ids is not None else set()
        if stop_token_ids is None:
            for tid in (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id):
                if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
                    stops.add(tid)
        self.stop_token_ids = frozenset(stops)
        real = len(tokenizer)
        self._logit_bias = ({str(i): -100.0 for i in range(real, int(vocab_size))}
                            if vocab_size and int(vocab_size) > real else None)
        if check_tokenizer:
            self.check_tokenizer()

    # -- HTTP ------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: JSONObject | None = None) -> JSONObject:
        """One JSON request with retries on connection failures; any failure → :class:`PolicyError`."""
        return request_json(self._client, method, path, service="the vLLM server", url=self.base_url,
                            retries=self.retries, backoff_s=self.backoff_s, retry_status=_RETRYABLE_STATUS, json=body,
                            unreachable_hint="start one (clawgym_env.policy.vllm.server.VLLMServer) or fix the URL")

    def check_tokenizer(self) -> None:
        """Raise :class:`PolicyError` unless the server tokenises a probe text exactly as our tokenizer."""
        theirs = self._request("POST", "/tokenize", {"model": self.model, "prompt": TOKENIZER_PROBE,
                                                     "add_special_tokens": False}).get("tokens")
        ours = list(self._tokenizer.encode(TOKENIZER_PROBE, add_special_tokens=False))
        if theirs != ours:
            raise PolicyError(f"the vLLM server's tokenizer differs from ours (probe ids {theirs} vs {ours}); "
                              "serve a model folder holding the same Qwen3 tokenizer files")

    # -- PolicyBackend ---------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer the server was checked against (its ids are the prompt ids)."""
        return self._tokenizer

    def request_body(self, prompt_ids: list[int], params: SamplingParams, max_tokens: int) -> JSONObject:
        """The ``/v1/completions`` body for one generation."""
        greedy = float(params.temperature) <= GREEDY_EPS
        body: JSONObject = {
            "model": self.model, "prompt": [int(t) for t in prompt_ids], "max_tokens": int(max_tokens),
            "temperature": 0.0 if greedy else float(params.temperature),
            "top_p": 1.0 if greedy else float(params.top_p),
            "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "repetition_penalty": 1.0, "n": 1, "logprobs": 0, "return_tokens_as_token_ids": True,
            "return_token_ids": True, "stop_token_ids": sorted(self.stop_token_ids),
            "skip_special_tokens": False, "include_stop_str_in_output": True,
        }
        if params.seed is not None:
            body["seed"] = int(params.seed)
        if self._logit_bias:
            body["logit_bias"] = self._logit_bias
        return body

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """Sample a continuation of ``prompt_ids`` on the server (see the module invariants)."""
        if self._closed:
            raise PolicyError("this VLLMPolicy was closed; build a new one")
        if not prompt_ids:
            raise PolicyError("empty prompt: a prompt needs at least one token (the chat template's)")
        if params.top_p <= 0.0 or params.top_p > 1.0:
            raise PolicyError(f"top_p must be in (0, 1], got {params.top_p}")
        max_tokens = int(params.max_tokens)
        if self.max_model_len:
            if len(prompt_ids) >= self.max_model_len:
                raise PolicyError(f"prompt of {len(prompt_ids)} tokens does not fit the served context of "
                                  f"{self.max_model_len}; shorten the conversation or serve a longer "
                                  "--max-model-len")
            max_tokens = min(max_tokens, self.max_model_len - len(prompt_ids))
        with self._gate:
            while self._syncing or self._asleep:
                self._gate.wait()
            self._in_flight += 1
            version = self.version
        try:
            if max_tokens <= 0:
                return Generation([], [], "length", policy_version=version)
            out = self._request("POST", "/v1/completions", self.request_body(prompt_ids, params, max_tokens))
        finally:
            with self._gate:
                self._in_flight -= 1
                self._gate.notify_all()
        ids, logprobs, finish = self._parse(out)
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish, policy_version=version)

    def _parse(self, out: JSONObject) -> tuple[list[int], list[float], str]:
        try:
            choice = out["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            lp = choice.get("logprobs") or {}
            values = lp.get("token_logprobs") or []
            named = lp.get("tokens") or []
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PolicyError(f"unexpected /v1/completions answer from vLLM (no choices[0].token_ids; is this "
                              f"vLLM?): {str(out)[:300]}") from exc
        if len(values) != len(ids) or any(v is None for v in values):
            raise PolicyError(f"vLLM returned {len(ids)} tokens but {len(values)} logprobs")
        if named and [f"token_id:{t}" for t in ids] != list(named):
            raise PolicyError("vLLM's token_ids and its logprob tokens disagree; the server may not honour "
                              "return_tokens_as_token_ids")
        logprobs = [float(v) for v in values]
        if any(math.isnan(v) or v > 1e-4 for v in logprobs):
            raise PolicyError(f"vLLM returned invalid logprobs {logprobs[:5]}...")
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            raise PolicyError(f"vLLM ended the generation with finish_reason={finish!r} (aborted: a /pause with "
                              "mode=abort, or the server shutting down); retry the call")
        return ids, logprobs, finish

    # -- weight sync -----------------------------------------------------------------------------
    def sync_weights(self, model_dir: str | os.PathLike, method: str = "auto") -> int:
        """Make the server serve the checkpoint in ``model_dir`` (a ``save_pretrained`` folder of the same
        architecture); returns the new ``version``.

        In-flight generations finish first (on the old weights, with the old version); new ones wait.
        ``method``: see :meth:`VLLMServer.reload`; without a ``server`` only ``inplace`` is possible (and
        it is unsafe for tied-embedding models, see :mod:`~clawgym_env.policy.vllm.server`). ``last_sync``
        records the method used and its duration. On failure :class:`PolicyError` is raised and
        ``version`` is unchanged.
        """
        with self._gate:
            while self._syncing:
                self._gate.wait()
            self._syncing = True
            while self._in_flight:
                self._gate.wait()
        t0 = time.monotonic()
        try:
            if self.server is not None:
                used = self.server.reload(model_dir, method=method)
            elif method in ("auto", "inplace"):
                if ties_embeddings(Path(model_dir)):
                    raise PolicyError(f"{model_dir} ties its input and output embeddings, which vLLM 0.32 "
                                      "cannot reload in place; sync through a VLLMServer (it restarts)")
                reload_inplace(self._client, model_dir)
                used = "inplace"
            else:
                raise PolicyError(f"reload method {method!r} needs the VLLMServer; this policy only knows "
                                  f"the URL {self.base_url}")
            with self._gate:
                self.version += 1
                self.last_sync = {"method": used, "seconds": time.monotonic() - t0, "version": self.version,
                                  "model_dir": str(model_dir)}
                return self.version
        finally:
            with self._gate:
                self._syncing = False
                self._gate.notify_all()

    # -- colocated training: sleep/wake, LoRA adapters -------------------------------------------------
    @property
    def asleep(self) -> bool:
        """Whether :meth:`sleep` put the engine to sleep (and :meth:`wake_up` has not woken it yet)."""
        return self._asleep

    def sleep(self, level: int = admin.SLEEP_LEVEL) -> None:
        """Hold new generations back, wait for those in flight, then put the engine to sleep (its weights and KV
        cache leave the GPU). Generations started meanwhile wait for :meth:`wake_up`. A no-op when asleep."""
        with self._gate:
            while self._syncing:
                self._gate.wait()
            if self._asleep:
                return
            self._asleep = True
            while self._in_flight:
                self._gate.wait()
        try:
            admin.sleep(self._client, level=level)
        except BaseException:
            with self._gate:
                self._asleep = False
                self._gate.notify_all()
            raise

    def wake_up(self) -> None:
        """Wake the engine, then let the generations held back by :meth:`sleep` through (a no-op when awake). On a
        failure the engine counts as asleep still (generations keep waiting): wake again or close."""
        with self._gate:
            if not self._asleep:
                return
        admin.wake_up(self._client)
        with self._gate:
            self._asleep = False
            self._gate.notify_all()

    def load_adapter(self, name: str, path: str | os.PathLike) -> None:
        """Load the peft adapter folder ``path`` into the engine as ``name`` (served once :meth:`serve_model` names
        it). The engine needs ``VLLMServer(lora_rank=...)``."""
        admin.load_adapter(self._client, name, str(Path(path).resolve()))

    def unload_adapter(self, name: str) -> None:
        """Make the engine forget the adapter ``name`` (never the one served)."""
        if name == self.model:
            raise PolicyError(f"adapter {name!r} is the one served; serve_model() another first")
        admin.unload_adapter(self._client, name)

    def serve_model(self, name: str) -> None:
        """Name ``name`` (an adapter loaded, or the base model) as the ``model`` of every request from now on; waits
        until no generation is in flight, so none mixes two names."""
        with self._gate:
            while self._syncing:
                self._gate.wait()
            self._syncing = True
            while self._in_flight:
                self._gate.wait()
            self.model = name
            self._syncing = False
            self._gate.notify_all()

    def close(self) -> None:
        """Close the HTTP client, and stop the server when this policy owns it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._client.close()
        if self._owns_server and self.server is not None:
            self.server.stop()
