#!/usr/bin/env bash
# The main job on the embedded default: the reference harness `mini` with the scripted expert policy
# on the bundled `builtin` suite, each episode sandboxed with bubblewrap and graded hermetically.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec clawgym run --harness mini --suite builtin --policy scripted:expert --concurrency 2 --out runs/quickstart "$@"
