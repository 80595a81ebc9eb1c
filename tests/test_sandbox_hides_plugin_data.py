"""Reward integrity: a sandbox never shows the task data of a plugin distribution that ships suites or graders.

The attack: a plugin package installed non-editable sits in ``site-packages``, under the interpreter prefix every
sandbox shows read-only, so an agent could read its suites' ``expert.json`` / ``data_entry.json`` by their real
path. Every distribution declaring ``clawgym.suites`` or ``clawgym.graders`` entry points has its folders in
``SandboxSpec.hidden_paths`` (found from metadata, nothing imported), and both backends mask them; a path a
harness names in ``ro_paths`` strictly inside (its agent file) still shows, and nothing beside it.

The example plugin package (``examples/clawgym_example_plugins``) is installed editable here: its folder is made
visible the way a ``site-packages`` install is (a read-only path of the sandbox), and a real non-editable install
of it is made into a temporary ``site-packages`` with pip. Tests skip, with the reason, where bwrap, the example
package or a Docker engine is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox.base import (
    SandboxSpec,
    default_hidden_paths,
    host_toolchain_paths,
    own_package_paths,
    plugin_data_paths,
)
from clawgym_env.sandbox.bwrap.sandbox import BwrapSandbox, check_bwrap
from clawgym_env.sandbox.docker.host import plan_ro_mounts

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "clawgym_example_plugins"
PKG = PROJECT / "clawgym_example_plugins"
AGENT = PKG / "agent.py"
SUITE_FILES = [PKG / "suite_data" / t / f for t in ("greeting", "total") for f in ("expert.json", "data_entry.json")]
FIND = "find {root} \\( -name expert.json -o -name data_entry.json -o -name 'grader.py' \\) 2>/dev/null"
SYSTEM = [Path(p) for p in ("/usr", "/bin", "/lib", "/lib64") if Path(p).exists()]
pytestmark = pytest.mark.timeout(600)
needs_example = pytest.mark.skipif(importlib.util.find_spec("clawgym_example_plugins") is None,
                                   reason="the example plugin package is not installed: "
                                          "pip install -e examples/clawgym_example_plugins")


def bwrap_problem() -> str | None:
    """None when bwrap sandboxes run here, else why not."""
    try:
        check_bwrap(True)
        return None
    except SandboxError as exc:
        return str(exc)


needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bwrap cannot run here: {bwrap_problem()}")


@pytest.fixture
def roots() -> Iterator[Path]:
    """Host folder for the sandboxes' private places (enterable by the sandbox uids)."""
    d = Path(tempfile.mkdtemp(prefix="cg-roots-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-readable temporary folder (the sandbox uid is not this user: pytest's tmp is private)."""
    d = Path(tempfile.mkdtemp(prefix="cg-plugin-data-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def ws_in(parent: Path) -> Path:
    """A workspace folder ``parent/runs/ep/ws`` (its episode and run folders are hidden too)."""
    ws = parent / "runs" / "ep" / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    return ws


def write(path: Path, text: str) -> Path:
    """``text`` into ``path`` (parents made world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def make_dist(site: Path, name: str, files: dict[str, str], *, entry_points: str,
              direct_url: dict[str, object] | None = None) -> None:
    """A distribution installed in ``site``: its files, a dist-info with METADATA, entry points and a RECORD
    (plus lines a real RECORD holds outside the package: a script in ``../../bin`` and a cache file)."""
    for rel, text in files.items():
        write(site / rel, text)
    info = site / f"{name}-1.0.dist-info"
    write(info / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    write(info / "entry_points.txt", entry_points)
    record = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD", "../../bin/" + name, "__pycache__/x.pyc"]
    if direct_url is not None:
        write(info / "direct_url.json", json.dumps(direct_url))
        record.append(f"{info.name}/direct_url.json")
    write(info / "RECORD", "".join(f"{r},,\n" for r in record))


def open_all(root: Path) -> None:
    """Every folder under ``root`` 0755 and file 0644 (readable by the sandbox uid)."""
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


# ---------- discovery from metadata --------------------------------------------------------------------


@needs_example
def test_the_example_plugin_folders_are_found_without_importing_them():
    """In a fresh interpreter: the example's package folder and its editable project folder are hidden by
    default, and nothing of the example package was imported to find them."""
    code = ("import sys, json; from clawgym_env.sandbox.base import SandboxSpec;"
            "spec = SandboxSpec(workspace_host='.');"
            "print(json.dumps([[str(p) for p in spec.hidden_paths],"
            " sorted(m for m in sys.modules if m.startswith('clawgym_example_plugins'))]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tempfile.gettempdir(),
                          timeout=120, check=True)
    hidden, imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert str(PKG) in hidden and str(PROJECT) in hidden, hidden
    assert imported == []
    assert {PKG, PROJECT} <= set(default_hidden_paths())
    assert set(own_package_paths()) <= set(default_hidden_paths())


def test_a_synthetic_dist_info_declaring_a_suite_has_its_package_folders_hidden(shared, monkeypatch):
    """RECORD decides what a distribution installed; a namespace package hides only this distribution's part;
    a distribution without those entry points, the stdlib and a foreign module an entry point names stay."""
    site = shared / "site"
    boom = "raise RuntimeError('imported while looking for folders to hide')\n"
    make_dist(site, "acme_suites", {"acme_suites/__init__.py": boom, "acme_suites/data/t1/expert.json": "{}",
                                    "acme_suites/harness/agent.py": "print('agent ok')\n"},
              entry_points="[clawgym.suites]\nacme = acme_suites.suite:load\n")
    make_dist(site, "acme_graders", {"nsp/acme_graders/__init__.py": boom, "nsp/acme_graders/reward.py": "X = 1\n"},
              entry_points="[clawgym.graders]\nacme = nsp.acme_graders:Grader\n")
    make_dist(site, "nsp_other", {"nsp/other/__init__.py": "Y = 2\n"}, entry_points="")
    make_dist(site, "plain_lib", {"plain_lib/__init__.py": "Z = 3\n"},
              entry_points="[console_scripts]\nplain = plain_lib:main\n")
    project = shared / "proj"  # an editable install: its project folder and its source folder
    write(project / "src" / "acme_editable" / "__init__.py", boom)
    make_dist(site, "acme_editable", {}, entry_points="[clawgym.graders]\ne = acme_editable:G\nj = json:dumps\n",
              direct_url={"url": project.as_uri(), "dir_info": {"editable": True}})
    monkeypatch.syspath_prepend(str(project / "src"))
    found = set(plugin_data_paths([str(site)]))
    assert found == {site / "acme_suites", site / "nsp" / "acme_graders", project, project / "src" / "acme_editable"}
    assert not any(m.startswith(("acme", "nsp")) for m in sys.modules)


# ---------- the attack, bwrap ------------------------------------------------------------------------------


def bwrap_exec(spec: SandboxSpec, roots: Path, script: str) -> str:
    """Run ``sh -c script`` in a bwrap sandbox of ``spec``; its stdout (asserting it ran)."""
    with BwrapSandbox(spec, tmp_root=roots) as sb:
        res = sb.exec(["sh", "-c", script + "; true"], timeout=120)
    assert res.returncode == 0 and not res.timed_out, res
    return res.stdout


READ_SUITE = "; ".join(f"cat {f} 2>/dev/null && echo READ:{f}" for f in SUITE_FILES)


@needs_bwrap
@needs_example
@pytest.mark.parametrize("visible", [[PROJECT, AGENT], [PROJECT, AGENT, PKG], [PROJECT.parent, AGENT], [PKG]],
                         ids=["project+agent-file", "and-its-package", "examples+agent-file", "package-only"])
def test_bwrap_an_agent_cannot_read_the_example_suite_where_its_folder_is_visible(roots, shared, visible):
    """The example's folder visible read-only (as site-packages is): no suite file reads, none is found, the
    package shows only the agent file the harness names; a harness naming the package folder itself shows
    nothing of it. The control (only our own packages hidden, as before) reads them: the attack is real."""
    spec_kw = dict(workspace_host=ws_in(shared), ro_paths=[*host_toolchain_paths(), *visible])
    shown = AGENT.name if AGENT in visible else ""
    out = bwrap_exec(SandboxSpec(**spec_kw), roots,
                     f"{READ_SUITE}; {FIND.format(root=visible[0])}; echo LS:$(ls -A {PKG}); head -1 {AGENT}")
    assert "READ:" not in out and "expert.json" not in out and "data_entry.json" not in out, out
    assert f"LS:{shown}\n" in out and (AGENT.read_text().splitlines()[0] in out) == bool(shown), out
    control = bwrap_exec(SandboxSpec(**spec_kw, hidden_paths=own_package_paths()), roots, READ_SUITE)
    assert control.count("READ:") == len(SUITE_FILES), control


@pytest.fixture(scope="module")
def wheel_site() -> Iterator[Path]:
    """A real non-editable install of the example package (built from a copy with pip) in a temporary
    site-packages, world-readable."""
    d = Path(tempfile.mkdtemp(prefix="cg-wheel-site-"))
    try:
        src = d / "src"
        shutil.copytree(PROJECT, src, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build"))
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                               "--no-index", "--target", str(d / "site"), str(src)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            pytest.skip(f"cannot build the example package here: {proc.stderr.strip()[-400:]}")
        open_all(d)
        yield d / "site"
    finally:
        shutil.rmtree(d, ignore_errors=True)


@needs_bwrap
@needs_example
def test_bwrap_a_non_editable_install_in_a_visible_site_packages_is_hidden(roots, shared, wheel_site):
    """pip's own install (its RECORD) in a visible site-packages: the package folder is found and masked;
    the agent file a harness names still shows; the control shows the suite."""
    pkg = wheel_site / "clawgym_example_plugins"
    assert plugin_data_paths([str(wheel_site)]) == [pkg]
    files = [pkg / "suite_data" / "greeting" / f for f in ("expert.json", "data_entry.json")]
    script = "; ".join(f"cat {f} >/dev/null 2>&1 && echo READ" for f in files)
    script += f"; {FIND.format(root=wheel_site)}; echo LS:$(ls -A {pkg}); head -c 3 {pkg / 'agent.py'}"
    spec_kw = dict(workspace_host=ws_in(shared), ro_paths=[*SYSTEM, wheel_site, pkg / "agent.py"])
    out = bwrap_exec(SandboxSpec(**spec_kw, hidden_paths=[*own_package_paths(), *plugin_data_paths([str(wheel_site)])]),
                     roots, script)
    assert "READ" not in out and ".json" not in out and "LS:agent.py\n" in out and out.endswith('"""'), out
    control = bwrap_exec(SandboxSpec(**spec_kw, hidden_paths=own_package_paths()), roots, script)
    assert control.count("READ") == 2, control


@needs_bwrap
def test_bwrap_the_synthetic_plugin_folders_are_masked_and_the_rest_shows(roots, shared):
    site = shared / "site"
    make_dist(site, "acme_suites", {"acme_suites/__init__.py": "", "acme_suites/data/t1/expert.json": '{"a": 42}',
                                    "acme_suites/harness/agent.py": "print('agent ok')\n"},
              entry_points="[clawgym.suites]\nacme = acme_suites.suite:load\n")
    make_dist(site, "plain_lib", {"plain_lib/__init__.py": "Z = 3\n"}, entry_points="")
    open_all(shared)
    agent = site / "acme_suites" / "harness" / "agent.py"
    spec = SandboxSpec(workspace_host=ws_in(shared), ro_paths=[*SYSTEM, site, agent],
                       hidden_paths=plugin_data_paths([str(site)]))
    out = bwrap_exec(spec, roots, f"{FIND.format(root=site)}; cat {site}/acme_suites/data/t1/expert.json 2>&1;"
                                  f" cat {agent} {site}/plain_lib/__init__.py")
    assert "42" not in out and not any(line.endswith("expert.json") for line in out.splitlines()), out
    assert "print('agent ok')\nZ = 3\n" in out, out


# ---------- the attack, Docker -----------------------------------------------------------------------------


@needs_example
def test_docker_plan_drops_and_masks_the_plugin_folders(shared):
    """The Docker mount plan (no engine needed): the project folder a ro path names is dropped, the package
    under a visible folder is masked, the agent file is bound."""
    binds, masks = plan_ro_mounts([*SYSTEM, PROJECT, AGENT], default_hidden_paths(), ws_in(shared))
    assert str(PROJECT) not in binds and binds[str(AGENT)] == str(AGENT)
    binds, masks = plan_ro_mounts([*SYSTEM, PROJECT.parent, AGENT], default_hidden_paths(), ws_in(shared))
    assert {str(PROJECT), str(PKG)} <= set(masks) and binds[str(AGENT)] == str(AGENT)


@pytest.mark.docker
@needs_example
def test_docker_an_agent_cannot_read_the_example_suite_where_its_folder_is_visible(shared):
    try:
        from helpers_docker import require_engine
    except ImportError:  # tests run as a package
        from tests.helpers_docker import require_engine
    require_engine()
    from clawgym_env.sandbox.docker.sandbox import DockerSandbox

    spec_kw = dict(workspace_host=ws_in(shared), ro_paths=[*host_toolchain_paths(), PROJECT.parent, AGENT])
    script = f"{READ_SUITE}; {FIND.format(root=PROJECT.parent)}; echo LS:$(ls -A {PKG}); head -1 {AGENT}"
    with DockerSandbox(SandboxSpec(**spec_kw)) as sb:
        out = sb.exec(["sh", "-c", script], timeout=300)
    assert out.returncode == 0 and "READ:" not in out.stdout and ".json" not in out.stdout, out
    assert f"LS:{AGENT.name}\n" in out.stdout and AGENT.read_text().splitlines()[0] in out.stdout, out
    with DockerSandbox(SandboxSpec(**spec_kw, hidden_paths=own_package_paths())) as sb:
        control = sb.exec(["sh", "-c", READ_SUITE], timeout=300)
    assert control.stdout.count("READ:") == len(SUITE_FILES), control


# ---------- through the harness: the suite still scores, a cheating agent finds nothing --------------------


def clawgym(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``clawgym ARGS`` in ``cwd`` with the example project visible in every sandbox (as site-packages is)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "CLAWGYM_SANDBOX_RO_PATHS": str(PROJECT)}
    proc = subprocess.run([sys.executable, "-m", "clawgym_cli", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)
    assert proc.returncode == 0, f"clawgym {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@needs_bwrap
@needs_example
def test_the_example_harness_still_scores_the_example_suite_and_a_cheat_scores_nothing(tmp_path):
    out = tmp_path / "results.jsonl"
    proc = clawgym("eval", "--suite", "example", "--harness", "example-agent", "--policy", "scripted:expert",
                   "--out", str(out), "--no-progress", cwd=tmp_path)
    results = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert sorted(r["task_id"] for r in results) == ["greeting", "total"], proc.stdout
    assert all(r["status"] == "ok" and r["reward"] == 1.0 for r in results), results
    expert, entry = SUITE_FILES[0], SUITE_FILES[1]
    cheat = tmp_path / "cheat.json"  # copy the expected greeting out of the task's own files
    cheat.write_text(json.dumps({"steps": [
        {"tool": "bash", "command": f"grep -ho 'Hello, [A-Z][a-z]*!' {expert} {entry} | head -1 > greeting.txt"},
        {"final": "done"}]}))
    proc = clawgym("run", "--harness", "example-agent", "--task", "example/greeting", "--policy",
                   f"scripted:file:{cheat}", "--json", "--out", str(tmp_path / "eps"), cwd=tmp_path)
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["status"] == "ok" and record["subscores"]["file:greeting.txt"] == 0.0, record
