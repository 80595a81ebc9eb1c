"""Counts of the house's typing debt, printed side by side for the library packages.

Run from the repository root: ``python scripts/house_counts.py``. Library code only (task data under
``tasks/builtin``, ``tasks/families``, ``tasks/fixtures`` and ``reward/`` scripts excluded). Counts:

* ``dict[str, Any]`` occurrences in source text; then, in code only (the syntax tree: no comments or docstrings),
  the wire-JSON annotations (uses of the ``JSONObject`` alias, :mod:`clawgym_env.jsontypes`) and the bare
  ``dict[str, Any]`` left, per package (the alias's own definitions not counted);
* public functions/methods (no leading underscore, in a public module and class) and how many carry ``Any``
  in a parameter or return annotation;
* public functions taking ``**kwargs: Any``;
* files over 400 lines; top-level files of ``clawgym_env/proxy`` and ``trainers``;
* GRPO ``Args`` fields: top level and leaves (nested dataclass sections counted through);
* README lines.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("clawgym_env", "clawgym_cli", "tasks", "harness_adapters", "trainers", "leaderboards")
EXCLUDED = ("tasks/builtin/", "tasks/families/", "tasks/fixtures/", "/reward/")


def library_files() -> list[Path]:
    files = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(part in rel for part in EXCLUDED):
                files.append(path)
    return files


def _public(path: Path) -> bool:
    return not any(part.startswith("_") and part != "__init__.py" for part in path.relative_to(ROOT).parts)


def _mentions_any(node: ast.AST | None) -> bool:
    return node is not None and any(isinstance(n, ast.Name) and n.id == "Any" or
                                    isinstance(n, ast.Attribute) and n.attr == "Any" for n in ast.walk(node))


def signatures(path: Path) -> tuple[int, int, int]:
    """(public functions, those with Any in their signature, those taking ``**kwargs: Any``)."""
    tree = ast.parse(path.read_text())
    total = with_any = kw_any = 0

    def visit(body: list[ast.stmt]) -> None:
        nonlocal total, with_any, kw_any
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not node.name.startswith("_") or node.name == "__init__"):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
                          *([a.kwarg] if a.kwarg else [])]
                total += 1
                if any(_mentions_any(p.annotation) for p in params) or _mentions_any(node.returns):
                    with_any += 1
                if a.kwarg is not None and _mentions_any(a.kwarg.annotation):
                    kw_any += 1

    visit(tree.body)
    return total, with_any, kw_any


def _is_dict_str_any(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "dict"):
        return False
    s = node.slice
    return (isinstance(s, ast.Tuple) and len(s.elts) == 2 and isinstance(s.elts[0], ast.Name)
            and s.elts[0].id == "str" and isinstance(s.elts[1], ast.Name) and s.elts[1].id == "Any")


def json_counts(path: Path) -> tuple[int, int]:
    """(uses of ``JSONObject``, bare ``dict[str, Any]`` left) in ``path``'s code; an assignment defining the
    ``JSONObject`` alias is neither."""
    tree = ast.parse(path.read_text())
    defining: set[int] = set()
    for node in ast.walk(tree):
        target: ast.expr
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "JSONObject":
            defining.update(id(n) for n in ast.walk(value))
    uses = sum(isinstance(n, ast.Name) and n.id == "JSONObject" and isinstance(n.ctx, ast.Load) for n in ast.walk(tree))
    bare = sum(_is_dict_str_any(n) and id(n) not in defining for n in ast.walk(tree))
    return uses, bare


def grpo_fields() -> tuple[int, int]:
    sys.path.insert(0, str(ROOT))
    for name in ("trainers.grpo.train", "trainers.grpo"):
        try:
            module = importlib.import_module(name)
            args = module.Args
            break
        except (ImportError, AttributeError):
            continue
    else:
        return -1, -1

    def leaves(cls: type) -> int:
        n = 0
        for f in dataclasses.fields(cls):
            t = f.type if not isinstance(f.type, str) else None
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]
            n += leaves(type(default)) if dataclasses.is_dataclass(default) else 1
            del t
        return n

    return len(dataclasses.fields(args)), leaves(args)


def main() -> None:
    files = library_files()
    dict_any = sum(p.read_text().count("dict[str, Any]") for p in files)
    total = with_any = kw_any = 0
    for p in files:
        if _public(p):
            t, w, k = signatures(p)
            total, with_any, kw_any = total + t, with_any + w, kw_any + k
    big = [p for p in files if len(p.read_text().splitlines()) > 400]
    top, leaf = grpo_fields()
    rows = [
        ("library files", len(files)),
        ("library lines", sum(len(p.read_text().splitlines()) for p in files)),
        ("dict[str, Any] occurrences", dict_any),
        ("public functions", total),
        ("public functions with Any in the signature", f"{with_any} ({100 * with_any / max(total, 1):.0f}%)"),
        ("public functions taking **kwargs: Any", kw_any),
        ("files over 400 lines", len(big)),
        ("top-level .py files in clawgym_env/", len(list((ROOT / "clawgym_env").glob("*.py")))),
        ("top-level .py files in clawgym_env/proxy/", len(list((ROOT / "clawgym_env/proxy").glob("*.py")))),
        ("top-level .py files in clawgym_env/sandbox/", len(list((ROOT / "clawgym_env/sandbox").glob("*.py")))),
        ("top-level .py files in trainers/", len(list((ROOT / "trainers").glob("*.py")))),
        ("GRPO Args top-level fields", top),
        ("GRPO Args leaf fields", leaf),
        ("README lines", len((ROOT / "README.md").read_text().splitlines())),
    ]
    by_pkg = {pkg: [0, 0] for pkg in PACKAGES}
    for p in files:
        uses, bare = json_counts(p)
        by_pkg[p.relative_to(ROOT).parts[0]][0] += uses
        by_pkg[p.relative_to(ROOT).parts[0]][1] += bare
    rows[3:3] = [
        ("wire-JSON annotations (JSONObject uses)", sum(u for u, _ in by_pkg.values())),
        ("bare dict[str, Any] left (code)", sum(b for _, b in by_pkg.values())),
        *((f"  {pkg}: JSONObject / bare dict[str, Any]", f"{u} / {b}") for pkg, (u, b) in by_pkg.items()),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
