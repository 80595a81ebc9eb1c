"""The public algorithm API (:mod:`trainers.api`): its names are pinned, importable, the home modules' own
objects, and each documented; the contract its docstring states is the one ``clawgym train`` enforces."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

import trainers.api as api
from trainers.train import algorithm

PINNED = {
    "CallTree", "CleanConfig", "ConfigError", "EpisodePair", "EpisodeResult", "ExpertCounts", "Group",
    "InProcessSync", "MetricsLogger", "MetricsRow", "PackEpisode", "PackItem", "PackedTree", "PolicyConfig",
    "RLArgs", "RunArgs", "Runtime", "SamplingOverrides", "TrainPack", "TrainSummary", "TrainablePolicy",
    "as_episode", "build_pack", "build_packs", "draw_jobs", "episodes_tree", "group_advantages", "group_summary",
    "judge_for", "latest_checkpoint", "load_checkpoint", "load_suite", "make_groups", "make_harness",
    "pack_groups", "read_summary", "rollout_metrics", "run_jobs", "save_checkpoint", "token_logprobs",
}
"""Removing a name breaks third-party algorithms: a change here is a deliberate API change."""


def _home_modules() -> dict[str, str]:
    """name → the module ``trainers/api.py`` imports it from (read from its source)."""
    tree = ast.parse(Path(api.__file__).read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
    return out


def _attribute_docstring(module_name: str, name: str) -> str | None:
    """The string literal right under ``name = ...`` in ``module_name``'s source (how aliases are documented)."""
    source = Path(inspect.getfile(importlib.import_module(module_name))).read_text(encoding="utf-8")
    body = ast.parse(source).body
    for node, after in zip(body, body[1:]):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            return after.value.value
    return None


def test_all_is_pinned_and_unique():
    assert len(api.__all__) == len(set(api.__all__))
    assert set(api.__all__) == PINNED


@pytest.mark.parametrize("name", sorted(PINNED))
def test_each_name_is_its_home_modules_object_and_documented(name):
    homes = _home_modules()
    assert name in homes, f"{name} is in __all__ but trainers/api.py does not import it"
    obj = getattr(api, name)
    assert obj is getattr(importlib.import_module(homes[name]), name)
    if inspect.isclass(obj) or inspect.isfunction(obj):
        doc = obj.__doc__
        assert doc and doc.strip(), f"{homes[name]}.{name} has no docstring"
        if inspect.isclass(obj):
            assert doc is not object.__doc__
    else:  # a type alias: documented by the string under its assignment
        assert _attribute_docstring(homes[name], name), f"{homes[name]}.{name} has no docstring under it"


def test_no_import_is_left_out_of_all():
    assert set(_home_modules()) - {"annotations"} == set(api.__all__)


def test_docstring_states_the_contract():
    doc = api.__doc__ or ""
    for phrase in ("``Args``", "dataclass", "``train(args)``", "TrainSummary", "clawgym.algorithms",
                   "metrics.jsonl", "summary.json", "infrastructure failure"):
        assert phrase in doc, phrase
    for name in api.__all__:  # the docstring walks through every piece
        assert name in doc, f"the module docstring never mentions {name}"


@pytest.mark.parametrize("algo", ["grpo", "ppo", "sft"])
def test_bundled_algorithms_keep_the_contract(algo):
    module = algorithm(algo)
    assert dataclasses.is_dataclass(module.Args)
    assert issubclass(module.Args, api.RunArgs)
    assert inspect.signature(module.train).return_annotation in (api.TrainSummary, "TrainSummary")
