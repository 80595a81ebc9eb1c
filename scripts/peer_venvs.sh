#!/usr/bin/env bash
# Builds the virtual environments of the peer LLM proxies that bench/bench_proxy_peers.py compares
# ClawGym's proxy with (idempotent). Only the benchmark uses them; ClawGym never imports them.
#
#   location: ${CLAWGYM_PEER_VENVS:-${CLAWGYM_CACHE:-~/.cache/clawgym}/peer-venvs}/<peer>
#   peers:    litellm       -> PyPI 'litellm[proxy]'  (its proxy server, `litellm --config ...`)
#             agentlightning -> PyPI 'agentlightning' (its LLMProxy, built on LiteLLM's proxy)
#   done:     each venv holds a file .clawgym-peer-ok naming the installed version; a second run with
#             that file present returns at once for that peer. Use --force to rebuild.
#
#   usage:    scripts/peer_venvs.sh [--force] [litellm] [agentlightning]   (no name: both)
set -euo pipefail

PY=${PYTHON:-python3}
CACHE=${CLAWGYM_CACHE:-$HOME/.cache/clawgym}
ROOT=${CLAWGYM_PEER_VENVS:-$CACHE/peer-venvs}

force=0
peers=()
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    litellm|agentlightning) peers+=("$arg") ;;
    *) echo "[peer_venvs] unknown argument '$arg' (peers: litellm, agentlightning; flag: --force)" >&2; exit 2 ;;
  esac
done
if [ ${#peers[@]} -eq 0 ]; then peers=(litellm agentlightning); fi

build() {
  local peer=$1 spec=$2 module=$3
  local venv="$ROOT/$peer" marker="$ROOT/$peer/.clawgym-peer-ok"
  if [ "$force" = 1 ]; then rm -rf "$venv"; fi
  if [ -f "$marker" ] && "$venv/bin/python" -c "import $module" 2>/dev/null; then
    echo "[peer_venvs] ready: $venv ($(cat "$marker"))"
    return 0
  fi
  local start
  start=$(date +%s)
  mkdir -p "$ROOT"
  if [ ! -x "$venv/bin/python" ]; then
    echo "[peer_venvs] creating venv $venv"
    "$PY" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
  echo "[peer_venvs] pip install '$spec' into $venv"
  "$venv/bin/python" -m pip install -q "$spec"
  local version
  version=$("$venv/bin/python" -c "from importlib.metadata import version; print('$peer', version('$peer'))")
  echo "$version" > "$marker"
  echo "[peer_venvs] ready: $venv ($version) in $(( $(date +%s) - start )) s"
}

for peer in "${peers[@]}"; do
  case "$peer" in
    litellm) build litellm 'litellm[proxy]' litellm ;;
    agentlightning) build agentlightning agentlightning agentlightning ;;
  esac
done
