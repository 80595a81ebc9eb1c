#!/usr/bin/env bash
# Installs everything, starts the local Docker engine for the Docker-backend tests, runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if [ -x scripts/dockerd.sh ]; then bash scripts/dockerd.sh start || echo "[test] no Docker engine here; Docker tests will skip with the reason"; fi
python3 -m pytest -q -p no:cacheprovider "$@"
