"""Per-token logprobs of a packed call tree, with the LM head applied in chunks.

``token_logprobs(model, packed)`` runs the model's base (``model.model``) ONCE over the packed
sequence with the tree mask and the path positions, then scores each token from the hidden state
of its predecessor (see :mod:`trainers.batch.packing`). Logits for the whole sequence ([T, vocab], 151k
columns for Qwen3) are never materialised: the head is applied to ``chunk_size`` rows at a time,
``log_softmax`` runs in float32, and only the target's logprob (and optionally the entropy) is kept.

Two autograd modes (``recompute``):

* ``True`` (default): a custom ``autograd.Function`` saves only the chunk inputs (hidden rows and
  targets; the head weight is the live parameter) and recomputes each chunk's logits in backward.
  Peak extra memory is one chunk of logits in forward and in backward, whatever T is.
* ``False``: a plain loop over chunks whose graphs autograd keeps; forward is as cheap but backward
  holds every chunk's float32 log-softmax (T × vocab × 4 bytes) — the reference implementation.

Invariants: the returned logprob of token ``i`` is ``log_softmax(head(h[predecessor[i]]) /
temperature)[input_ids[i]]`` restricted to the first ``vocab_limit`` logits (the policy samples only
real tokenizer ids, so the padding rows of the embedding are excluded when ``vocab_limit`` is set);
tokens not requested (``mask``) or without a predecessor get 0.0 and no gradient.

Mask forms (transformers 5.x passes a 4-D ``attention_mask`` to the attention function unchanged):
``sdpa`` takes a bool [1, 1, T, T] (True = attend) or an additive float mask (the default here: sdpa
turns a bool mask into an additive one anyway, so the bool form costs 1 + 4 bytes per entry instead of
4, measured on CPU); ``eager`` only an additive one (it adds the mask to the scores, so a bool mask
would silently mask nothing, and it materialises [heads, T, T] probabilities); ``flex_attention``
a ``BlockMask`` (forward only on CPU in torch 2.13: no backward there). ``flash_attention_*`` cannot
take a tree mask. A pack that is a single chain (one linear episode) needs no mask at all: it runs
with the model's own causal kernels.

Forward forms (``mask_form`` of :func:`packed_hidden_states`): the mask forms above (one forward
with a dense [T, T] mask, or a block mask), ``"causal"`` (a chain, no mask) and ``"prefix_cache"``
(no T x T mask at all: one forward per tree segment, reusing its ancestors' keys/values; see
:func:`prefix_cache_hidden_states`). ``"auto"`` picks ``causal`` for a chain, ``prefix_cache`` for a
branched pack under ``sdpa``/``eager`` (a dense mask there costs T² memory and time: on a captured
group of 4 Claude Code episodes, CPU, the step took 12.9 s and 2.9 GB with it, 5.2 s and 1.5 GB with
``prefix_cache``; ``bench/bench_train_step.py``) and ``block`` under ``flex_attention``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from clawgym_env.errors import ConfigError, PolicyError
from trainers.batch.packing import PackedTree

# sdpa converts a bool mask to an additive one internally (keeping both), so additive is leaner there too
AUTO_FORMS = {"sdpa": "additive", "eager": "additive", "flex_attention": "block"}


def mask_form_for(model) -> str:
    """The tree-mask form the model's attention implementation takes (see the module docstring)."""
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in AUTO_FORMS:
        raise ConfigError(f"attention implementation {impl!r} cannot take a tree mask; load the model with "
                          "attn_implementation='sdpa' (or 'eager' / 'flex_attention')")
    return AUTO_FORMS[impl]


PREFIX_CACHE_IMPLS = ("sdpa", "eager")


def _base(model):
    """The base model (trunk under the LM head) of a causal LM, or ``model`` itself when it is a trunk."""
    base = getattr(model, "model", None)
    if isinstance(base, torch.nn.Module):
        return base
    if hasattr(model, "embed_tokens") and hasattr(model, "layers"):
        return model
    return model.get_decoder()


def _base_and_head(model):
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.lm_head
    if head is None:
        raise PolicyError(f"{type(model).__name__} has no output embeddings (LM head) to score tokens with")
    return _base(model), head


def _checkpointing(base) -> bool:
    """True when transformers' gradient checkpointing would drop a KV cache in this forward."""
    on = getattr(base, "is_activation_checkpointing", None)  # transformers 5.x name
    if on is None:
        on = getattr(base, "is_gradient_checkpointing", False)
    return bool(on) and base.training and torch.is_grad_enabled()


