#!/usr/bin/env bash
# Wheels for a GPU machine that has torch, transformers and peft but no network: this project's own wheel and
# every runtime dependency of it but those three and their direct requirements (what installing them guarantees
# at any version), pinned at the versions installed here, as binary wheels for the GPU machine's Python and
# platform. Checks that they total < 60 MB and prints the size.
#
#   scripts/gpu_wheels.sh [DIR]            # default DIR: .whl (ignored by git when listed in .git/info/exclude)
#
# Environment: GPU_PYTHON (the GPU machine's Python, default 3.12), GPU_PLATFORMS (pip platform tags, default the
# manylinux x86_64 ones), GPU_WHEELS_MAX_MB (default 60). There, before running bench/gpu_smoke.py, install what
# is missing (a requirement the machine already satisfies keeps its own version; the other wheels go unused):
#   python3 -m pip install -q --no-index --find-links DIR clawgym
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.whl}
py_version=${GPU_PYTHON:-3.12}
platforms=${GPU_PLATFORMS:-"manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64"}
max_mb=${GPU_WHEELS_MAX_MB:-60}

mkdir -p "$out"
rm -f "$out"/*.whl  # one version of each package: two stop the whole install

# name==version of each dependency to carry: clawgym's runtime requirements (no extras) and theirs, minus torch,
# transformers, peft and their direct requirements (deeper ones change between versions: carried, used if missing)
pins=$(GPU_PYTHON="$py_version" python - <<'EOF'
import importlib.metadata as md
import os
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

target = {"python_version": os.environ["GPU_PYTHON"], "python_full_version": os.environ["GPU_PYTHON"] + ".0",
          "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def closure(roots):
    seen, todo = {}, list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            sys.exit(f"{name} is required but not installed here; install the project with its dependencies first "
                     "(pip install -e .) so that its versions can be pinned")
        seen[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(target):
                todo.append(req.name)
    return seen


def direct(names):
    out = set()
    for name in names:
        out.add(canonicalize_name(name))
        for line in md.distribution(name).requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(target):
                out.add(canonicalize_name(req.name))
    return out


ours = closure(["clawgym"])
there = direct(["torch", "transformers", "peft"])
for name in sorted(set(ours) - set(there) - {"clawgym"}):
    print(f"{name}=={ours[name]}")
EOF
)
echo "carrying: clawgym $(echo "$pins" | tr '\n' ' ')"

platform_args=()
for p in $platforms; do platform_args+=(--platform "$p"); done
# shellcheck disable=SC2086 # one argument per pin
python -m pip download -q --no-deps --only-binary=:all: --python-version "$py_version" --implementation cp \
    "${platform_args[@]}" -d "$out" $pins
python -m pip wheel -q --no-deps --no-build-isolation -w "$out" .

bytes=$(du -cb "$out"/*.whl | tail -1 | cut -f1)
mb=$(python -c "print(f'{$bytes / 1e6:.1f}')")
echo "$(ls "$out"/*.whl | wc -l) wheels in $out: $mb MB"
if [ "$bytes" -ge $((max_mb * 1000000)) ]; then
    echo "the wheels total $mb MB, over the $max_mb MB a GPU machine's working tree can carry" >&2
    exit 1
fi
