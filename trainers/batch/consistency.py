"""Train/rollout consistency: recompute sampled tokens' logprobs with the training model and compare.

A policy samples with one stack (KV cache, serving kernels, maybe another dtype) and a trainer scores
with another (one packed forward). Both must agree for on-policy RL to be on-policy; where they do
not, truncated importance sampling corrects the gradient. For a batch of call trees
:func:`consistency_report` packs the trees (:mod:`trainers.batch.packing`), recomputes the logprob of every
sampled token that has a rollout logprob (:func:`trainers.batch.logprobs.token_logprobs`, no gradient) and
reports, per token, ``log_ratio = logp_train - logp_rollout`` and the truncated importance weight
``w = min(exp(log_ratio), clip)``.

Invariants of :class:`ConsistencyReport`:

* ``compared[k]`` (per pack, [T] bool) = sampled tokens with a predecessor and a recorded rollout
  logprob; ``log_ratio[k]`` is 0.0 and ``weights[k]`` 1.0 on every other token, so a trainer can
  multiply its own masked per-token loss by ``weights[k]`` directly;
* the scalar statistics are over the compared tokens of all packs together; ``quantiles`` are of the
  signed log ratio, ``share_beyond`` is the share with ``|log_ratio| > threshold``, ``share_clipped``
  the share with ``exp(log_ratio) > clip`` (weight truncated to ``clip``);
* ``inexact_call_share`` is the share of captured calls recorded as not token-exact (a turn of their
  history was re-rendered from text: the tree's ``meta.inexact_calls``); ``inexact_token_share``
  the share of compared tokens lying only on such calls' paths (every call through their node is
  inexact), i.e. training signal that exists only because of re-rendered context.

Logprobs are only comparable when the trainer scores with the sampling distribution: pass the
rollout ``temperature``; top-p/top-k truncation is not reproduced (those tokens show as drift), and
``vocab_limit`` must match the policy's (``len(tokenizer)`` for :class:`TransformersPolicy`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from clawgym_env.capture.tree import CallTree
from clawgym_env.errors import ConfigError
from clawgym_env.jsontypes import JSONObject
from trainers.batch.logprobs import token_logprobs
from trainers.batch.packing import PackedTree, pack_batch, scorable_mask, trainable_mask

DEFAULT_QUANTILES = (0.0, 0.01, 0.05, 0.5, 0.95, 0.99, 1.0)


@dataclasses.dataclass
class ConsistencyReport:
    """Per-token tensors (one entry per pack, aligned to the pack's tokens) and summary statistics."""

    packs: list[PackedTree]
    train_logprobs: list[torch.Tensor]   # [T] recomputed logprobs (0.0 where not scored)
    log_ratio: list[torch.Tensor]        # [T] train - rollout on compared tokens, 0.0 elsewhere
    weights: list[torch.Tensor]          # [T] min(exp(log_ratio), clip) on compared tokens, 1.0 elsewhere
    compared: list[torch.Tensor]         # [T] bool
    clip: float
    threshold: float
    num_trees: int
    num_calls: int
    inexact_calls: int
    sampled_tokens: int
    compared_tokens: int
    inexact_tokens: int
    mean: float
    std: float
    max_abs: float
    quantiles: dict[str, float]
    share_beyond: float
    share_clipped: float
    mean_weight: float

    @property
    def inexact_call_share(self) -> float:
        """Share of the captured calls recorded as not token-exact."""
        return self.inexact_calls / self.num_calls if self.num_calls else 0.0

    @property
    def inexact_token_share(self) -> float:
        """Share of the compared tokens that lie only on inexact calls."""
        return self.inexact_tokens / self.compared_tokens if self.compared_tokens else 0.0

    def flat_log_ratio(self) -> torch.Tensor:
        """Log ratios of the compared tokens of all packs, pack by pack in packed order."""
        return torch.cat([lr[m] for lr, m in zip(self.log_ratio, self.compared)])

    def flat_weights(self) -> torch.Tensor:
        """Truncated importance weights of the compared tokens, aligned with :meth:`flat_log_ratio`."""
        return torch.cat([w[m] for w, m in zip(self.weights, self.compared)])

    def as_dict(self) -> JSONObject:
        """The scalar statistics (JSON-ready)."""
        keys = ("clip", "threshold", "num_trees", "num_calls", "inexact_calls", "sampled_tokens", "compared_tokens",
                "inexact_tokens", "mean", "std", "max_abs", "share_beyond", "share_clipped", "mean_weight")
        out: JSONObject = {k: getattr(self, k) for k in keys}
        out["quantiles"] = dict(self.quantiles)
        out["inexact_call_share"] = self.inexact_call_share
        out["inexact_token_share"] = self.inexact_token_share
        out["num_packs"] = len(self.packs)
        return out


def report_from_logprobs(packs: Sequence[PackedTree], train_logprobs: Sequence[torch.Tensor], *, clip: float = 2.0,
                         threshold: float = 0.1, quantiles: Sequence[float] = DEFAULT_QUANTILES) -> ConsistencyReport:
    """Build the report from logprobs a trainer already computed (one [T] tensor per pack)."""
    if clip <= 0:
        raise ConfigError(f"clip must be positive, got {clip}")
    if len(packs) != len(train_logprobs):
        raise ConfigError(f"{len(packs)} packs but {len(train_logprobs)} logprob tensors")
    ratios, weights, masks, flat, inexact_flags = [], [], [], [], []
    num_calls = inexact_calls = sampled = 0
    n_trees = 0
    for pack, lp in zip(packs, train_logprobs):
        if lp.shape != (pack.num_tokens,):
            raise ConfigError(f"logprobs of shape {tuple(lp.shape)} do not fit a pack of {pack.num_tokens} tokens")
        lp = lp.detach().to(torch.float64)
        m = scorable_mask(pack)
        lr = torch.where(m, lp - pack.rollout_logprobs.to(torch.float64), torch.zeros_like(lp))
        w = torch.where(m, torch.clamp(torch.exp(lr), max=clip), torch.ones_like(lr))
        ratios.append(lr.float())
        weights.append(w.float())
        masks.append(m)
        flat.append(lr[m])
        sampled += int(pack.sampled.sum())
        for tree in pack.trees:
            n_trees += 1
            num_calls += tree.meta.calls_in(len(tree.call_leaf))
            inexact_calls += len(set(tree.meta.inexact_calls))
        inexact_flags.append(~trainable_mask(pack)[m])  # compared, but not trainable: only on inexact calls
    x = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.float64)
    n = int(x.numel())
    qs = {f"q{q:g}": (float(torch.quantile(x, q)) if n else math.nan) for q in quantiles}
    clipped = torch.exp(x) > clip
    return ConsistencyReport(
        packs=list(packs), train_logprobs=[lp.detach() for lp in train_logprobs], log_ratio=ratios,
        weights=weights, compared=masks, clip=float(clip), threshold=float(threshold), num_trees=n_trees,
        num_calls=num_calls, inexact_calls=inexact_calls, sampled_tokens=sampled, compared_tokens=n,
        inexact_tokens=int(torch.cat(inexact_flags).sum()) if inexact_flags else 0,
        mean=float(x.mean()) if n else math.nan, std=float(x.std(unbiased=False)) if n else math.nan,
        max_abs=float(x.abs().max()) if n else math.nan, quantiles=qs,
        share_beyond=float((x.abs() > threshold).double().mean()) if n else 0.0,
        share_clipped=float(clipped.double().mean()) if n else 0.0,
        mean_weight=float(torch.clamp(torch.exp(x), max=clip).mean()) if n else math.nan)


def consistency_report(model, trees: CallTree | Sequence[CallTree], *, clip: float = 2.0, threshold: float = 0.1,
                       temperature: float = 1.0, vocab_limit: int | None = None, chunk_size: int = 1024,
                       max_tokens: int | None = None, quantiles: Sequence[float] = DEFAULT_QUANTILES,
                       packs: Sequence[PackedTree] | None = None) -> ConsistencyReport:
    """Recompute sampled tokens' logprobs of ``trees`` with ``model`` and compare them to the rollout's.

    Trees are packed with :func:`pack_batch` (``max_tokens`` per pack; ``packs`` reuses packs already
    built). Runs without gradient on the model's device; put the model in eval mode first.
    """
    if packs is None:
        device = next(model.parameters()).device
        packs = pack_batch([trees] if isinstance(trees, CallTree) else list(trees), max_tokens=max_tokens,
                           device=device)
    lps = []
    with torch.no_grad():
        for pack in packs:
            lps.append(token_logprobs(model, pack, chunk_size, mask=scorable_mask(pack),
                                      temperature=temperature, vocab_limit=vocab_limit))
    return report_from_logprobs(packs, lps, clip=clip, threshold=threshold, quantiles=quantiles)
