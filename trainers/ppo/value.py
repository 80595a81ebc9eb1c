"""The critic for PPO over call trees: a value head evaluated on the PACKED tree.

A :class:`Critic` is a value head (``Linear(hidden, 1)``) on top of a trunk, in one of two layouts:

* ``shared`` (:meth:`Critic.on_policy`): the head sits on the policy's own trunk. The critic does not
  own the trunk (it is not one of its submodules, so it is neither in its ``state_dict`` nor in its
  ``parameters()``); callers pass the policy's packed hidden states, which the policy forward already
  computed for the logprobs — one trunk forward serves both.
* ``separate`` (:meth:`Critic.separate`): the critic owns a second Qwen3-family trunk (by default a
  copy of the policy's, so it starts from the policy's weights) and runs its own packed forward;
* ``lora`` (:meth:`Critic.lora`): the critic's trunk is the policy's FROZEN base under the critic's own LoRA
  adapters (:mod:`trainers.ppo.critic_trunk`): in one process the base tensors are the policy's own (no copy),
  under a process group a frozen copy sharded as the critic's FSDP root (1/N per rank); it runs its own forward;
* ``head`` (:meth:`Critic.on_policy` with ``detach=True``): a head on the policy's hidden states, detached, so
  the value loss trains the head alone and never reaches the policy's trunk or adapters.

Which fits where. A full fine-tune: ``separate`` (the paper's critic; twice the trainable weights) or
``shared`` (the value loss also trains the policy's trunk). Under LoRA: ``lora`` (the value model has a trunk of
its own to adapt, for the cost of a second set of adapters and a second forward) or ``head`` (nothing but
``Linear(hidden, 1)``; its features are the policy's, which drift as the policy trains). ``shared`` under LoRA
trains the policy's adapters with the value loss too; ``separate`` under LoRA is a full trainable copy of the
trunk (weights, gradients and AdamW's moments: 4 × the trunk's bytes, ~65 GB for an 8B model in bf16), which
:meth:`Critic.for_policy` warns about.

Where a value is read. The value of the state before sampled token ``t`` — the state from which
``t`` was sampled — is ``head(h[predecessor[t]])``: the hidden state at ``t``'s predecessor index
(:mod:`trainers.batch.packing`), exactly the row whose logits score ``t``. That hidden state encodes the
whole prefix before ``t`` and nothing after it, so it IS that state.

Invariants:

* the trunk runs once over the packed sequence, so a token on a node shared by several paths gets
  one hidden state, and every path through it reads the same value from the same row; the head is
  applied once per distinct predecessor row (children of one node share their parent's last row);
* :func:`packed_values` returns a float32 [T] tensor: the value before token ``i`` where ``mask[i]``
  and ``i`` has a predecessor, 0.0 (and no gradient) elsewhere;
* a value is a function of the token's path prefix only: it equals the value read at the same token
  of an ordinary causal forward over any root-to-leaf path through it (up to float error).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clawgym_env.errors import ConfigError, PolicyError
from trainers.batch.logprobs import packed_hidden_states
from trainers.batch.packing import PackedTree

CRITIC_KINDS = ("separate", "shared", "lora", "head")


class ValueHead(nn.Module):
    """``Linear(hidden, 1)`` kept in float32 whatever the trunk's dtype; returns [n] values."""

    def __init__(self, hidden_size: int, init_std: float | None = None, seed: int = 0) -> None:
        super().__init__()
        self.linear = nn.Linear(int(hidden_size), 1, dtype=torch.float32)
        std = (1.0 / hidden_size) if init_std is None else float(init_std)
        with torch.random.fork_rng(devices=[]), torch.no_grad():  # leave the global RNG untouched
            torch.manual_seed(int(seed))
            self.linear.weight.normal_(0.0, std)
            self.linear.bias.zero_()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Values of ``hidden`` rows ([..., hidden] → [...], float32)."""
        return self.linear(hidden.to(self.linear.weight.dtype))[..., 0]


def _trunk_of(model):
    """The base model (the trunk under the LM head) of a causal LM, or ``model`` itself if it is one."""
    base = getattr(model, "model", None)
    if isinstance(base, nn.Module):
        return base
    if hasattr(model, "embed_tokens") and hasattr(model, "layers"):
        return model
    raise PolicyError(f"{type(model).__name__} has no trunk (.model) to put a value head on")


class Critic(nn.Module):
    """A value head on the policy's trunk (``shared``, ``head``) or on a trunk of its own (``separate``, ``lora``)."""

    def __init__(self, head: ValueHead, trunk: nn.Module | None = None, *, kind: str | None = None) -> None:
        super().__init__()
        self.head = head
        self.trunk = trunk  # None when the critic reads the policy's hidden states: that trunk is never registered
        kind = kind or ("shared" if trunk is None else "separate")
        if kind not in CRITIC_KINDS or (trunk is None) != (kind in ("shared", "head")):
            raise ConfigError(f"critic kind {kind!r} does not fit a critic {'without' if trunk is None else 'with'} "
                              f"a trunk of its own (kinds: {CRITIC_KINDS})")
        self._kind = kind

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def on_policy(cls, policy_model, init_std: float | None = None, seed: int = 0, *, detach: bool = False) -> Critic:
        """A head on ``policy_model``'s trunk (float32 head, on the policy's device); ``detach``: the ``head``
        kind, whose value loss never reaches the trunk."""
        trunk = _trunk_of(policy_model)
        device = next(trunk.parameters()).device
        return cls(ValueHead(policy_model.config.hidden_size, init_std, seed).to(device),
                   kind="head" if detach else "shared")

    @classmethod
    def lora(cls, policy_causal_lm, *, rank: int, alpha: float, dropout: float = 0.0, targets=(), seed: int = 0,
             init_std: float | None = None, share: bool = True) -> Critic:
        """The ``lora`` kind: ``policy_causal_lm``'s base weights, frozen (the same tensors when ``share``, else
        copies), under LoRA adapters of the critic's own (:mod:`trainers.ppo.critic_trunk`), and a value head."""
        from trainers.ppo.critic_trunk import add_adapters, base_trunk

        trunk = base_trunk(policy_causal_lm, share=share)
        add_adapters(trunk, rank=rank, alpha=alpha, dropout=dropout, targets=list(targets), seed=seed)
        device = next(trunk.parameters()).device
        return cls(ValueHead(trunk.config.hidden_size, init_std, seed).to(device), trunk, kind="lora")

    @classmethod
    def separate(cls, source, init_std: float | None = None, seed: int = 0, dtype=None,
                 copy_trunk: bool = True) -> Critic:
        """A critic with its own trunk: ``source`` is a causal LM (its trunk is deep-copied, so the
        critic starts from the policy's weights and never shares a tensor with it; ``copy_trunk=False``
        takes the trunk of a model the caller hands over, e.g. a fresh merged copy of the policy) or a
        model directory (any Qwen3-family checkpoint; its trunk is loaded with sdpa attention)."""
        if isinstance(source, (str, Path)):
            from transformers import AutoModel

            path = Path(source).expanduser()
            if not (path / "config.json").exists():
                raise ConfigError(f"value model {path} is not a model directory (no config.json)")
            kw = {"dtype": dtype} if dtype is not None else {}
            try:
                loaded = AutoModel.from_pretrained(str(path), attn_implementation="sdpa", **kw)
            except Exception as exc:
                raise PolicyError(f"could not load a value model trunk from {path}: {exc}") from exc
            trunk = _trunk_of(loaded) if not hasattr(loaded, "embed_tokens") else loaded
        else:
            trunk = copy.deepcopy(_trunk_of(source)) if copy_trunk else _trunk_of(source)
        trunk.requires_grad_(True)
        device = next(trunk.parameters()).device
        return cls(ValueHead(trunk.config.hidden_size, init_std, seed).to(device), trunk)

    @classmethod
    def for_policy(cls, policy, kind: str = "separate", value_model: str | None = None,
                   init_std: float | None = None, seed: int = 0, *, lora_rank: int = 0) -> Critic:
        """The critic of a :class:`trainers.policy.TrainablePolicy`: ``shared``/``head`` put the head on its trunk
        (``head`` detached); ``lora`` adapts the policy's frozen base with adapters of its own (rank ``lora_rank``,
        0: the policy's; alpha, dropout and targets: the policy's), sharing the base tensors in one process and a
        frozen copy under a process group (a full fine-tune: always a frozen copy of the start weights);
        ``separate`` starts from ``value_model`` (a model directory) or else from a merged, plain copy of the
        policy (LoRA deltas included) taken over as the value trunk (under LoRA: a warning naming its memory)."""
        if kind in ("shared", "head"):
            return cls.on_policy(policy.causal_lm, init_std, seed, detach=kind == "head")
        if kind not in CRITIC_KINDS:
            raise ConfigError(f"critic kind must be one of {CRITIC_KINDS}, got {kind!r}")
        if kind == "lora":
            import torch.distributed as dist

            pc = policy.config
            one_process = not (dist.is_available() and dist.is_initialized())
            critic = cls.lora(policy.causal_lm, rank=lora_rank or pc.lora_rank, alpha=pc.lora_alpha,
                              dropout=pc.lora_dropout, targets=pc.lora_targets, seed=seed, init_std=init_std,
                              share=policy.lora and one_process)
        elif value_model:
            critic = cls.separate(value_model, init_std, seed).to(policy.device)
        else:
            critic = cls.separate(policy.serving_copy(), init_std, seed, copy_trunk=False)
        if kind == "separate" and policy.lora:
            from trainers.ppo.critic_trunk import full_copy_bytes

            gib = full_copy_bytes(critic.trunk) / 2**30
            warnings.warn(f"critic: separate under LoRA trains a full copy of the trunk: {gib:.1f} GiB of weights, "
                          "gradients and AdamW moments (before FSDP sharding), next to a policy that trains only "
                          "adapters; critic: lora (own adapters on the frozen base) or critic: head (a value head "
                          "on the detached policy hidden states) fit one GPU", stacklevel=2)
        trunk: Any = critic.trunk  # a transformers model (dynamically typed)
        if policy.config.gradient_checkpointing:  # the critic's own trunk trains under the same memory plan
            trunk.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return critic

    @property
    def kind(self) -> str:
        """``shared``/``head`` (a head on the policy's hidden states, ``head`` detached) or ``separate``/``lora``
        (a trunk of its own: trainable, or the frozen base under the critic's adapters)."""
        return self._kind

    # -- evaluation -----------------------------------------------------------------------------
    def values_from_hidden(self, hidden: torch.Tensor, packed: PackedTree,
                           mask: torch.Tensor | None = None) -> torch.Tensor:
        """[T] values read at predecessor rows of ``hidden`` (see the module invariants); a ``head`` critic
        detaches ``hidden`` first, so no gradient reaches the trunk that computed it."""
        if self._kind == "head":
            hidden = hidden.detach()
        want = packed.predecessor >= 0
        if mask is not None:
            want = want & mask.to(want.device)
        idx = want.nonzero()[:, 0]
        rows = packed.predecessor[idx]
        uniq, inverse = torch.unique(rows, return_inverse=True)  # one head row per distinct state
        v = self.head(hidden[uniq])[inverse]
        return torch.zeros(packed.num_tokens, dtype=v.dtype, device=v.device).index_put((idx,), v)

    def forward(self, packed: PackedTree, hidden: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, mask_form: str = "auto") -> torch.Tensor:
        """[T] values. A ``shared``/``head`` critic needs ``hidden`` (the policy's packed hidden states); one with
        a trunk of its own runs it (``hidden`` must then be None)."""
        if self.trunk is None:
            if hidden is None:
                raise ConfigError(f"a {self._kind} critic reads the policy's hidden states: pass hidden=")
        else:
            if hidden is not None:
                raise ConfigError(f"a {self._kind} critic runs its own trunk; do not pass the policy's hidden states")
            hidden = packed_hidden_states(self.trunk, packed, mask_form)
        return self.values_from_hidden(hidden, packed, mask)


