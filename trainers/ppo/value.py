"""The critic for PPO over call trees: a value head evaluated on the PACKED tree.

A :class:`Critic` is a value head (``Linear(hidden, 1)``) on top of a trunk, in one of two layouts:

* ``shared`` (:meth:`Critic.on_policy`): the head sits on the policy's own trunk. The critic does not
  own the trunk (it is not one of its submodules, so it is neither in its ``state_dict`` nor in its
  ``parameters()``); callers pass the policy's packed hidden states, which the policy forward already
  computed for the logprobs — one trunk forward serves both.
* ``separate`` (:meth:`Critic.separate`): the critic owns a second Qwen3-family trunk (by default a
  copy of the policy's, so it starts from the policy's weights) and runs its own packed forward.

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
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clawgym_env.errors import ConfigError, PolicyError
from trainers.batch.logprobs import packed_hidden_states
from trainers.batch.packing import PackedTree

CRITIC_KINDS = ("shared", "separate")


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
    """A value head on the policy's trunk (``shared``) or on its own trunk (``separate``)."""

    def __init__(self, head: ValueHead, trunk: nn.Module | None = None) -> None:
        super().__init__()
        self.head = head
        self.trunk = trunk  # None for a shared critic: the policy's trunk is never registered here

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def on_policy(cls, policy_model, init_std: float | None = None, seed: int = 0) -> Critic:
        """A head on ``policy_model``'s trunk (float32 head, on the policy's device)."""
        trunk = _trunk_of(policy_model)
        device = next(trunk.parameters()).device
        return cls(ValueHead(policy_model.config.hidden_size, init_std, seed).to(device))

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
                   init_std: float | None = None, seed: int = 0) -> Critic:
        """The critic of a :class:`trainers.policy.TrainablePolicy`: ``shared`` puts the head on its trunk;
        ``separate`` starts from ``value_model`` (a model directory) or else from a merged, plain copy of
        the policy (LoRA deltas included) taken over as the value trunk."""
        if kind == "shared":
            return cls.on_policy(policy.causal_lm, init_std, seed)
        if kind != "separate":
            raise ConfigError(f"critic kind must be one of {CRITIC_KINDS}, got {kind!r}")
        if value_model:
            critic = cls.separate(value_model, init_std, seed).to(policy.device)
        else:
            critic = cls.separate(policy.serving_copy(), init_std, seed, copy_trunk=False)
        trunk: Any = critic.trunk  # a transformers model (dynamically typed)
        if policy.config.gradient_checkpointing:  # the critic's own trunk trains under the same memory plan
            trunk.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return critic

    @property
    def kind(self) -> str:
        """``shared`` (a head on the policy's trunk) or ``separate`` (its own trunk)."""
        return "shared" if self.trunk is None else "separate"

    # -- evaluation -----------------------------------------------------------------------------
    def values_from_hidden(self, hidden: torch.Tensor, packed: PackedTree,
                           mask: torch.Tensor | None = None) -> torch.Tensor:
        """[T] values read at predecessor rows of ``hidden`` (see the module invariants)."""
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
        """[T] values. A shared critic needs ``hidden`` (the policy's packed hidden states); a separate
        one runs its own trunk (``hidden`` must then be None)."""
        if self.trunk is None:
            if hidden is None:
                raise ConfigError("a shared critic reads the policy's hidden states: pass hidden=")
        else:
            if hidden is not None:
                raise ConfigError("a separate critic runs its own trunk; do not pass the policy's hidden states")
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
