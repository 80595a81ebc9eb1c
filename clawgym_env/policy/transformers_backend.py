"""A local Hugging Face ``transformers`` policy: KV-cached sampling with exact logprobs.

:class:`TransformersPolicy` wraps any Qwen3-family causal LM. Sampling is a hand-written loop
over ``model.forward`` with a ``DynamicCache`` (not ``model.generate``), so every reported
logprob is the one of the token under the distribution it was actually drawn from.

Invariants (on top of :class:`~clawgym_env.policy.base.Generation`'s):

* The sampling distribution at each step is ``softmax(logits / temperature)`` restricted to the
  tokenizer's real vocabulary (ids ``>= len(tokenizer)`` are padding rows of the embedding
  matrix and are never sampled), then truncated to the top-p nucleus (the smallest set of most
  likely tokens whose mass reaches ``top_p``; the most likely token is always kept) and
  renormalised. ``logprobs[i]`` is the log of that renormalised probability.
* ``temperature <= 0`` means greedy decoding. A point mass would make every logprob 0.0, which is
  useless to a trainer, so greedy steps report the logprob of the chosen token under the
  *unmodified* distribution (temperature 1, no top-p, real vocabulary only). This is the one
  documented exception to "logprob under the distribution sampled from".
* Generation stops after a stop token (``<|im_end|>``, the tokenizer's eos and the model config's
  eos ids), which is included in ``token_ids`` with ``finish_reason == "stop"``, or after
  ``max_tokens`` tokens (or the model's context limit) with ``finish_reason == "length"``.
  Stop *strings* are the proxy's job, not this backend's.
* Only the last position's logits are ever computed (prefill with ``logits_to_keep=1``), in
  float32, whatever the model's dtype.
* One generation (or weight update) at a time: a lock serialises them, so the policy is safe to
  share between threads. ``policy_version`` of a generation is the ``version`` its tokens came from.
* ``version`` increases by one on every :meth:`load_state_dict` / :meth:`update_weights`.
* ``params.seed`` seeds a private ``torch.Generator``: equal seed, prompt, params and weights give
  equal tokens. Without a seed the global torch RNG is used.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from clawgym_env.errors import PolicyError
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams

if TYPE_CHECKING:
    import torch
    from transformers import DynamicCache

    from clawgym_env.policy.hf import CausalLM, Tokenizer

GREEDY_EPS = 1e-5  # temperatures at or below this are greedy


def _torch() -> ModuleType:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is an optional dependency
        raise PolicyError("the transformers policy needs PyTorch: pip install 'clawgym[torch]'") from exc
    return torch


def _resolve_dtype(dtype: object, device: str) -> object:
    torch = _torch()
    if dtype is None:
        return torch.float32 if device == "cpu" else "auto"
    if isinstance(dtype, str):
        if dtype == "auto":
            return "auto"
        name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                "float": "float32"}.get(dtype, dtype)
        value = getattr(torch, name, None)
        if not isinstance(value, torch.dtype):
            raise PolicyError(f"unknown dtype {dtype!r}; use float32, bfloat16, float16 or auto")
        return value
    return dtype


def _draw(logp: torch.Tensor, generator: torch.Generator | None) -> int:
    """Inverse-CDF draw from a 1-D log-probability vector (exact; zero-mass entries never drawn)."""
    torch = _torch()
    cdf = torch.cumsum(logp.double().exp(), dim=-1)
    u = torch.rand((), generator=generator, dtype=torch.float64, device=logp.device) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), logp.shape[-1] - 1)


def _nucleus(logp: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-p nucleus of ``logp`` → (log-probs renormalised over it, their token ids), most likely first.

    The nucleus is the shortest prefix of the tokens sorted by probability whose mass reaches
    ``top_p`` (the most likely token always belongs). A ``topk`` over a few candidates finds it
    without sorting the whole vocabulary when the distribution is peaked, as trained models' are.
    """
    torch = _torch()
    vocab = logp.shape[-1]
    for k in (256, 4096, vocab):
        k = min(k, vocab)
        vals, idx = torch.topk(logp, k) if k < vocab else torch.sort(logp, descending=True)
        probs = vals.exp()
        cum = torch.cumsum(probs, dim=-1)
        if k == vocab or float(cum[-1]) >= top_p:
            keep = int(torch.count_nonzero((cum - probs) < top_p))  # mass strictly before < top_p
            kept = vals[:keep]
            return kept - torch.logsumexp(kept, dim=-1), idx[:keep]
    raise AssertionError("unreachable")  # pragma: no cover