def forward_form(model, packed: PackedTree, mask_form: str = "auto") -> str:
    """The forward form ``mask_form="auto"`` resolves to for ``packed`` (see the module docstring).

    Under transformers' gradient checkpointing (training, grad enabled) a layer drops any KV cache it
    is given, so a branched pack falls back to the dense mask there.
    """
    if mask_form != "auto":
        return mask_form
    if packed.is_chain:
        return "causal"
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl in PREFIX_CACHE_IMPLS and not _checkpointing(_base(model)):
        return "prefix_cache"
    return mask_form_for(model)


def packed_hidden_states(model, packed: PackedTree, mask_form: str = "auto") -> torch.Tensor:
    """[T, hidden] last hidden states of the base model over the packed sequence, in packed order.

    ``model`` is a causal LM or its trunk. ``mask_form``: ``"auto"`` (:func:`forward_form`),
    ``"causal"`` (plain causal, only valid for a chain), ``"prefix_cache"``
    (:func:`prefix_cache_hidden_states`), or a dense/block mask form of
    :meth:`PackedTree.attention_mask` (``"bool"``, ``"additive"``, ``"block"``: one forward with the
    tree mask). Every form gives the same hidden states up to float error.
    """
    base = _base(model)
    form = forward_form(model, packed, mask_form)
    if form == "prefix_cache":
        return prefix_cache_hidden_states(base, packed)
    if form == "causal":
        if not packed.is_chain:
            raise ConfigError("mask_form='causal' is only valid for a pack that is one chain; use 'auto'")
        mask = None
    else:
        mask = packed.attention_mask(form, dtype=next(model.parameters()).dtype)
    out = base(input_ids=packed.input_ids[None], position_ids=packed.position_ids[None],
               attention_mask=mask, use_cache=False)
    return out.last_hidden_state[0]


def forward_segments(packed: PackedTree) -> list[tuple[int, int, int]]:
    """``(first token, end token, parent segment or -1)`` of each forward :func:`prefix_cache_hidden_states`
    runs: packed nodes in packed order, a node that is its parent's only child merged into its parent's
    segment (it directly follows it in preorder), so only branch points split a forward."""
    offs, parents = packed.node_offsets.tolist(), packed.node_parent.tolist()
    n_children = [0] * len(parents)
    for par in parents:
        if par >= 0:
            n_children[par] += 1
    segs: list[list[int]] = []
    seg_of = [0] * len(parents)
    last = -1
    for n, par in enumerate(parents):
        if par >= 0 and n_children[par] == 1 and par == last:
            segs[-1][1] = offs[n + 1]
        else:
            segs.append([offs[n], offs[n + 1], seg_of[par] if par >= 0 else -1])
        seg_of[n], last = len(segs) - 1, n
    return [(a, b, c) for a, b, c in segs]


def prefix_cache_hidden_states(base, packed: PackedTree) -> torch.Tensor:
    """[T, hidden] hidden states of the trunk ``base`` over ``packed`` without a T x T mask.

    Segments (:func:`forward_segments`: packed nodes, runs of only children merged) run one after the
    other in packed order, a parent always before its children. A segment runs its own tokens with
    ``position_ids`` = their packed path positions and a ``DynamicCache`` pre-filled, per layer, with
    the concatenated keys/values of its ancestors (root first), so its attention is plain causal over
    [ancestors' tokens + its own] — exactly the rows the tree mask lets its tokens see. Invariants:

    * the result equals the dense-mask forward (and a causal forward over any root-to-leaf path) up to
      float error: a segment's first position equals the number of its ancestors' tokens, so the
      cache's causal offsets and the rotary positions agree (checked; a mismatch raises);
    * only each segment's OWN keys/values are kept (one slice per segment and layer, no cumulative
      copies), and only while the segment is on the path being walked (a stack); the concatenation of
      the ancestors is built per segment and dropped after its forward unless autograd saved it for
      backward (the attention of a segment saves its [ancestors + own] keys/values, as any cache does);
    * nothing is detached: gradients of a child's loss flow through the cached keys/values back into
      its ancestors' tokens and the parameters, as in the one-forward tree mask;
    * a root (several trees in one pack, or a second root of one tree) starts with an empty cache.

    Needs an attention implementation that takes a KV cache with plain causal masking (``sdpa``,
    ``eager``) and no gradient checkpointing (transformers drops the cache there).
    """
    from transformers import DynamicCache

    if _checkpointing(base):
        raise ConfigError("mask_form='prefix_cache' cannot run under gradient checkpointing (transformers "
                          "drops the KV cache); use a dense mask form or disable checkpointing")
    # transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name is deprecated)
    cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    ids, pos = packed.input_ids[None], packed.position_ids[None]
    stack: list[tuple[int, int, list[torch.Tensor], list[torch.Tensor]]] = []  # (segment, tokens, keys, values)
    outs = []
    for seg, (start, end, parent) in enumerate(forward_segments(packed)):
        while stack and stack[-1][0] != parent:
            stack.pop()  # its subtree is done (packed order is preorder)
        if parent >= 0 and not stack:
            raise ConfigError(f"segment {seg}'s parent {parent} is not on the current path; packed order is broken")
        past = sum(s[1] for s in stack)
        if int(pos[0, start]) != past:
            raise ConfigError(f"packed token {start} is at position {int(pos[0, start])} but has {past} ancestor "
                              "tokens; the pack's positions are not path positions")
        cache = DynamicCache()
        for layer in range(len(stack[0][2]) if stack else 0):
            cache.update(torch.cat([s[2][layer] for s in stack], dim=-2),
                         torch.cat([s[3][layer] for s in stack], dim=-2), layer)
        out = base(input_ids=ids[:, start:end], position_ids=pos[:, start:end], use_cache=True, **{cache_kw: cache})
        outs.append(out.last_hidden_state[0])
        keys, values = [], []
        for cache_layer in cache.layers:
            layer_kv: Any = cache_layer  # a DynamicCache layer (keys/values tensors); transformers types it as a union
            k, v = layer_kv.keys[..., past:, :], layer_kv.values[..., past:, :]
            if past and not torch.is_grad_enabled():  # a view would pin the whole concatenation
                k, v = k.clone(), v.clone()
            keys.append(k)
            values.append(v)
        del cache, out
        stack.append((seg, end - start, keys, values))
    return torch.cat(outs)


