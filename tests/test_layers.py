"""The floor plan: imports run one way, between layers and between modules.

Layers, top to bottom (:data:`LAYERS`); packages on one line are independent siblings::

    clawgym_cli                      the app: the console script and every command
    trainers | leaderboards          consumers of episodes
    tasks | harness_adapters         plugins: task sources and graders, harness adapters
    clawgym_env                      the engine and its seam types

Invariants checked over every module of these packages (a ``.py`` file whose folders all hold an
``__init__.py``; task data such as ``reward/`` scripts are not modules):

  * a module imports only its own package or packages of a lower layer; this counts every import
    in the file, also those inside functions and ``if TYPE_CHECKING:`` blocks;
  * the module graph has no cycle (no strongly connected component of more than one module, and no
    module importing itself); a failure names the modules of each cycle.

``from pkg import name`` is an import of the module ``pkg.name`` when that module exists, else of
``pkg`` itself (its ``__init__``); the implicit import of a module's parent package is not an edge.
The same layers are written as import-linter contracts in ``pyproject.toml`` (``lint-imports``).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS: tuple[tuple[str, ...], ...] = (
    ("clawgym_cli",),
    ("trainers", "leaderboards"),
    ("tasks", "harness_adapters"),
    ("clawgym_env",),
)
CONCEPT_LAYERS: dict[str, tuple[tuple[str, ...], ...]] = {
    "clawgym_env": (
        ("envs",),                # the gym Env and the Runtime: what users call
        ("fleet",),               # episodes across machines on Ray
        ("episodes",),            # one episode: sandbox -> harness -> proxy -> grade, as a record
        ("grading",),             # the trusted grader: reward/ sealed, guest sandboxes, protected inputs
        ("proxy",),               # the serving proxy and its wire dialects
        ("policy", "sandbox"),    # policy backends | sandbox backends
        ("capture", "files"),     # call records and trees | file-system utilities
    ),
    "trainers": (
        ("quickstart",),
        ("grpo", "ppo", "sft"),   # one folder per algorithm, independent of each other
        ("ranks",),               # the per-rank training driver
        ("rollouts",),            # drawing and running a step's episodes
        ("scale",),               # FSDP2, weight sync, checkpoints, export
        ("batch",),               # call trees -> groups -> bounded packs
    ),
}
"""Inside a package, its concept folders in layers (top to bottom; a line of several: independent siblings). A
concept imports only concepts of lower lines; modules not named here (seam types, shared helpers) are free. The
same layers are written as import-linter ``layers`` contracts with ``containers`` in ``pyproject.toml``."""
PENDING_CYCLES: dict[frozenset[str], str] = {
}
"""Known cycles still to break, each with why it exists: a to-do list that must end empty. A cycle
not listed fails; a listed cycle that no longer exists fails too, so the entry is removed with it."""


@dataclasses.dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``path:line``."""

    source: str
    target: str
    path: Path
    line: int

    def where(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}:{self.line}"


def find_modules(root: Path, packages: list[str]) -> dict[str, Path]:
    """``{dotted module name: file}`` for every module of ``packages`` under ``root``."""
    modules: dict[str, Path] = {}
    for top in packages:
        base = root / top
        if not (base / "__init__.py").is_file():
            continue
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root)
            folders = rel.parts[:-1]
            if not all((root.joinpath(*folders[:i + 1]) / "__init__.py").is_file() for i in range(len(folders))):
                continue
            parts = list(folders) if path.name == "__init__.py" else [*folders, path.stem]
            modules[".".join(parts)] = path
    return modules


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a project module (None: not ours)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def _resolve_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, *([node.module] if node.module else [])])


def module_edges(root: Path, modules: dict[str, Path]) -> list[Edge]:
    """Every import between project modules (anywhere in the file), with its line."""
    edges: list[Edge] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(node, name, path.name == "__init__.py")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            known = dict.fromkeys(_known(t, modules) for t in targets)  # `from pkg import a, b`: one import
            edges += [Edge(name, k, path, node.lineno) for k in known if k is not None and k != name]
    return edges


