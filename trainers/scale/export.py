"""Export a training checkpoint as a Hugging Face model directory (``clawgym export``).

:func:`export_checkpoint` rebuilds the policy from the checkpoint's ``state.json`` config (its
``policy`` section), loads the checkpoint's weights into it (one process; a checkpoint saved on any
number of ranks) and writes one of:

* ``merged`` (default): a plain causal LM, LoRA deltas merged (``config.json``, safetensors, tokenizer
  with its chat template, generation config). ``AutoModelForCausalLM.from_pretrained(DIR)``,
  ``--policy transformers:DIR`` and ``--policy vllm:DIR`` load it as they load any model folder; a
  Qwen3-MoE's fused experts are written per expert, the layout both read.
* ``adapter`` (LoRA only): peft's adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``)
  plus the tokenizer; its base is the run's ``policy.model`` folder, or for a random-init ``tiny*``
  base the base model written to ``DIR/base/`` (``adapter_config.json`` names it).

The weights are written in ``dtype`` (``--dtype``, default ``bfloat16``), whatever the masters' (``policy.dtype``,
often ``float32``): the merged model (LoRA merged in the masters' dtype first), or the random-init base written next
to an adapter; the adapter's own tensors keep the masters' dtype.

Every export holds ``clawgym_export.json``: what was exported from where (checkpoint, step,
version, kind, base, dtype, policy config). Invariants: the export produces the trained policy's logits
(merged: up to float rounding of the merge); an existing non-empty ``--out`` is replaced only with
``force`` and only when it is an earlier export.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from clawgym_env.errors import ConfigError, PolicyError
from clawgym_env.jsontypes import JSONObject
from trainers.policy import TINY_MODELS, PolicyConfig, TrainablePolicy, load_causal_lm
from trainers.scale.checkpoint import load_checkpoint, resolve_checkpoint
from trainers.scale.serving_names import DEFAULT_SERVING_DTYPE, dtype_name

EXPORT_NOTE = "clawgym_export.json"
BASE_DIR = "base"


@dataclasses.dataclass
class ExportResult:
    """What :func:`export_checkpoint` wrote."""

    out: Path
    """the exported model (or adapter) directory"""
    kind: str
    """``merged`` or ``adapter``"""
    checkpoint: Path
    """the checkpoint folder it came from"""
    step: int
    """the checkpoint's optimiser step"""
    base: str | None
    """an adapter's base model directory (None for a merged export)"""


def policy_config_of(state: JSONObject, path: Path) -> PolicyConfig:
    """The :class:`PolicyConfig` a checkpoint's run trained (``state.json`` → ``config.policy``), on the CPU."""
    config = state.get("config")
    raw = config.get("policy") if isinstance(config, dict) else None
    if not isinstance(raw, dict):
        raise PolicyError(f"checkpoint {path} records no policy config (state.json config.policy); export rebuilds "
                          "the model from it, so export checkpoints written by clawgym train (grpo, ppo, sft)")
    known = {f.name for f in dataclasses.fields(PolicyConfig)}
    cfg = PolicyConfig(**{k: v for k, v in raw.items() if k in known})
    cfg.device, cfg.gradient_checkpointing = "cpu", False
    return cfg


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; choose a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ConfigError(f"--out {out} exists and is not empty; choose another directory, or pass --force to "
                              "replace an earlier export there")
        if not (out / EXPORT_NOTE).is_file():
            raise ConfigError(f"refusing to replace {out}: it is not an earlier export (no {EXPORT_NOTE}); "
                              "choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def export_checkpoint(source: str | Path, out: str | Path, *, adapter: bool = False, force: bool = False,
                      dtype: str = DEFAULT_SERVING_DTYPE) -> ExportResult:
    """Export ``source`` (a checkpoint folder or a run's ``out_dir``: its latest) to ``out``, weights in ``dtype``
    (see the module doc)."""
    try:
        dtype = dtype_name(dtype, "--dtype")
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    path = resolve_checkpoint(source)
    state = json.loads((path / "state.json").read_text())
    cfg = policy_config_of(state, path)
    if adapter and cfg.lora_rank <= 0:
        raise ConfigError(f"--adapter exports LoRA adapters, but {path} trained all weights (policy.lora_rank 0); "
                          "export it merged (drop --adapter)")
    out = Path(out)
    _prepare_out(out, force)
    policy = TrainablePolicy(cfg)
    load_checkpoint(path, policy, None, restore_rng=False)
    base: str | None = None
    if adapter:
        base = _write_adapter(policy, cfg, out, dtype)
    else:
        _write_merged(policy, out, dtype)
    note = {"checkpoint": str(path.resolve()), "step": state.get("step"), "version": state.get("version"),
            "kind": "adapter" if adapter else "merged", "base": base, "dtype": dtype,
            "policy": dataclasses.asdict(cfg)}
    (out / EXPORT_NOTE).write_text(json.dumps(note, indent=2) + "\n")
    return ExportResult(out=out, kind=note["kind"], checkpoint=path, step=int(state.get("step") or 0), base=base)


def _write_merged(policy: TrainablePolicy, out: Path, dtype: str) -> None:
    """The plain causal LM (LoRA merged in the masters' dtype, then cast to ``dtype``) + tokenizer, as
    ``save_pretrained`` writes them (a Qwen3-MoE's experts per expert)."""
    import torch

    plain = policy.serving_copy().to(getattr(torch, dtype))
    plain.save_pretrained(str(out))
    policy.tokenizer.save_pretrained(str(out))


def _write_adapter(policy: TrainablePolicy, cfg: PolicyConfig, out: Path, dtype: str) -> str:
    """peft's adapter folder + tokenizer; returns the base model directory the adapter applies to."""
    import torch

    if cfg.model in TINY_MODELS:  # a random-init base exists nowhere else: write it next to the adapter
        base_dir = (out / BASE_DIR).resolve()
        load_causal_lm(cfg, policy.tokenizer).to(getattr(torch, dtype)).save_pretrained(str(base_dir))
        policy.tokenizer.save_pretrained(str(base_dir))
        base = str(base_dir)
    else:
        base = str(Path(cfg.model).expanduser().resolve())
    policy.module.save_pretrained(str(out))
    policy.tokenizer.save_pretrained(str(out))
    adapter_cfg = out / "adapter_config.json"
    data = json.loads(adapter_cfg.read_text())
    data["base_model_name_or_path"] = base
    adapter_cfg.write_text(json.dumps(data, indent=2) + "\n")
    return base