def _tempered_logits(h, weight, bias, temperature: float, vocab_limit: int):
    """``(h @ W[:V].T + b[:V]) / temperature`` in fp32 or wider: a fresh buffer the caller may overwrite."""
    logits = h @ weight[:vocab_limit].t()
    if bias is not None:
        logits = logits + bias[:vocab_limit]
    wide = torch.promote_types(logits.dtype, torch.float32)
    z = logits if logits.dtype == wide else logits.to(wide)
    return z.div_(temperature) if temperature != 1.0 else z


def _chunk_stats(h, weight, bias, targets, temperature: float, vocab_limit: int, want_entropy: bool):
    """(logp of targets, entropy or None) of one chunk with a plain autograd graph (``recompute=False``)."""
    logits = h @ weight[:vocab_limit].t()
    if bias is not None:
        logits = logits + bias[:vocab_limit]
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(1, targets[:, None])[:, 0]
    ent = -(logp_all.exp() * logp_all).sum(-1) if want_entropy else None
    return logp, ent


def _lean_forward(h, weight, bias, targets, temperature: float, vocab_limit: int, want_entropy: bool):
    """No-grad (logp, entropy or None) of one chunk with at most two [chunk, V] buffers alive."""
    z = _tempered_logits(h, weight, bias, temperature, vocab_limit)
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(1, targets[:, None])[:, 0] - lse
    if not want_entropy:
        return logp, None
    p = (z - lse[:, None]).exp_()
    return logp, lse - torch.einsum("ij,ij->i", p, z)


