"""bench/gpu_smoke.py, the prepared GPU check, kept from rotting on a CPU: its ``--tiny`` mode runs the same code
(meta init, synthetic GRPO group, flex-vs-dense comparison, GRPO updates) and its report has every field; the
comparison fails on a wrong mask; a parameter the random init skips is an error; the update's phases are read from
the events of one update or rejected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_smoke_report import SHAPES, SIZES, SmokeReport  # noqa: E402 - after the path insert

PHASES = {"meta_init_s", "materialize_s", "build_groups_s", "pack_s", "block_mask_s", "compare_s", "first_update_s",
          "score_forward_s", "train_forward_s", "train_backward_s", "optimizer_step_s", "update_s"}
UPDATE = {"attn_implementation", "mask_form", "packed_tokens", "trainable_tokens", "pairs", "episodes", "calls",
          "updates", "loss", "grad_norm", "weights_changed", "tokens_per_s", "update_tokens_per_s"}
COMPARISON = {"tokens", "trainable_tokens", "candidate", "reference", "logprob_max_abs_diff", "logprob_mean_abs_diff",
              "flex_backward", "flex_backward_note", "grad_candidate", "grad_rel_err", "grad_cosine",
              "tol_logprob_abs", "tol_grad_rel_err", "min_grad_cosine", "ok"}
MODEL = {"shape", "architecture", "parameters", "init", "phases", "flex_vs_dense", "update", "peak_memory_gib", "ok"}
TOP = {"mode", "sizes", "device", "dtype", "gradient_checkpointing", "peak_memory_kind", "models", "failures",
       "wall_s", "budget_s", "within_budget", "ok"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tiny_smoke_runs_and_reports_every_field(tmp_path):
    # no tokenizer anywhere (the GPU machine has none and no network): the smoke must not need one
    env = dict(os.environ, CLAWGYM_TOKENIZER=str(tmp_path / "no-tokenizer"), CLAWGYM_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_smoke.py"), "--tiny", "--device", "cpu",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=590)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stdout[-2000:]  # ONE JSON object on stdout
    printed = json.loads(lines[0])
    files = list((tmp_path / "out").glob("gpu_smoke_tiny_*.json"))
    assert len(files) == 1
    written = json.loads(files[0].read_text())
    assert written == printed
    assert set(printed) == TOP
    report = SmokeReport.model_validate(printed)
    assert report.ok and not report.failures and report.mode == "tiny"
    assert report.device.type == "cpu" and report.dtype == "float32"
    assert [m.architecture for m in report.models] == ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM"]
    assert [m.shape for m in report.models] == [SHAPES["tiny"]["dense"], SHAPES["tiny"]["moe"]]
    sizes = SIZES["tiny"]
    for raw, m in zip(printed["models"], report.models):
        assert set(raw) == MODEL and set(raw["phases"]) == PHASES and set(raw["update"]) == UPDATE
        assert set(raw["flex_vs_dense"]) == COMPARISON
        assert m.ok and m.init == "meta" and m.parameters > 0 and m.peak_memory_gib > 0
        assert all(v >= 0 for v in raw["phases"].values())
        p, u, c = m.phases, m.update, m.flex_vs_dense
        assert p.update_s >= p.score_forward_s + p.train_forward_s + p.train_backward_s + p.optimizer_step_s - 1e-6
        assert u.packed_tokens >= sizes.pack_tokens and 0 < u.trainable_tokens < u.packed_tokens
        assert u.episodes == sizes.episodes and u.updates == 2 and u.weights_changed
        assert u.grad_norm > 0 and u.tokens_per_s > 0 and u.update_tokens_per_s > 0
        # the comparison ran and passed: flex_attention's forward against the dense tree mask
        assert c.ok and c.tokens >= sizes.compare_tokens and c.trainable_tokens > 0
        assert c.logprob_max_abs_diff <= c.tol_logprob_abs and c.grad_cosine >= c.min_grad_cosine
        # on a CPU flex_attention has no backward (torch says so): the report names it, the update runs sdpa
        assert not c.flex_backward and c.flex_backward_note and "backward" in c.flex_backward_note
        assert c.grad_candidate.startswith("eager") and u.attn_implementation == "sdpa"
        assert u.mask_form == "additive"  # gradient checkpointing: the dense mask, not prefix caches


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_comparison_fails_on_a_wrong_mask_and_init_gaps_are_errors(tmp_path, monkeypatch):
    import torch

    from bench import gpu_smoke

    cpu = torch.device("cpu")
    policy = gpu_smoke.skeleton_policy(SHAPES["tiny"]["dense"], device=cpu, dtype="float32", workdir=tmp_path)
    gpu_smoke.materialize(policy, cpu, seed=0)
    pack = gpu_smoke.build_pack("tiny", SIZES["tiny"].compare_tokens, policy.vocab_limit, cpu, seed=2)[0]
    args = gpu_smoke.grpo_args()
    good = gpu_smoke.compare(policy, pack, args)
    # eager ADDS a bool mask to the scores: every query attends everywhere, a wrong tree mask
    bad = gpu_smoke.compare(policy, pack, args, reference=("eager", "bool"))
    assert good.ok and not bad.ok
    assert bad.logprob_max_abs_diff > 100 * good.tol_logprob_abs
    assert policy.causal_lm.config._attn_implementation == "sdpa"  # restored

    fresh = gpu_smoke.skeleton_policy(SHAPES["tiny"]["moe"], device=cpu, dtype="float32", workdir=tmp_path)
    monkeypatch.setattr(type(fresh.causal_lm), "init_weights", lambda self: None)
    with pytest.raises(RuntimeError, match="unset"):
        gpu_smoke.materialize(fresh, cpu, seed=0)


def test_a_failing_shape_is_reported_and_the_next_still_runs(tmp_path, monkeypatch, capsys):
    from bench import gpu_smoke

    tried = []

    def fails(mode, shape, **_):
        tried.append(shape.name)
        raise RuntimeError(f"out of memory in {shape.name}")

    monkeypatch.setattr(gpu_smoke, "run_model", fails)
    assert gpu_smoke.main(["--tiny", "--device", "cpu", "--out", str(tmp_path)]) == 1
    report = SmokeReport.model_validate_json(next(tmp_path.glob("gpu_smoke_tiny_*.json")).read_text())
    assert tried == ["tiny-qwen3", "tiny-qwen3-moe"] and not report.ok and report.models == []
    assert report.failures == {n: f"RuntimeError: out of memory in {n}" for n in tried}
    assert "Traceback" in capsys.readouterr().err


def test_update_phases_from_events():
    from bench.gpu_smoke import update_phases

    ev = [("start", 0.0), ("trunk_start", 1.0), ("trunk_end", 2.0), ("trunk_start", 2.5), ("trunk_end", 3.0),
          ("trunk_start", 4.0), ("trunk_end", 6.0), ("step_start", 9.0), ("step_end", 9.5), ("end", 10.0)]
    assert update_phases(ev) == (4.0, 2.0, 3.0, 0.5, 10.0)  # scoring ran two segment forwards
    with pytest.raises(RuntimeError, match="unexpected update events"):
        update_phases([e for e in ev if not e[0].startswith("step")])
    with pytest.raises(RuntimeError, match="unexpected update events"):
        update_phases(ev[:-3] + [("step_start", 9.0), ("step_end", 9.5)] * 2 + [("end", 10.0)])
    with pytest.raises(RuntimeError, match="unexpected update events"):
        update_phases([("start", 0.0), ("end", 1.0)])