def layer_violations(root: Path, edges: list[Edge],
                     layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """One line per import that points up a layer or across to a sibling."""
    level = {pkg: i for i, line in enumerate(layers) for pkg in line}
    out = []
    for e in edges:
        src, dst = e.source.split(".")[0], e.target.split(".")[0]
        if src == dst or src not in level or dst not in level:
            continue
        if level[dst] < level[src]:
            out.append(f"{e.where(root)}: {e.source} imports {e.target} (layer {dst} is above {src})")
        elif level[dst] == level[src]:
            out.append(f"{e.where(root)}: {e.source} imports {e.target} ({src} and {dst} are independent siblings)")
    return out


def concept_violations(root: Path, edges: list[Edge],
                       concepts: dict[str, tuple[tuple[str, ...], ...]] = CONCEPT_LAYERS) -> list[str]:
    """One line per import inside a package that points up its concept layers or across to a sibling concept."""
    out = []
    for e in edges:
        src, dst = e.source.split("."), e.target.split(".")
        if len(src) < 2 or len(dst) < 2 or src[0] != dst[0] or src[0] not in concepts or src[1] == dst[1]:
            continue
        level = {name: i for i, line in enumerate(concepts[src[0]]) for name in line}
        a, b = src[1], dst[1]
        if a not in level or b not in level:
            continue
        if level[b] < level[a]:
            out.append(f"{e.where(root)}: {e.source} imports {e.target} (concept {src[0]}.{b} is above {src[0]}.{a})")
        elif level[b] == level[a]:
            out.append(f"{e.where(root)}: {e.source} imports {e.target} ({src[0]}.{a} and {src[0]}.{b} are "
                       "independent siblings)")
    return out


def strongly_connected(nodes: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted; components in no order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


@dataclasses.dataclass(frozen=True)
class Cycle:
    """The modules of one import cycle (a strongly connected component) and the imports that close it."""

    members: frozenset[str]
    links: tuple[str, ...]

    def __str__(self) -> str:
        return f"cycle among {', '.join(sorted(self.members))}: " + "; ".join(self.links)


def import_cycles(root: Path, modules: dict[str, Path], edges: list[Edge]) -> list[Cycle]:
    """Every import cycle among ``modules``."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        graph[e.source].add(e.target)
    out = []
    for comp in strongly_connected(sorted(modules), graph):
        if len(comp) < 2:
            continue
        members = frozenset(comp)
        links = sorted({f"{e.source} -> {e.target} ({e.where(root)})" for e in edges
                        if e.source in members and e.target in members})
        out.append(Cycle(members, tuple(links)))
    return out


def check_tree(root: Path, layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Every layer violation and import cycle of the packages in ``layers`` under ``root``."""
    modules = find_modules(root, [pkg for line in layers for pkg in line])
    edges = module_edges(root, modules)
    return (layer_violations(root, edges, layers) + concept_violations(root, edges)
            + [str(c) for c in import_cycles(root, modules, edges)])


# -- the project ----------------------------------------------------------------------------------
def test_project_imports_respect_the_layers() -> None:
    modules = find_modules(ROOT, [pkg for line in LAYERS for pkg in line])
    assert len(modules) > 100 and "clawgym_env.harness" in modules  # the walk found the project
    problems = layer_violations(ROOT, module_edges(ROOT, modules))
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


def test_project_concepts_respect_their_layers() -> None:
    modules = find_modules(ROOT, [pkg for line in LAYERS for pkg in line])
    for package, lines in CONCEPT_LAYERS.items():  # every concept named is a real folder (or module)
        for name in (n for line in lines for n in line):
            assert f"{package}.{name}" in modules, f"{package}.{name} is named in CONCEPT_LAYERS but does not exist"
    problems = concept_violations(ROOT, module_edges(ROOT, modules))
    assert not problems, "imports against the concept layers:\n" + "\n".join(problems)


def test_project_has_no_import_cycles() -> None:
    modules = find_modules(ROOT, [pkg for line in LAYERS for pkg in line])
    cycles = import_cycles(ROOT, modules, module_edges(ROOT, modules))
    new = [str(c) for c in cycles if c.members not in PENDING_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(new)
    gone = [sorted(members) for members in PENDING_CYCLES if members not in {c.members for c in cycles}]
    assert not gone, f"these cycles are broken now; remove them from PENDING_CYCLES: {gone}"


def test_import_linter_contracts_state_the_same_layers() -> None:
    tomllib = pytest.importorskip("tomllib")
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert sorted(cfg["root_packages"]) == sorted(pkg for line in LAYERS for pkg in line)
    contracts = {c["type"]: c for c in cfg["contracts"] if "containers" not in c}
    assert [tuple(p.strip() for p in line.split("|")) for line in contracts["layers"]["layers"]] == list(LAYERS)
    inner = {c["containers"][0]: c for c in cfg["contracts"] if "containers" in c}
    assert sorted(inner) == sorted(CONCEPT_LAYERS)
    for package, lines in CONCEPT_LAYERS.items():
        stated = [tuple(p.strip() for p in line.split("|")) for line in inner[package]["layers"]]
        assert inner[package]["type"] == "layers" and stated == list(lines), package
    assert sorted(contracts["acyclic_siblings"]["ancestors"]) == sorted(cfg["root_packages"])
    for ignored in contracts["acyclic_siblings"].get("ignore_imports", []):  # only imports of pending cycles
        source, target = (m.strip() for m in ignored.split("->"))
        assert any({source, target} <= members for members in PENDING_CYCLES), ignored


# -- the checker itself, on small synthetic trees -------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_checker_accepts_a_clean_tree(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "clawgym_env/__init__.py": "",
        "clawgym_env/task.py": "import json\n",
        "tasks/__init__.py": "from tasks import loader\n",
        "tasks/loader.py": "from clawgym_env.task import Task\nfrom . import helpers\n",
        "tasks/helpers.py": "from clawgym_env import task\n",
        "tasks/data/reward/check.py": "import harness_adapters\n",  # task data, not a module
        "harness_adapters/__init__.py": "",
        "clawgym_cli/__init__.py": "import tasks, harness_adapters\nfrom trainers import grpo\n",
        "trainers/__init__.py": "",
        "trainers/grpo.py": "from tasks.loader import helpers\n",
    })
    assert check_tree(root) == []


def test_checker_reports_an_import_pointing_up_even_inside_a_function(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "clawgym_env/__init__.py": "",
        "clawgym_env/env.py": "def make():\n    from tasks.suites import load\n    return load\n",
        "tasks/__init__.py": "",
        "tasks/suites.py": "",
    })
    problems = check_tree(root)
    assert len(problems) == 1
    assert "clawgym_env/env.py:2: clawgym_env.env imports tasks.suites (layer tasks is above clawgym_env)" \
        in problems[0]


