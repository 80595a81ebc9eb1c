"""Harnesses distributed on PyPI, each installed into its own virtual environment in the harness cache.

Layout: ``<cache>/harnesses/<name>-<version>/`` is a venv made by this interpreter's ``venv`` module, into
which pip installs the pinned package (and its pinned dependencies); a ``.clawgym-installed`` marker
(written last) records what was installed, so a half-finished install is redone. ``<cache>`` is the one
npm harnesses use (:func:`~harness_adapters.install.harness_cache`).

Invariants:
  * the harness never runs in this project's environment: its interpreter is the venv's ``bin/python``,
    whose base interpreter (``home`` in ``pyvenv.cfg``) :meth:`PypiHarnessAdapter.ro_paths` shows in the
    sandbox next to the venv, so the venv runs there at the same paths;
  * :meth:`PypiHarnessAdapter.install` is idempotent; given a ``cache_dir`` it also makes that cache the
    adapter's own, so the install and later launches use the same venv;
  * :meth:`PypiHarnessAdapter.missing` installs and launches nothing; None means the harness can run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

from clawgym_env.errors import HarnessError
from clawgym_env.harness import HarnessAdapter
from clawgym_env.jsontypes import JSONObject
from harness_adapters.install import MARKER, harness_cache

__all__ = ["PypiHarnessAdapter", "PypiPackage", "base_prefix", "pip_install", "venv_for"]


@dataclasses.dataclass(frozen=True)
class PypiPackage:
    """One pinned PyPI package, the console script it installs, and dependencies pinned with it."""

    name: str       # distribution name, e.g. "mini-swe-agent"
    version: str    # pinned version
    bin: str        # the console script under the venv's bin/
    pins: tuple[str, ...] = ()  # ``dist==version`` requirements installed together with it

    @property
    def spec(self) -> str:
        """``name==version``, as pip takes it."""
        return f"{self.name}=={self.version}"


def venv_for(pkg: PypiPackage, cache_dir: str | os.PathLike | None = None) -> Path:
    """The venv ``pkg`` is (or would be) installed into."""
    return harness_cache(cache_dir) / f"{pkg.name}-{pkg.version}"


def is_installed(pkg: PypiPackage, cache_dir: str | os.PathLike | None = None) -> bool:
    """Whether an install of ``pkg`` completed (its marker exists)."""
    return (venv_for(pkg, cache_dir) / MARKER).exists()


def base_prefix(venv: Path) -> Path | None:
    """The prefix of the interpreter ``venv`` was made from (the parent of ``home`` in its ``pyvenv.cfg``,
    resolved), or None when the file is missing or names no home."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home" and value.strip():
            return Path(value.strip()).resolve().parent
    return None


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip())[-1500:]
        raise HarnessError(f"{what} failed (exit {proc.returncode}): {tail}")
    return proc


def pip_install(pkg: PypiPackage, cache_dir: str | os.PathLike | None = None, *, force: bool = False,
                log=print) -> Path:
    """Make ``pkg``'s venv and pip-install the pinned package into it; a no-op when already installed.
    Returns the venv. pip reads its usual configuration (index, proxy) from the environment."""
    venv = venv_for(pkg, cache_dir)
    if is_installed(pkg, cache_dir) and not force:
        return venv
    (venv / MARKER).unlink(missing_ok=True)
    if force and venv.exists():
        shutil.rmtree(venv)
    t0 = time.monotonic()
    log(f"[clawgym] pip install {pkg.spec} into the venv {venv}")
    _run([sys.executable, "-m", "venv", "--clear", str(venv)], f"making the venv {venv} for {pkg.spec}")
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "-q", pkg.spec, *pkg.pins],
         f"pip install {pkg.spec}")
    frozen = _run([python, "-m", "pip", "freeze", "--disable-pip-version-check"], "pip freeze").stdout.split()
    info = {"package": pkg.name, "version": pkg.version, "install_s": round(time.monotonic() - t0, 2),
            "frozen": frozen}
    (venv / MARKER).write_text(json.dumps(info))
    return venv


def install_info(pkg: PypiPackage, cache_dir: str | os.PathLike | None = None) -> JSONObject:
    """What the marker recorded (version, install time, the venv's frozen requirements), or {}."""
    if not is_installed(pkg, cache_dir):
        return {}
    info: JSONObject = json.loads((venv_for(pkg, cache_dir) / MARKER).read_text())
    return info


class PypiHarnessAdapter(HarnessAdapter):
    """A harness whose pinned PyPI ``package`` runs from its own venv in the harness cache (module doc).

    Subclasses set ``package`` and call ``super().__init__(cache_dir=...)``; ``cache_dir`` is the
    harness cache (default: the project cache).
    """

    package: ClassVar[PypiPackage]

    def __init__(self, *, cache_dir: str | os.PathLike | None = None) -> None:
        self.cache_dir = cache_dir

    def install(self, cache_dir: Path | None = None) -> None:
        """Make the venv and install the pinned package (idempotent)."""
        pip_install(self.package, cache_dir or self.cache_dir)
        if cache_dir is not None:
            self.cache_dir = str(cache_dir)

    def missing(self) -> str | None:
        """Why the harness cannot run here (its venv is not installed, or the interpreter it was made from
        is gone), with the command that fixes it; None when it can run."""
        fix = f"run `clawgym harness install {self.name}`"
        if not is_installed(self.package, self.cache_dir):
            return f"{self.package.spec} is not installed ({fix})"
        if not self.python().exists():
            return f"the venv {self.venv()} lost its interpreter (the Python it was made from is gone; {fix})"
        return None

    def venv(self) -> Path:
        """The package's venv in the harness cache (it may not be installed yet)."""
        return venv_for(self.package, self.cache_dir)

    def python(self) -> Path:
        """The venv's interpreter (not resolved: a venv is recognised by the path it is started from)."""
        return self.venv() / "bin" / "python"

    def entry(self) -> Path:
        """The package's console script in the venv (raises HarnessError naming the fix when absent)."""
        script = self.venv() / "bin" / self.package.bin
        if not is_installed(self.package, self.cache_dir) or not script.exists():
            raise HarnessError(f"{self.package.spec} is not installed; run `clawgym harness install {self.name}`")
        return script

    def ro_paths(self) -> list[Path]:
        """The venv and the prefix of the interpreter it was made from."""
        base = base_prefix(self.venv())
        return [self.venv(), *([base] if base is not None else [])]
