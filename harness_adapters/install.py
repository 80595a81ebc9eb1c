"""Installing npm-distributed harnesses into a project cache (pinned versions, idempotent).

Layout: ``<cache>/harnesses/<slug>-<version>/`` is an npm prefix holding ``node_modules/``; a
``.clawgym-installed`` marker (written last) says the install completed, so a half-finished install
is redone. ``<cache>`` is ``$CLAWGYM_CACHE`` (default ``~/.cache/clawgym``) or the ``cache_dir`` a
user passes. Installs use ``--no-audit --no-fund --prefer-offline``; once installed, nothing touches
the network again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from clawgym_env.errors import HarnessError
from clawgym_env.policy.tokenizer import cache_dir as _cache_root

MARKER = ".clawgym-installed"


@dataclasses.dataclass(frozen=True)
class NpmPackage:
    """One pinned npm package and the executable it installs."""

    name: str      # npm package name, e.g. "@anthropic-ai/claude-code"
    version: str   # pinned version
    bin: str       # the executable under node_modules/.bin
    min_node: int | None = None  # major Node version the harness needs at install and run time

    @property
    def slug(self) -> str:
        """The name as a folder name (``@scope/name`` → ``scope-name``)."""
        return self.name.replace("@", "").replace("/", "-")

    @property
    def spec(self) -> str:
        """``name@version``, as npm takes it."""
        return f"{self.name}@{self.version}"


NODE24 = NpmPackage("node", "24.21.0", "node")


def harness_cache(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` when given, else ``<project cache>/harnesses``."""
    return Path(cache_dir) if cache_dir else _cache_root() / "harnesses"


def prefix_for(pkg: NpmPackage, cache_dir: str | os.PathLike | None = None) -> Path:
    """The npm prefix ``pkg`` is (or would be) installed into."""
    return harness_cache(cache_dir) / f"{pkg.slug}-{pkg.version}"


def is_installed(pkg: NpmPackage, cache_dir: str | os.PathLike | None = None) -> bool:
    """Whether an install of ``pkg`` completed (its marker exists)."""
    return (prefix_for(pkg, cache_dir) / MARKER).exists()


def bin_path(pkg: NpmPackage, cache_dir: str | os.PathLike | None = None) -> Path:
    """The harness's executable (resolved through npm's .bin symlink)."""
    link = prefix_for(pkg, cache_dir) / "node_modules" / ".bin" / pkg.bin
    if not link.exists():
        raise HarnessError(f"{pkg.spec} is not installed; run `clawgym harness install` first")
    return link.resolve()


def find_node(cache_dir: str | os.PathLike | None = None, min_major: int = 24) -> Path | None:
    """A Node binary of at least ``min_major`` that is already here (the system's when new enough,
    else an installed npm ``node@24``), or None; installs nothing."""
    system = shutil.which("node")
    if system:
        try:
            out = subprocess.run([system, "--version"], capture_output=True, text=True, timeout=10).stdout
            if int(out.strip().lstrip("v").split(".")[0]) >= min_major:
                return Path(system).resolve()
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
    if min_major <= int(NODE24.version.split(".")[0]) and is_installed(NODE24, cache_dir):
        return bin_path(NODE24, cache_dir)
    return None


def node_binary(cache_dir: str | os.PathLike | None = None, min_major: int = 24) -> Path:
    """A Node binary of at least ``min_major``: the system's when new enough, else npm's ``node@24``
    (installed on first use)."""
    found = find_node(cache_dir, min_major)
    if found is not None:
        return found
    npm_install(NODE24, cache_dir)
    return bin_path(NODE24, cache_dir)


def npm_install(pkg: NpmPackage, cache_dir: str | os.PathLike | None = None, *, force: bool = False,
                log=print) -> Path:
    """Install ``pkg`` (pinned) into its cache prefix; a no-op when already installed. Returns the prefix."""
    prefix = prefix_for(pkg, cache_dir)
    if is_installed(pkg, cache_dir) and not force:
        return prefix
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessError(f"installing {pkg.spec} needs npm; install Node.js and npm (apt-get install nodejs npm)")
    env = dict(os.environ)
    if pkg.min_node:
        node = node_binary(cache_dir, pkg.min_node)
        env["PATH"] = f"{node.parent}{os.pathsep}{env.get('PATH', '')}"
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / MARKER).unlink(missing_ok=True)
    t0 = time.monotonic()
    log(f"[clawgym] npm install {pkg.spec} into {prefix}")
    # npm refuses `--prefix DIR NAME` when ./NAME exists in the cwd, so run from the prefix itself.
    proc = subprocess.run([npm, "install", "--prefix", str(prefix), pkg.spec, "--no-audit", "--no-fund",
                           "--prefer-offline", "--loglevel=error"], cwd=prefix, env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise HarnessError(f"npm install {pkg.spec} failed (exit {proc.returncode}): {proc.stderr.strip()[-1500:]}")
    info = {"package": pkg.name, "version": pkg.version, "install_s": round(time.monotonic() - t0, 2)}
    (prefix / MARKER).write_text(json.dumps(info))
    return prefix


def install_info(pkg: NpmPackage, cache_dir: str | os.PathLike | None = None) -> dict:
    """What the marker recorded (version, install time) plus the install's size in bytes."""
    prefix = prefix_for(pkg, cache_dir)
    if not is_installed(pkg, cache_dir):
        return {}
    info = json.loads((prefix / MARKER).read_text())
    files = {(st.st_dev, st.st_ino): st.st_size  # a hard-linked file (Claude Code's binary) counts once
             for st in (p.stat() for p in prefix.rglob("*") if p.is_file() and not p.is_symlink())}
    info["size_bytes"] = sum(files.values())
    return info