def test_checker_reports_siblings_and_type_checking_imports(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "clawgym_env/__init__.py": "",
        "tasks/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import harness_adapters.x\n",
        "harness_adapters/__init__.py": "",
        "harness_adapters/x.py": "",
        "leaderboards/__init__.py": "",
        "leaderboards/board.py": "from ..trainers import grpo\n",
        "trainers/__init__.py": "",
        "trainers/grpo.py": "",
    })
    problems = check_tree(root)
    assert any("tasks/__init__.py:3: tasks imports harness_adapters.x (tasks and harness_adapters are "
               "independent siblings)" in p for p in problems), problems
    assert any("leaderboards.board imports trainers.grpo" in p for p in problems), problems
    assert len(problems) == 2


def test_checker_reports_a_concept_importing_up_or_across(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "clawgym_env/__init__.py": "",
        "clawgym_env/files/__init__.py": "",
        "clawgym_env/files/walk.py": "from clawgym_env.sandbox.base import Sandbox\n",  # up
        "clawgym_env/sandbox/__init__.py": "",
        "clawgym_env/sandbox/base.py": "from clawgym_env.policy import base\n",  # across
        "clawgym_env/policy/__init__.py": "",
        "clawgym_env/policy/base.py": "from clawgym_env import errors\n",  # a seam module: free
        "clawgym_env/errors.py": "",
    })
    problems = check_tree(root)
    assert len(problems) == 2, problems
    assert any("clawgym_env.files.walk imports clawgym_env.sandbox.base (concept clawgym_env.sandbox is above "
               "clawgym_env.files)" in p for p in problems), problems
    assert any("clawgym_env.sandbox and clawgym_env.policy are independent siblings" in p for p in problems), problems


def test_checker_reports_a_cycle_with_its_modules(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "clawgym_env/__init__.py": "",
        "clawgym_env/policy/__init__.py": "",
        "clawgym_env/policy/a.py": "from clawgym_env.policy import b\n",
        "clawgym_env/policy/b.py": "def f():\n    from . import c\n",
        "clawgym_env/policy/c.py": "import clawgym_env.policy.a as a\n",
        "clawgym_env/policy/d.py": "from clawgym_env.policy.a import x\n",  # into the cycle, not part of it
    })
    problems = check_tree(root)
    assert len(problems) == 1, problems
    assert problems[0].startswith("cycle among clawgym_env.policy.a, clawgym_env.policy.b, clawgym_env.policy.c:")
    assert "clawgym_env.policy.b -> clawgym_env.policy.c (clawgym_env/policy/b.py:2)" in problems[0]


def test_checker_counts_a_package_init_that_imports_back(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "clawgym_env/__init__.py": "from clawgym_env.env import Env\n",
        "clawgym_env/env.py": "from clawgym_env import Env2\n",  # a name of the package, not a module
    })
    assert check_tree(root) == [
        "cycle among clawgym_env, clawgym_env.env: clawgym_env -> clawgym_env.env (clawgym_env/__init__.py:1); "
        "clawgym_env.env -> clawgym_env (clawgym_env/env.py:1)"]


@pytest.mark.parametrize("graph,expected", [
    ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"], ["c"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, [["a"], ["b"], ["c"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}}, [["a", "b", "c"], ["d", "e"]]),
])
def test_strongly_connected_components(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert sorted(strongly_connected(sorted(graph), graph)) == expected
