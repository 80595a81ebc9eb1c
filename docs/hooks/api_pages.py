"""MkDocs hook: the pages that are generated at build time, so they never go stale.

* **API reference** (``docs/api/``). One page per public module of the packages in :data:`PACKAGES`,
  found by walking the source tree (no hand-kept list: modules move between folders and the reference
  follows). Each page is a ``::: module`` block that mkdocstrings fills from the docstrings; Griffe
  reads the source statically, so nothing here imports the packages (torch, vLLM, Ray stay optional).
  Skipped: task data folders (:data:`SKIP_DIRS`), any ``reward/`` folder, folders without an
  ``__init__.py``, private modules (``_name.py``) and ``__main__``. The pages are added to the nav under
  the ``api/index.md`` entry of ``mkdocs.yml``, one section per package.
* **CLI reference**. A ``<!-- clawgym:cli -->`` line in a page is replaced by the ``--help`` text of
  every ``clawgym`` subcommand, taken from the real argument parser (``clawgym_cli.main.build_parser``).
* **Config fields**. A ``<!-- clawgym:config ALGO -->`` line is replaced by every field of that
  algorithm's config, as ``clawgym train --help-config ALGO`` prints them (this one imports the
  algorithm's module, hence torch: the docs build runs where the project is installed).
* **Record fields**. A ``<!-- clawgym:model module:Name -->`` line is replaced by a table of the fields
  of that pydantic model (name, type, default, description), e.g. ``clawgym_env:EpisodeRecord``.

A generator that fails is a build warning naming the cause, so ``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.nav import Navigation, Section
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.clawgym")

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["clawgym_env", "tasks", "harness_adapters", "trainers", "leaderboards"]
SKIP_DIRS = {"tasks/builtin", "tasks/families", "tasks/fixtures"}
API_DIR = "api"
HELP_WIDTH = "100"

_modules: list[str] = []  # dotted names of the generated pages, in walk order


def _is_skipped(rel_dir: str, name: str) -> bool:
    rel = f"{rel_dir}/{name}" if rel_dir else name
    return name in ("reward", "__pycache__") or name.startswith((".", "_")) or rel in SKIP_DIRS


def _walk(package: str) -> list[str]:
    """Dotted names of the public modules under ``package`` (itself first), packages before their modules."""
    found: list[str] = []

    def visit(folder: Path, dotted: str) -> None:
        if not (folder / "__init__.py").is_file():
            return
        found.append(dotted)
        rel_dir = folder.relative_to(ROOT).as_posix()
        entries = sorted(folder.iterdir(), key=lambda p: p.name)
        for path in entries:
            if path.is_file() and path.suffix == ".py" and not path.name.startswith("_"):
                found.append(f"{dotted}.{path.stem}")
        for path in entries:
            if path.is_dir() and not _is_skipped(rel_dir, path.name):
                visit(path, f"{dotted}.{path.name}")

    visit(ROOT / package, package)
    return found


def _page_uri(module: str, is_package: bool) -> str:
    parts = module.split(".")
    return "/".join([API_DIR, *parts, "index.md"] if is_package else [API_DIR, *parts[:-1], parts[-1] + ".md"])


def _is_package(module: str) -> bool:
    return (ROOT.joinpath(*module.split(".")) / "__init__.py").is_file()


def _summary(module: str) -> str:
    """The first line of a module's docstring, read without importing it."""
    import ast

    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError):
        return ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", first).replace("``", "`")


def on_files(files: Files, config) -> Files:
    """Add one generated page per public module, and the API index."""
    _modules.clear()
    rows = []
    for package in PACKAGES:
        for module in _walk(package):
            _modules.append(module)
            uri = _page_uri(module, _is_package(module))
            title = module
            content = f"# `{title}`\n\n::: {module}\n"
            files.append(File.generated(config, uri, content=content, inclusion=InclusionLevel.NOT_IN_NAV))
        rows.append(f"| [`{package}`]({package}/index.md) | {_summary(package)} |")
    index = ("# API reference\n\n"
             "Generated from the docstrings of the packages at build time: one page per public module "
             "(private `_name` modules and task data folders are left out). The public API for users is "
             "importable from `clawgym_env` itself (see its page).\n\n"
             "| package | what it is |\n|---|---|\n" + "\n".join(rows) + "\n")
    files.append(File.generated(config, f"{API_DIR}/index.md", content=index))
    return files


def _pages_of(items: list) -> list[Page]:
    out: list[Page] = []
    for item in items:
        if isinstance(item, Page):
            out.append(item)
        elif isinstance(item, Section):
            out.extend(_pages_of(item.children))
    return out


def _set_parents(items: list, parent: Section | None) -> None:
    for item in items:
        item.parent = parent
        if isinstance(item, Section):
            _set_parents(item.children, item)


def on_nav(nav: Navigation, config, files: Files) -> Navigation:
    """Replace the ``api/index.md`` nav entry by a section: the index, then one section per package."""
    sections: dict[str, Section] = {}
    root = Section("API reference", [])
    for module in _modules:
        file = files.get_file_from_path(_page_uri(module, _is_package(module)))
        if file is None:
            continue
        name = module.rsplit(".", 1)[-1]
        parent_name = module.rsplit(".", 1)[0] if "." in module else None
        container = sections[parent_name] if parent_name in sections else root
        if _is_package(module):
            section = Section(name, [Page(name, file, config)])
            sections[module] = section
            container.children.append(section)
        else:
            container.children.append(Page(name, file, config))

    def replace(items: list) -> bool:
        for i, item in enumerate(items):
            if isinstance(item, Page) and item.file.src_uri == f"{API_DIR}/index.md":
                root.children.insert(0, Page("Overview", item.file, config))
                items[i] = root
                return True
            if isinstance(item, Section) and replace(item.children):
                return True
        return False

    if not replace(nav.items):
        log.warning("mkdocs.yml's nav has no `api/index.md` entry: the API reference pages are not in the nav")
        return nav
    _set_parents(nav.items, None)
    pages = _pages_of(nav.items)
    for prev, page in zip([None, *pages], pages):
        page.previous_page = prev
        if prev is not None:
            prev.next_page = page
    if pages:
        pages[-1].next_page = None
    return Navigation(nav.items, pages)


# ---------------------------------------------------------------------------------------------------
# CLI and config references
# ---------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _importable():
    """The project importable from its source tree, and argparse's help at a fixed width."""
    saved_path, saved_cols = list(sys.path), os.environ.get("COLUMNS")
    sys.path.insert(0, str(ROOT))
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        yield
    finally:
        sys.path[:] = saved_path
        if saved_cols is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved_cols


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def cli_reference() -> str:
    """Every ``clawgym`` (sub)command's ``--help``, one section each, depth first."""
    with _importable():
        from clawgym_cli.main import build_parser

        out: list[str] = []

        def visit(parser: argparse.ArgumentParser, words: list[str], level: int) -> None:
            title = " ".join(words)
            out.append(f"{'#' * level} `{title}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
            for name, sub in _subcommands(parser):
                visit(sub, [*words, name], min(level + 1, 4))

        visit(build_parser(), ["clawgym"], 2)
    return "\n".join(out)