class ActorCritic:
    """What a PPO checkpoint stores as its model (:mod:`trainers.scale.checkpoint` duck-types it): the policy's
    tensors under their own names, the critic's under ``critic.`` (no policy name starts with it)."""

    def __init__(self, policy, critic: Critic) -> None:
        self.policy, self.critic, self.device = policy, critic, policy.device

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        """The modules a checkpoint saves: the policy's (:meth:`TrainablePolicy.checkpoint_modules`) and ``critic``."""
        return {**self.policy.checkpoint_modules(), "critic": self.critic}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Policy and critic weights in one mapping (critic keys prefixed ``critic.``), full tensors (a collective
        when sharded)."""
        from trainers.policy import full_state_dict

        critic = full_state_dict(self.critic)
        return {**self.policy.state_dict(), **{f"critic.{k}": v for k, v in critic.items()}}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load a :meth:`state_dict`; a checkpoint without critic weights is an error."""
        critic: dict[str, Any] = {k[len("critic."):]: v for k, v in state.items() if k.startswith("critic.")}
        if not critic:
            raise PolicyError("this checkpoint holds no critic (was it written by another algorithm?)")
        from trainers.policy import is_sharded

        if is_sharded(self.critic):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(self.critic, critic, options=StateDictOptions(full_state_dict=True))
        else:
            self.critic.load_state_dict(critic)
        self.policy.load_state_dict({k: v for k, v in state.items() if not k.startswith("critic.")})