class _ChunkedLogprob(torch.autograd.Function):
    """Target logprobs (and entropies) of rows ``h`` under ``head``; logits recomputed in backward."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, chunk: int, temperature: float, vocab_limit: int,
                want_entropy: bool):
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not zeros
        logps, ents = [], []
        with torch.no_grad():
            for s in range(0, h.shape[0], chunk):
                lp, ent = _lean_forward(h[s:s + chunk], weight, bias, targets[s:s + chunk], temperature,
                                        vocab_limit, want_entropy)
                logps.append(lp)
                ents.append(ent if want_entropy else torch.zeros_like(lp))
        ctx.save_for_backward(h, weight, bias, targets)
        ctx.cfg = (chunk, temperature, vocab_limit)
        empty = h.new_zeros((0,), dtype=torch.promote_types(h.dtype, torch.float32))
        return (torch.cat(logps) if logps else empty), (torch.cat(ents) if ents else empty)

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        h, weight, bias, targets = ctx.saved_tensors
        chunk, temperature, vocab_limit = ctx.cfg
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(h) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if (need_b and bias is not None) else None
        if g_logp is None and g_ent is None:
            return grad_h, grad_w, grad_b, None, None, None, None, None
        w = weight[:vocab_limit]
        for s in range(0, h.shape[0], chunk):
            hc, tc = h[s:s + chunk], targets[s:s + chunk]
            with torch.no_grad():
                z = _tempered_logits(hc, weight, bias, temperature, vocab_limit)
                lse = torch.logsumexp(z, dim=-1, keepdim=True)
                g = (g_logp[s:s + chunk] if g_logp is not None else torch.zeros_like(lse[:, 0])).to(z.dtype)
                # dlogp_t/dz = onehot(t) - p ;  dH/dz = -p * (z - E_p[z])  (z: tempered logits)
                if g_ent is None:
                    dz = z.sub_(lse).exp_().mul_(-g[:, None])  # z's buffer becomes -g p
                else:
                    p = (z - lse).exp_()
                    ez = torch.einsum("ij,ij->i", p, z)
                    ge = g_ent[s:s + chunk].to(z.dtype)
                    z.sub_(ez[:, None]).mul_(ge[:, None]).add_(g[:, None])  # g + g_ent (z - E[z])
                    dz = p.mul_(z).neg_()
                    del z
                dz.scatter_add_(1, tc[:, None], g[:, None])
                if temperature != 1.0:
                    dz.div_(temperature)
                dlogits = dz.to(w.dtype)
                if grad_h is not None:
                    grad_h[s:s + chunk] = dlogits @ w
                if grad_w is not None:
                    grad_w[:vocab_limit] += dlogits.t() @ hc
                if grad_b is not None:
                    grad_b[:vocab_limit] += dlogits.sum(0).to(grad_b.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None


def chunked_logprobs(hidden: torch.Tensor, head, targets: torch.Tensor, chunk_size: int = 1024,
                     temperature: float = 1.0, vocab_limit: int | None = None, return_entropy: bool = False,
                     recompute: bool = True):
    """Logprobs of ``targets`` [n] given the rows ``hidden`` [n, H] under ``head`` (an ``nn.Linear``).

    Returns a float32 tensor [n] (float64 for a float64 model), and the entropies [n] with
    ``return_entropy``; differentiable w.r.t. ``hidden`` and the head's parameters (see the module
    docstring for ``recompute``).
    """
    if chunk_size <= 0:
        raise ConfigError(f"chunk_size must be positive, got {chunk_size}")
    if temperature <= 0:
        raise ConfigError(f"temperature must be positive to score tokens, got {temperature}")
    weight, bias = head.weight, getattr(head, "bias", None)
    limit = int(weight.shape[0]) if vocab_limit is None else min(int(vocab_limit), int(weight.shape[0]))
    if targets.numel() and int(targets.max()) >= limit:
        raise ConfigError(f"target id {int(targets.max())} is outside the scored vocabulary of {limit} ids")
    if recompute:
        logp, ent = _ChunkedLogprob.apply(hidden, weight, bias, targets, int(chunk_size), float(temperature), limit,
                                         bool(return_entropy))
        return (logp, ent) if return_entropy else logp
    logps, ents = [], []
    for s in range(0, hidden.shape[0], chunk_size):
        lp, ent = _chunk_stats(hidden[s:s + chunk_size], weight, bias, targets[s:s + chunk_size],
                               float(temperature), limit, return_entropy)
        logps.append(lp)
        ents.append(ent)
    empty = hidden.new_zeros((0,), dtype=torch.promote_types(hidden.dtype, torch.float32))
    logp = torch.cat(logps) if logps else empty
    if return_entropy:
        return logp, (torch.cat(ents) if ents else empty)
    return logp


def token_logprobs(model, packed: PackedTree, chunk_size: int = 1024, *, mask: torch.Tensor | None = None,
                   temperature: float = 1.0, vocab_limit: int | None = None, return_entropy: bool = False,
                   recompute: bool = True, mask_form: str = "auto"):
    """Per-token logprobs [T] of the packed sequence (float32, or float64 for a float64 model; 0.0 where
    not scored).

    ``mask`` [T] bool selects the tokens to score (default: every token with a predecessor; pass
    ``packed.target_mask`` to score only sampled tokens, which skips the head on context tokens).
    With ``return_entropy`` returns ``(logprobs, entropies)``, both [T]. Gradients flow into the
    model when it is in a grad-enabled context.
    """
    hidden = packed_hidden_states(model, packed, mask_form)
    _, head = _base_and_head(model)
    want = packed.predecessor >= 0
    if mask is not None:
        want = want & mask.to(want.device)
    idx = want.nonzero()[:, 0]
    rows = hidden[packed.predecessor[idx]]
    res = chunked_logprobs(rows, head, packed.input_ids[idx], chunk_size, temperature, vocab_limit,
                           return_entropy, recompute)
    lp, ent = res if return_entropy else (res, None)
    full = torch.zeros(packed.num_tokens, dtype=lp.dtype, device=hidden.device).index_put((idx,), lp)
    if not return_entropy:
        return full
    assert ent is not None  # return_entropy
    full_ent = torch.zeros(packed.num_tokens, dtype=ent.dtype, device=hidden.device).index_put((idx,), ent)
    return full, full_ent
