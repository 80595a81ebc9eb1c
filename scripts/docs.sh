#!/usr/bin/env bash
# Builds the documentation site (mkdocs.yml, docs/) with warnings as errors, as CI does (.ci/run runs it
# after the lint). The API reference is generated from the docstrings, and the CLI and config references
# from the real --help texts, at build time (docs/hooks/), so a broken docstring, link or anchor fails here.
# Installs the docs extra first when its packages are missing (`pip install -e '.[docs]'`). The site is
# built into a temporary folder and removed afterwards; DOCS_SITE_DIR=DIR keeps it in DIR instead.
# While writing: `mkdocs serve` (live preview at http://127.0.0.1:8000).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! $PY -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null; then
  echo "[docs] installing the docs extra: $PY -m pip install -e '.[docs]'"
  $PY -m pip install -q -e '.[docs]'
fi

if [ -n "${DOCS_SITE_DIR:-}" ]; then
  site=$DOCS_SITE_DIR
else
  site=$(mktemp -d "${TMPDIR:-/tmp}/clawgym-docs.XXXXXX")
  trap 'rm -rf "$site"' EXIT
fi

t0=$SECONDS
# NO_MKDOCS_2_WARNING: the theme's banner about MkDocs 2.0 (the docs extra pins mkdocs < 2)
NO_MKDOCS_2_WARNING=1 $PY -m mkdocs build --strict --clean --site-dir "$site"
echo "[docs] ok: built with no warnings in $((SECONDS - t0)) s${DOCS_SITE_DIR:+ into $site}"
