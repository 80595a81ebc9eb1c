"""The harness seam's shared parts, without running a harness: the npm base class
(:class:`harness_adapters.npm.NpmHarnessAdapter`: install, paths, Node, ``missing``), the seam's
default ``missing``, and how the conformance check finds its probe task and dialect parsers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawgym_env.errors import HarnessError, TaskError
from clawgym_env.harness import Endpoint, HarnessAdapter, HarnessOutput, LaunchSpec
from clawgym_env.plugins import harnesses, make_harness
from clawgym_env.task import Task
from harness_adapters import install
from harness_adapters.check import parsed_messages, probe_task
from harness_adapters.install import MARKER, NODE24, NpmPackage, prefix_for
from harness_adapters.npm import NpmHarnessAdapter

NPM_HARNESSES = {"openclaw": 24, "claude-code": None, "codex": None, "qwen-code": 22}


class FakeNpm(NpmHarnessAdapter):
    name = "fake-npm"
    package = NpmPackage("@clawgym/fake", "1.2.3", "fake", min_node=22)

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        return LaunchSpec(argv=[str(self.node()), str(self.entry())])

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        return HarnessOutput(final_message=stdout or None)


def _fake_install(pkg: NpmPackage, cache: Path) -> Path:
    """What a finished ``npm install`` leaves: the marker and the resolved ``.bin`` link."""
    prefix = prefix_for(pkg, cache)
    target = prefix / "node_modules" / pkg.name / "bin" / pkg.bin
    target.parent.mkdir(parents=True)
    target.write_text("#!/bin/sh\n")
    (prefix / "node_modules" / ".bin").mkdir(parents=True)
    (prefix / "node_modules" / ".bin" / pkg.bin).symlink_to(target)
    (prefix / MARKER).write_text(json.dumps({"package": pkg.name, "version": pkg.version}))
    return target


@pytest.fixture
def no_system_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install.shutil, "which", lambda name: None)


@pytest.mark.parametrize("name,min_node", sorted(NPM_HARNESSES.items()))
def test_each_npm_harness_declares_only_its_package(name: str, min_node: int | None, tmp_path: Path) -> None:
    cls = harnesses.load(name)
    assert issubclass(cls, NpmHarnessAdapter) and cls.package.min_node == min_node
    for method in ("install", "ro_paths", "missing", "node", "entry", "prefix"):
        assert method not in vars(cls), f"{cls.__name__} redefines {method}; the npm base owns it"
    adapter = make_harness(name, cache_dir=str(tmp_path))
    assert adapter.prefix() == prefix_for(cls.package, tmp_path)
    assert adapter.missing() == f"{cls.package.spec} is not installed (run `clawgym harness install {name}`)"
    with pytest.raises(HarnessError, match="is not installed; run `clawgym harness install`"):
        adapter.entry()


def test_the_seam_default_is_runnable() -> None:
    assert HarnessAdapter.missing is not NpmHarnessAdapter.missing
    assert make_harness("mini").missing() is None


def test_missing_names_node_when_the_package_is_there_but_node_is_not(tmp_path: Path, no_system_node: None) -> None:
    adapter = FakeNpm(cache_dir=tmp_path)
    entry = _fake_install(FakeNpm.package, tmp_path)
    assert adapter.entry() == entry.resolve()
    why = adapter.missing()
    assert why is not None and why.startswith("fake-npm needs Node >= 22") and "clawgym harness install fake-npm" in why
    node = _fake_install(NODE24, tmp_path)  # npm's node@24 in the cache is enough
    assert adapter.missing() is None
    assert adapter.node() == node.resolve()
    assert adapter.ro_paths() == [prefix_for(FakeNpm.package, tmp_path), prefix_for(NODE24, tmp_path)]


def test_a_native_harness_needs_no_node(tmp_path: Path, no_system_node: None) -> None:
    adapter = make_harness("claude-code", cache_dir=tmp_path)
    _fake_install(adapter.package, tmp_path)
    assert adapter.missing() is None  # no Node anywhere, and none needed
    assert adapter.ro_paths() == [prefix_for(adapter.package, tmp_path)]
    assert adapter.executable().startswith(str(prefix_for(adapter.package, tmp_path)))


def test_install_provides_node_first_and_adopts_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         no_system_node: None) -> None:
    done: list[str] = []

    def fake_npm_install(pkg: NpmPackage, cache_dir: object = None, **_kw: object) -> Path:
        done.append(pkg.name)
        if not install.is_installed(pkg, cache_dir):  # type: ignore[arg-type]
            _fake_install(pkg, Path(str(cache_dir)))
        return prefix_for(pkg, cache_dir)  # type: ignore[arg-type]

    monkeypatch.setattr(install, "npm_install", fake_npm_install)
    monkeypatch.setattr("harness_adapters.npm.npm_install", fake_npm_install)
    adapter = FakeNpm()
    adapter.install(tmp_path)
    assert done == ["node", "@clawgym/fake"]
    assert adapter.cache_dir == str(tmp_path) and adapter.missing() is None
    assert adapter.entry() == (prefix_for(FakeNpm.package, tmp_path) / "node_modules" / "@clawgym/fake" / "bin"
                               / "fake").resolve()
    adapter.install(tmp_path)  # idempotent
    assert adapter.missing() is None


def test_probe_task_through_the_suite_registry(builtin_suite) -> None:
    task = probe_task("builtin/csv_total")
    assert task.id == "csv_total" and task.suite == "builtin"
    assert probe_task(task) is task
    by_dir = probe_task(str(builtin_suite.get("csv_total").task_dir))
    assert by_dir.id == "csv_total" and by_dir.instruction == task.instruction
    with pytest.raises(HarnessError, match="must be SUITE/ID"):
        probe_task("csv_total")
    with pytest.raises(TaskError):
        probe_task("builtin/no_such_task")


def test_parsed_messages_uses_the_registered_dialect() -> None:
    class Call:
        dialect = "anthropic_messages"
        request = {"model": "m", "max_tokens": 5, "system": "be brief",
                   "messages": [{"role": "user", "content": "hi"}]}

    messages, tools = parsed_messages(Call())  # type: ignore[arg-type]
    assert [m["role"] for m in messages] == ["system", "user"] and tools == []
