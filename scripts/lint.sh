#!/usr/bin/env bash
# The static checks, first stage of .ci/run (fast: no model, no sandbox). Each runs even when an
# earlier one failed, so one run lists everything; exits non-zero if any failed.
#   ruff check    style, pyflakes, import order, bugbear, pyupgrade, docstrings ([tool.ruff] in pyproject.toml)
#   mypy          types of the packages ([tool.mypy])
#   lint-imports  the import layers and no cycles ([tool.importlinter]; tests/test_layers.py checks the same)
# The tools come with the dev extras: `python3 -m pip install -e '.[dev]'` (scripts/install.sh does it).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
failed=()
fixes=()

step() {  # step NAME FIX_HINT CMD...
  local name=$1 hint=$2
  shift 2
  local t0=$SECONDS
  echo "[lint] $name"
  if "$@"; then
    echo "[lint] $name: ok ($((SECONDS - t0)) s)"
  else
    echo "[lint] $name: FAILED ($((SECONDS - t0)) s)"
    failed+=("$name")
    fixes+=("$name: $hint")
  fi
}

for tool in ruff mypy lint-imports; do
  if ! $PY -c "import shutil, sys; sys.exit(shutil.which('$tool') is None)"; then
    echo "[lint] $tool is not installed; run: $PY -m pip install -e '.[dev]'" >&2
    exit 2
  fi
done

step "ruff" "run \`ruff check --fix\` for the fixable ones, fix the rest by hand (\`ruff rule CODE\` explains a code)" \
  ruff check .
step "mypy" "fix the types; \`# type: ignore[code]\` only for a third-party gap, with the reason" \
  mypy
if grep -q '^\[tool\.importlinter\]' pyproject.toml; then
  step "lint-imports" "an import points up a layer or closes a cycle: move the code down, or pass what it needs in" \
    lint-imports --no-cache
else
  echo "[lint] lint-imports: skipped, pyproject.toml has no [tool.importlinter] contracts yet"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "[lint] failed: ${failed[*]}" >&2
  for f in "${fixes[@]}"; do echo "[lint]   $f" >&2; done
  exit 1
fi
echo "[lint] all checks passed"
