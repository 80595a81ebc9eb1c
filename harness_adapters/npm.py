"""The base class of harnesses distributed on npm (OpenClaw, Claude Code, Codex, Qwen Code).

A subclass declares its pinned :class:`~harness_adapters.install.NpmPackage` as ``package`` and
what is specific to it (``launch``, ``read_output``, its executable); this class owns the rest:
installing the package (and a Node new enough for it) into the harness cache, the paths the
sandbox must show read-only, finding the installed entry point and the Node binary, and saying why
the harness cannot run here (:meth:`missing`).

Invariants:
  * ``package.min_node`` set means the harness runs on Node at run time: :meth:`install` provides a
    Node of at least that major version (the system's, else npm's ``node@24``), :meth:`node` finds
    it once per adapter, and :meth:`ro_paths` adds npm Node's prefix when that is the one used;
    ``min_node`` None means a native executable: no Node is installed, looked up or mounted;
  * :meth:`install` is idempotent; given a ``cache_dir`` it also makes that cache the adapter's own,
    so the install and later launches use the same prefix;
  * :meth:`missing` installs and launches nothing (it reads the cache and asks the system Node its
    version); None means the harness can run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from clawgym_env.harness import HarnessAdapter
from harness_adapters.install import (
    NODE24,
    NpmPackage,
    bin_path,
    find_node,
    is_installed,
    node_binary,
    npm_install,
    prefix_for,
)

__all__ = ["NpmHarnessAdapter"]


class NpmHarnessAdapter(HarnessAdapter):
    """A harness whose pinned npm ``package`` is installed into the harness cache (module doc).

    Subclasses set ``package`` and call ``super().__init__(cache_dir=...)``; ``cache_dir`` is the
    harness cache (default: the project cache).
    """

    package: ClassVar[NpmPackage]

    def __init__(self, *, cache_dir: str | os.PathLike | None = None) -> None:
        self.cache_dir = cache_dir
        self._node: Path | None = None

    # -- install ----------------------------------------------------------------------------------
    def install(self, cache_dir: Path | None = None) -> None:
        """Install Node (when the harness runs on it and the system's is too old) and the pinned package."""
        cache = cache_dir or self.cache_dir
        if self.package.min_node:
            node_binary(cache, self.package.min_node)
        npm_install(self.package, cache)
        if cache_dir is not None:
            self.cache_dir, self._node = str(cache_dir), None

    def missing(self) -> str | None:
        """Why the harness cannot run here (its package or its Node is not installed, and the command
        that fixes it), or None."""
        fix = f"run `clawgym harness install {self.name}`"
        if not is_installed(self.package, self.cache_dir):
            return f"{self.package.spec} is not installed ({fix})"
        if self.package.min_node and find_node(self.cache_dir, self.package.min_node) is None:
            return f"{self.name} needs Node >= {self.package.min_node}, and neither the system's nor npm's " \
                   f"node@{NODE24.version} is here ({fix})"
        return None

    # -- where things are -------------------------------------------------------------------------
    def prefix(self) -> Path:
        """The package's npm prefix in the harness cache (it may not be installed yet)."""
        return prefix_for(self.package, self.cache_dir)

    def entry(self) -> Path:
        """The package's executable, ``node_modules/.bin/<bin>`` resolved (raises HarnessError naming the
        fix when the package is not installed)."""
        return bin_path(self.package, self.cache_dir)

    def node(self) -> Path:
        """The Node binary the harness runs on (found once per adapter; installs npm's ``node@24`` when
        the system's is too old). Only for packages with ``min_node``."""
        if self._node is None:
            self._node = node_binary(self.cache_dir, self.package.min_node or 24)
        return self._node

    def ro_paths(self) -> list[Path]:
        """The package's prefix and, when the harness runs on npm's Node, that Node's prefix."""
        paths = [self.prefix()]
        if self.package.min_node:
            npm_node = prefix_for(NODE24, self.cache_dir)
            if str(self.node()).startswith(str(npm_node) + "/"):
                paths.append(npm_node)
        return paths