def _sample_step(logits: torch.Tensor, temperature: float, top_p: float,
                 generator: torch.Generator | None) -> tuple[int, float]:
    """One decoding step on a 1-D float32 logits vector → (token id, its logprob)."""
    torch = _torch()
    if temperature <= GREEDY_EPS:
        logp = torch.log_softmax(logits, dim=-1)
        tok = int(torch.argmax(logits))
        return tok, float(logp[tok])
    logp = torch.log_softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        kept_logp, kept_ids = _nucleus(logp, top_p)
        i = _draw(kept_logp, generator)
        return int(kept_ids[i]), float(kept_logp[i])
    tok = _draw(logp, generator)
    return tok, float(logp[tok])


class TransformersPolicy(PolicyBackend):
    """A Qwen3-family causal LM sampled token by token on a KV cache (see the module invariants)."""

    name = "transformers"

    def __init__(self, model: CausalLM, tokenizer: Tokenizer, *, device: str | None = None,
                 name: str | None = None, stop_token_ids: Iterable[int] | None = None) -> None:
        torch = _torch()
        if device is not None:
            model = model.to(device)
        self._model = model.eval()
        self._tokenizer = tokenizer
        self.device = next(model.parameters()).device
        if name:
            self.name = name
        self.version = 0
        self._lock = threading.RLock()
        self._vocab_limit = min(len(tokenizer), int(model.config.vocab_size))
        self._max_positions = getattr(model.config, "max_position_embeddings", None)
        stops = set(stop_token_ids or ())
        if stop_token_ids is None:
            im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
            for tid in (im_end, tokenizer.eos_token_id, getattr(model.config, "eos_token_id", None)):
                if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
                    stops.add(tid)
                elif isinstance(tid, (list, tuple)):
                    stops.update(int(t) for t in tid)
        self.stop_token_ids = frozenset(stops)
        params = inspect.signature(model.forward).parameters
        # transformers >= 5 names the cache argument ``cache``; older releases ``past_key_values``
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in params else (
            "num_logits_to_keep" if "num_logits_to_keep" in params else None)
        self._closed = False
        del torch

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model_dir: str | Path, device: str | None = None, dtype: object = None,
                        tokenizer: object = None, *, name: str | None = None,
                        stop_token_ids: Iterable[int] | None = None) -> TransformersPolicy:
        """Load a model directory (``config.json`` + weights). The tokenizer comes from the same
        directory when it holds one, else the project's default Qwen3 tokenizer.

        ``device``: ``None`` → ``cuda`` when available, else ``cpu``. ``dtype``: ``None`` →
        float32 on CPU, the checkpoint's own dtype elsewhere; or a ``torch.dtype``/name. ``name`` (default:
        the folder's name) and ``stop_token_ids`` go to the constructor.
        """
        torch = _torch()
        from clawgym_env.policy.tokenizer import load_tokenizer

        path = Path(model_dir)
        if not (path / "config.json").exists():
            raise PolicyError(f"{path} is not a model directory (no config.json); pass a directory written "
                              "by save_pretrained, e.g. one made by build_tiny_qwen3(save_dir=...)")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        torch_dtype = _resolve_dtype(dtype, device)
        if tokenizer is None:
            has_tok = (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()
            tokenizer = load_tokenizer(path if has_tok else None)
        import transformers
        from transformers import AutoModelForCausalLM
        major = int(transformers.__version__.split(".")[0])
        dtype_kw = "dtype" if major >= 5 else "torch_dtype"
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), **{dtype_kw: torch_dtype})
        except Exception as exc:  # noqa: BLE001 - re-raised with the path
            raise PolicyError(f"could not load a causal LM from {path}: {exc}") from exc
        return cls(model, tokenizer, device=device, name=name or path.name, stop_token_ids=stop_token_ids)

    # -- PolicyBackend -------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer this policy was built with."""
        return self._tokenizer

    @property
    def model(self) -> CausalLM:
        """The live causal LM (trainers share it: its weights are the policy's)."""
        return self._model

    def _new_cache(self) -> DynamicCache:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self._model.config)
        except TypeError:  # older transformers: no config argument
            return DynamicCache()

    def _forward_last(self, ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Forward ``ids`` (1 × n) through the model on ``cache``; float32 logits of the last position."""
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if self._keep_kw:
            kwargs[self._keep_kw] = 1
        out = self._model(input_ids=ids, **kwargs)
        return out.logits[0, -1, : self._vocab_limit].float()

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """Sample up to ``params.max_tokens`` ids after ``prompt_ids`` on a KV cache, with their logprobs
        under the sampling distribution; stops after a stop token (stop strings are the proxy's). Raises
        :class:`PolicyError` for an empty prompt, bad parameters or a closed policy."""
        torch = _torch()
        if self._closed:
            raise PolicyError("this TransformersPolicy was closed; build a new one")
        if not prompt_ids:
            raise PolicyError("empty prompt: a prompt needs at least one token (the chat template's)")
        if params.top_p <= 0.0 or params.top_p > 1.0:
            raise PolicyError(f"top_p must be in (0, 1], got {params.top_p}")
        max_tokens = int(params.max_tokens)
        if self._max_positions:
            if len(prompt_ids) >= self._max_positions:
                raise PolicyError(f"prompt of {len(prompt_ids)} tokens does not fit the model's context of "
                                  f"{self._max_positions}; shorten the conversation or use a longer-context model")
            max_tokens = min(max_tokens, self._max_positions - len(prompt_ids))
        with self._lock, torch.inference_mode():
            version = self.version
            if max_tokens <= 0:
                return Generation([], [], "length", policy_version=version)
            generator = None
            if params.seed is not None:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(int(params.seed))
            cache = self._new_cache()
            ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
            logits = self._forward_last(ids, cache)
            token_ids: list[int] = []
            logprobs: list[float] = []
            finish = "length"
            while True:
                tok, lp = _sample_step(logits, float(params.temperature), float(params.top_p), generator)
                token_ids.append(tok)
                logprobs.append(lp)
                if tok in self.stop_token_ids:
                    finish = "stop"
                    break
                if len(token_ids) >= max_tokens:
                    break
                nxt = torch.tensor([[tok]], dtype=torch.long, device=self.device)
                logits = self._forward_last(nxt, cache)
        return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=finish, policy_version=version)

    # -- weight sync ---------------------------------------------------------------------------
    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> int:
        """Load a full (``strict``) or partial state dict in place; returns the new ``version``.

        Names and shapes are checked against the model first, so a bad state dict raises
        :class:`PolicyError` and leaves the weights (and ``version``) untouched.
        """
        state_dict = dict(state_dict)
        with self._lock:
            own = self._model.state_dict()
            unknown = sorted(set(state_dict) - set(own))
            if unknown:
                raise PolicyError(f"state dict has {len(unknown)} names the model lacks, e.g. {unknown[:3]}")
            if strict:
                missing = sorted(set(own) - set(state_dict))
                if missing:
                    raise PolicyError(f"state dict lacks {len(missing)} of the model's tensors, e.g. "
                                      f"{missing[:3]}; use update_weights for a partial update")
            bad = [k for k, v in state_dict.items() if tuple(getattr(v, "shape", ())) != tuple(own[k].shape)]
            if bad:
                raise PolicyError(f"shape mismatch for {bad[:3]}: got {tuple(state_dict[bad[0]].shape)}, "
                                  f"the model has {tuple(own[bad[0]].shape)}")
            try:
                self._model.load_state_dict(state_dict, strict=False)
            except RuntimeError as exc:  # pragma: no cover - checked above
                raise PolicyError(f"state dict does not fit the model: {exc}") from exc
            self.version += 1
            return self.version

    def update_weights(self, state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> int:
        """Weight sync from a trainer: a (possibly partial) mapping or ``(name, tensor)`` pairs.

        Tensors are copied into the live parameters (converted to their dtype and device). Unknown
        names raise :class:`PolicyError` before anything is changed. Returns the new ``version``.
        """
        pairs = state_dict.items() if isinstance(state_dict, Mapping) else state_dict
        return self.load_state_dict(dict(pairs), strict=False)

    def close(self) -> None:
        """Refuse further calls (the model itself stays with whoever holds it); idempotent."""
        with self._lock:
            self._closed = True