_MD_SPECIAL = re.compile(r"([\\*_<>\[\]|])")


def _escape(text: str) -> str:
    """Markdown-safe prose: backtick spans kept, other special characters escaped."""
    parts = re.split(r"(``.+?``|`[^`]+`)", text)
    return "".join(p if i % 2 else _MD_SPECIAL.sub(r"\\\1", p) for i, p in enumerate(parts))


def _algorithm_module(algo: str):
    """The module of algorithm ``algo``, as this checkout's ``pyproject.toml`` declares it (the installed
    entry points may be stale in a development install); the plugin registry where TOML cannot be read."""
    import importlib

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = None
    if tomllib is not None:
        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        target = project.get("entry-points", {}).get("clawgym.algorithms", {}).get(algo)
        if target is None:
            raise KeyError(f"pyproject.toml declares no algorithm {algo!r} (clawgym.algorithms)")
        module_name, _, attr = target.partition(":")
        module = importlib.import_module(module_name)
        return getattr(module, attr) if attr else module
    from trainers.train import algorithm

    return algorithm(algo)


def config_reference(algo: str) -> str:
    """The fields of ``algo``'s config as a list: ``key`` (type, default), then its docstring."""
    with _importable():
        from trainers.config_doc import describe

        text = describe(_algorithm_module(algo).Args)
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("    "):  # the docstring of the field above: the definition's second paragraph
            out.append(f"    {_escape(line.strip())}\n")
            continue
        m = re.match(r"^(\S+): (.*) = (.*)$", line)
        if m is None:
            raise ValueError(f"unexpected line in describe() output: {line!r}")
        key, typ, default = m.groups()
        default = "see below" if default == "'(see below)'" else f"`{default}`"
        out.append(f"\n`{key}`\n:   `{typ}`, default {default}\n\n")
    return "".join(out).lstrip("\n") + "\n"


def _type_text(annotation: object) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = (text or str(annotation)).replace("typing.", "").replace("NoneType", "None")
    return re.sub(r"\b(?:[a-z_]\w*\.)+(?=[A-Z])", "", text)  # clawgym_env.capture.records.X -> X


def model_reference(target: str) -> str:
    """A table of the fields of the pydantic model ``module:Name``: name, type, default, description."""
    import importlib

    import pydantic_core

    module_name, _, attr = target.partition(":")
    with _importable():
        model = getattr(importlib.import_module(module_name), attr)
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if field.is_required():
            default = "required"
        elif field.default_factory is not None:
            default = f"`{field.default_factory()!r}`"
        elif field.default is pydantic_core.PydanticUndefined:
            default = "required"
        else:
            default = f"`{field.default!r}`"
        meaning = _escape(" ".join((field.description or "").split()))
        rows.append(f"| `{name}` | `{_type_text(field.annotation)}` | {default} | {meaning} |")
    return "\n".join(rows) + "\n"


_CLI_MARK = re.compile(r"^<!-- clawgym:cli -->$", re.M)
_CONFIG_MARK = re.compile(r"^<!-- clawgym:config (\w+) -->$", re.M)
_MODEL_MARK = re.compile(r"^<!-- clawgym:model ([\w.]+:\w+) -->$", re.M)


def on_page_markdown(markdown: str, page: Page, config, files: Files) -> str:
    """Fill the ``clawgym:cli``, ``clawgym:config ALGO`` and ``clawgym:model module:Name`` markers."""
    def generate(what: str, fn, *args) -> str:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - any failure becomes one build warning naming it
            log.warning("%s: could not generate the %s reference: %s: %s", page.file.src_uri, what,
                        type(exc).__name__, exc)
            return f"*(the {what} reference could not be generated in this build)*"

    if _CLI_MARK.search(markdown):
        markdown = _CLI_MARK.sub(lambda m: generate("CLI", cli_reference), markdown)
    markdown = _CONFIG_MARK.sub(lambda m: generate(f"{m.group(1)} config", config_reference, m.group(1)), markdown)
    markdown = _MODEL_MARK.sub(lambda m: generate(m.group(1), model_reference, m.group(1)), markdown)
    return markdown

