"""The engine's public names are written in two places that must agree: ``_EXPORTS`` (what ``import clawgym_env``
resolves lazily; ``__all__`` is its keys) and the ``TYPE_CHECKING`` imports (what type checkers see)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import clawgym_env


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse(Path(clawgym_env.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    found: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module, ast.unparse(node)
        for alias in node.names:
            name = alias.asname or alias.name
            assert name not in found, f"{name} imported twice"
            sub = f"{node.module}.{alias.name}"
            is_module = importlib.util.find_spec(sub) is not None if node.module == "clawgym_env" else False
            found[name] = sub if is_module else f"{node.module}:{alias.name}"
    return found


def test_type_checking_imports_name_the_exports() -> None:
    assert _type_checking_imports() == clawgym_env._EXPORTS


def test_all_is_the_exports_sorted() -> None:
    assert clawgym_env.__all__ == sorted(clawgym_env._EXPORTS)
    assert "__version__" not in clawgym_env._EXPORTS and clawgym_env.__version__
