"""Broken plugins, found by real entry-point discovery: each case is a real ``*.dist-info`` folder (METADATA and
entry_points.txt) with its module in a folder put on ``sys.path``, read by ``importlib.metadata`` as any
installed distribution is. Every failure is a RegistrationError naming the plugin, its target, its
distribution and the fix; listings mark broken plugins instead of listing them as fine."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clawgym_cli.main import main
from clawgym_env import plugins
from clawgym_env.errors import RegistrationError

GOOD = textwrap.dedent("""
    from clawgym_env.harness import HarnessAdapter, HarnessOutput, LaunchSpec
    class Good(HarnessAdapter):
        name = "cgt-good"
        def launch(self, task, endpoint, *, home): return LaunchSpec(argv=["true"])
        def read_output(self, stdout, stderr): return HarnessOutput(stdout)
""")


def write_dist(root: Path, name: str, version: str, harnesses: dict[str, str], modules: dict[str, str]) -> None:
    """A distribution as pip leaves it: ``<name>-<version>.dist-info`` and its top-level modules."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{k} = {v}\n" for k, v in harnesses.items())
    (info / "entry_points.txt").write_text(f"[clawgym.harnesses]\n{lines}")
    for module, code in modules.items():
        (root / f"{module}.py").write_text(code)


@pytest.fixture
def site(tmp_path):
    """A folder on ``sys.path`` holding the test's distributions; the registry's discovery cache is cleared
    before and after (and the modules the test imported are forgotten)."""
    before = set(sys.modules)
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    plugins.harnesses.refresh()
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in set(sys.modules) - before:
            if name.startswith("cgt_"):
                del sys.modules[name]
        importlib.invalidate_caches()
        plugins.harnesses.refresh()


def fresh(root: Path) -> None:
    importlib.invalidate_caches()
    plugins.harnesses.refresh()
    assert str(root) in sys.path


def test_a_plugin_that_raises_on_import_names_plugin_distribution_and_fix(site):
    write_dist(site, "cgt-broken", "1.2.3", {"cgt-raises": "cgt_raises_mod", "cgt-needs": "cgt_needs_mod:Adapter"},
               {"cgt_raises_mod": "raise RuntimeError('boom while importing')\n",
                "cgt_needs_mod": "import cgt_dependency_not_installed\n"})
    fresh(site)
    assert {"cgt-raises", "cgt-needs"} <= set(plugins.harnesses.names())
    with pytest.raises(RegistrationError) as err:
        plugins.make_harness("cgt-raises")
    msg = str(err.value)
    for part in ("harness 'cgt-raises'", "cgt_raises_mod", "entry point of cgt-broken 1.2.3",
                 "RuntimeError: boom while importing", "reinstall or fix cgt-broken 1.2.3",
                 "pip uninstall cgt-broken"):
        assert part in msg, (part, msg)
    assert isinstance(err.value.__cause__, RuntimeError)
    # a missing *dependency* of an installed plugin is its module raising, not a misnamed entry point
    with pytest.raises(RegistrationError) as err:
        plugins.harnesses.load("cgt-needs")
    msg = str(err.value)
    assert "raised ModuleNotFoundError" in msg and "cgt_dependency_not_installed" in msg and "cgt-broken 1.2.3" in msg
    assert "misnamed" not in msg and isinstance(err.value.__cause__, ModuleNotFoundError)


def test_a_misnamed_attribute_says_so_not_install_the_package(site):
    write_dist(site, "cgt-misnamed", "0.1", {"cgt-misattr": "cgt_good_mod:NoSuchAdapter", "cgt-good": "cgt_good_mod"},
               {"cgt_good_mod": GOOD})
    fresh(site)
    assert plugins.make_harness("cgt-good").name == "cgt-good"
    with pytest.raises(RegistrationError) as err:
        plugins.harnesses.load("cgt-misattr")
    msg = str(err.value)
    assert "cgt_good_mod has no 'NoSuchAdapter'" in msg and "misnamed entry point" in msg
    assert "cgt-misnamed 0.1" in msg and "install the package" not in msg
    assert isinstance(err.value.__cause__, AttributeError)