def packed_values(critic: Critic, packed: PackedTree, hidden: torch.Tensor | None = None,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """Functional form of :meth:`Critic.forward` (default ``mask``: every token with a predecessor)."""
    return critic(packed, hidden=hidden, mask=mask)


def node_values(packed: PackedTree, values: torch.Tensor) -> list[list[list[float]]]:
    """Split packed [T] values back into per-tree, per-node lists (``out[tree][node_id][j]``), the shape
    :func:`trainers.batch.advantages.tree_gae` reads."""
    flat = values.detach().double().cpu().tolist()
    offs = packed.node_offsets.tolist()
    out: list[list[list[float]]] = [[[] for _ in t.nodes] for t in packed.trees]
    for k, (ti, nid) in enumerate(zip(packed.node_tree.tolist(), packed.node_ids.tolist())):
        out[ti][nid] = flat[offs[k]:offs[k + 1]]
    return out


def scatter_node_lists(packed: PackedTree, per_tree: list[list[list[float]]],
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`node_values`: per-tree, per-node lists → a packed [T] tensor."""
    flat = [0.0] * packed.num_tokens
    offs = packed.node_offsets.tolist()
    for k, (ti, nid) in enumerate(zip(packed.node_tree.tolist(), packed.node_ids.tolist())):
        row = per_tree[ti][nid]
        if len(row) != offs[k + 1] - offs[k]:
            raise ConfigError(f"node {nid} of tree {ti} has {offs[k + 1] - offs[k]} tokens but {len(row)} entries")
        flat[offs[k]:offs[k + 1]] = row
    return torch.tensor(flat, dtype=dtype, device=packed.input_ids.device)
