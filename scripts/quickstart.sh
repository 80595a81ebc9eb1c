#!/usr/bin/env bash
# The main job: `clawgym quickstart`, a CPU run that learns, offline, in about ten minutes. A tiny
# Qwen3-architecture policy (real Qwen3 tokenizer) is evaluated on held-out tasks of the generated
# `count_errors` family, warm-started by SFT on the scripted expert's trajectories captured through the
# reference harness `mini`, then trained with GRPO over call trees through the same harness; every
# episode runs in the bubblewrap sandbox and is graded hermetically. It prints the held-out pass rate
# before SFT, after SFT and after RL (with episode counts) and writes curves under runs/quickstart/.
# Arguments go to `clawgym quickstart` (e.g. --rl-steps 60 for a longer RL phase, --concurrency 8).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec clawgym quickstart --out-dir runs/quickstart "$@"