def test_a_missing_module_of_an_installed_distribution_is_a_misnamed_entry_point(site):
    write_dist(site, "cgt-typo", "2.0", {"cgt-typo": "cgt_no_such_module.adapter"}, {})
    fresh(site)
    with pytest.raises(RegistrationError) as err:
        plugins.harnesses.load("cgt-typo")
    msg = str(err.value)
    assert "cgt-typo 2.0 is installed but has no module 'cgt_no_such_module'" in msg
    assert "misnamed entry point" in msg and "install the package" not in msg and "pip uninstall cgt-typo" in msg
    assert isinstance(err.value.__cause__, ModuleNotFoundError)


def test_two_distributions_declaring_one_name_are_a_conflict_not_a_last_win(site):
    write_dist(site, "cgt-first", "1.0", {"cgt-twin": "cgt_first_mod"}, {"cgt_first_mod": GOOD})
    write_dist(site, "cgt-second", "3.1", {"cgt-twin": "cgt_second_mod"}, {"cgt_second_mod": GOOD})
    fresh(site)
    assert "cgt-twin" in plugins.harnesses.names()  # visible in listings
    assert plugins.harnesses.source("cgt-twin") == "cgt-first 1.0 and cgt-second 3.1"
    with pytest.raises(RegistrationError) as err:
        plugins.harnesses.load("cgt-twin")
    msg = str(err.value)
    assert "declared by 2 distributions" in msg and "cgt-first 1.0 declares 'cgt_first_mod'" in msg
    assert "cgt-second 3.1 declares 'cgt_second_mod'" in msg and "uninstall one of them" in msg
    problem = plugins.harnesses.problem("cgt-twin")
    assert problem is not None and "cgt-first 1.0" in problem and "\n" not in problem

    class Chosen(plugins.harnesses.load("mini")):  # type: ignore[misc]
        pass

    with plugins.harnesses.registered("cgt-twin", Chosen):  # a runtime registration deliberately settles it
        assert plugins.harnesses.load("cgt-twin") is Chosen and plugins.harnesses.problem("cgt-twin") is None
    with pytest.raises(RegistrationError, match="declared by 2 distributions"):
        plugins.harnesses.load("cgt-twin")


def test_harness_list_marks_broken_plugins_and_fails_only_when_asked_to_check(site, capsys):
    write_dist(site, "cgt-mixed", "0.9", {"cgt-good": "cgt_good_mod", "cgt-raises": "cgt_raises_mod",
                                          "cgt-misattr": "cgt_good_mod:Nope"},
               {"cgt_good_mod": GOOD, "cgt_raises_mod": "raise ValueError('bad config at import')\n"})
    fresh(site)
    assert main(["harness", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "cgt-good" in lines and {"mini", "openclaw", "claude-code", "codex", "qwen-code"} <= set(lines)  # fine
    raises = [line for line in lines if line.startswith("cgt-raises")]
    assert len(raises) == 1 and "BROKEN:" in raises[0] and "ValueError: bad config at import" in raises[0]
    assert "cgt-mixed 0.9" in raises[0]
    misattr = [line for line in lines if line.startswith("cgt-misattr")]
    assert len(misattr) == 1 and "BROKEN:" in misattr[0] and "misnamed entry point" in misattr[0]
    assert main(["harness", "list", "--check"]) == 1
    capsys.readouterr()

    # the real command line, in its own process: the distribution is found through PYTHONPATH
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "clawgym_cli.main", "plugins", "list", "harness", "--check"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    good = [r for r in rows if r[1] == "cgt-good"]
    assert good == [["harness", "cgt-good", "cgt-mixed 0.9"]]
    broken = [r for r in rows if r[1] == "cgt-raises"]
    assert len(broken) == 1 and broken[0][3].startswith("BROKEN: harness 'cgt-raises'")


def test_plugins_list_refuses_an_unknown_kind(capsys):
    assert main(["plugins", "list", "harnes"]) == 2
    assert "unknown plugin kind(s) harnes; the kinds are harness, suite" in capsys.readouterr().err
