"""The one plugin registry (clawgym_env.plugins) and the one sampling-overrides type."""

from __future__ import annotations

import textwrap

import pytest

from clawgym_env import plugins
from clawgym_env.errors import PolicyError, ProxyError, RegistrationError
from clawgym_env.harness import HarnessAdapter
from clawgym_env.plugins import Registry
from clawgym_env.policy.base import SamplingOverrides
from clawgym_env.task import Suite, Task


def test_every_builtin_plugin_is_found_by_name():
    assert set(plugins.harnesses.names()) >= {"mini", "openclaw", "claude-code", "codex", "qwen-code"}
    assert set(plugins.suites.names()) >= {"builtin", "folder", "officeqa", "clawgym-bench", "jobbench"}
    assert set(plugins.graders.names()) >= {"reward.sh", "hybrid", "jobbench"}
    assert set(plugins.sandboxes.names()) == {"bwrap", "docker"}
    assert set(plugins.policies.names()) >= {"scripted", "transformers", "tiny", "passthrough", "vllm"}
    assert set(plugins.algorithms.names()) >= {"grpo", "ppo", "sft"}
    adapter = plugins.make_harness("Claude_Code")  # case and _ / - do not matter
    assert isinstance(adapter, HarnessAdapter) and adapter.name == "claude-code"
    assert plugins.algorithms.load("grpo").__name__ == "trainers.grpo.train"


@pytest.mark.parametrize("registry, typo, close", [
    (plugins.harnesses, "opencalw", "openclaw"), (plugins.suites, "bultin", "builtin"),
    (plugins.sandboxes, "bwarp", "bwrap"), (plugins.algorithms, "gpro", "grpo"),
    (plugins.graders, "hybird", "hybrid"),
])
def test_unknown_names_get_one_error_with_did_you_mean(registry, typo, close):
    with pytest.raises(RegistrationError) as err:
        registry.load(typo)
    msg = str(err.value)
    assert f"unknown {registry.kind} {typo!r}" in msg and f"did you mean {close}" in msg and "available:" in msg


def test_policy_specs_resolve_through_the_registry():
    with pytest.raises(PolicyError, match="did you mean scripted"):
        from clawgym_env.policy import make_policy

        make_policy("scriptd:expert")
    seen = []

    def factory(rest, **kw):
        seen.append((rest, kw))
        return "a policy"

    with plugins.policies.registered("mine", factory):
        from clawgym_env.policy import make_policy

        assert make_policy("mine:some/where", device="cpu") == "a policy"
    assert seen == [("some/where", {"device": "cpu"})]
    assert "mine" not in plugins.policies


def test_a_module_must_define_exactly_one_implementation(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "one_harness.py").write_text(textwrap.dedent("""
        from clawgym_env.harness import HarnessAdapter, HarnessOutput, LaunchSpec
        class Mine(HarnessAdapter):
            name = "mine"
            def launch(self, task, endpoint, *, home): return LaunchSpec(argv=["true"])
            def read_output(self, stdout, stderr): return HarnessOutput(stdout)
        Adapter = Mine  # an alias is the same implementation
    """))
    (tmp_path / "two_harnesses.py").write_text(textwrap.dedent("""
        from one_harness import Mine
        from clawgym_env.harness import HarnessAdapter
        class A(Mine): pass
        class B(Mine): pass
    """))
    (tmp_path / "no_harness.py").write_text("X = 1\n")
    reg = Registry("harness", "clawgym.test-harnesses", base=HarnessAdapter)
    reg.register("mine", "one_harness")
    reg.register("two", "two_harnesses")
    reg.register("none", "no_harness")
    reg.register("explicit", "two_harnesses:B")
    reg.register("missing", "no_such_module_here")
    assert reg.load("mine").__name__ == "Mine" and reg.create("mine").name == "mine"
    assert reg.load("explicit").__name__ == "B"
    with pytest.raises(RegistrationError, match=r"exactly one HarnessAdapter subclass \(found 2: \['A', 'B'\]\)"):
        reg.load("two")
    with pytest.raises(RegistrationError, match="found 0"):
        reg.load("none")
    with pytest.raises(RegistrationError, match="could not be imported"):
        reg.load("missing")
    with pytest.raises(RegistrationError, match="bad options for harness 'mine'"):
        reg.create("mine", colour="red")
    with pytest.raises(RegistrationError, match="already registered"):
        reg.register("mine", "one_harness")


def test_registered_is_scoped_and_restores(tmp_path):
    class Fake:
        pass

    with plugins.sandboxes.registered("fake", Fake):
        assert plugins.sandboxes.load("fake") is Fake
        with plugins.sandboxes.registered("fake", int):
            assert plugins.sandboxes.load("fake") is int
        assert plugins.sandboxes.load("fake") is Fake
    assert "fake" not in plugins.sandboxes


def test_load_suite_by_name_by_folder_and_unknown(tmp_path):
    suite = plugins.load_suite("builtin")
    assert isinstance(suite, Suite) and len(suite) > 10 and suite.tasks[0].grader == "reward.sh"
    folder = tmp_path / "mine"
    folder.mkdir()
    with pytest.raises(Exception, match="holds no task dirs"):
        plugins.load_suite(folder)
    with pytest.raises(RegistrationError, match="unknown suite 'bultin'; did you mean builtin"):
        plugins.load_suite("bultin")


def test_a_task_names_its_grader_and_the_engine_finds_it(tmp_path):
    from clawgym_env.grading.grade import GradeResult, grade_episode

    class Always:
        name = "always"
        needs_judge = False

        def grade(self, ctx):
            return GradeResult(0.25, {"x": 1.0}, scorer=self.name)

    task = Task(id="t", instruction="x", grader="always")
    with plugins.graders.registered("always", Always):
        res = grade_episode(task, tmp_path)
    assert (res.reward, res.scorer, res.status) == (0.25, "always", "ok")
    res = grade_episode(task, tmp_path)  # no longer registered: no valid reward, never a silent 0
    assert res.status == "reward_invalid" and "unknown grader 'always'" in res.reason


def test_sampling_overrides_are_one_validated_frozen_type():
    s = SamplingOverrides.of({"temperature": 0.0, "max_tokens": 4.0, "stop": "x"})
    assert s == SamplingOverrides(temperature=0.0, max_tokens=4, stop=("x",))
    assert s.as_dict() == {"temperature": 0.0, "max_tokens": 4, "stop": ["x"]}
    assert SamplingOverrides.of(s) is s and SamplingOverrides.of(None) == SamplingOverrides()
    with pytest.raises(AttributeError):
        s.temperature = 1.0  # frozen
    for bad, field in ((dict(temperature=-1), "sampling.temperature"), (dict(top_p=0.0), "sampling.top_p"),
                       (dict(max_tokens=0), "sampling.max_tokens"), (dict(seed=True), "sampling.seed"),
                       (dict(temperature=float("nan")), "sampling.temperature")):
        with pytest.raises(ProxyError) as err:
            SamplingOverrides(**bad)
        assert err.value.field == field
    with pytest.raises(ProxyError, match="unknown sampling override"):
        SamplingOverrides.of({"frequency_penalty": 1.0})


def test_gym_action_becomes_overrides():
    import numpy as np

    from clawgym_env.spaces import action_to_sampling

    s, version = action_to_sampling({"temperature": np.float32(0.5), "top_p": np.float32(0.0), "max_tokens": 0,
                                     "policy_version": 3})
    assert isinstance(s, SamplingOverrides) and s.temperature == 0.5 and s.max_tokens is None
    assert 0 < s.top_p <= 1e-6 and version == 3
    assert action_to_sampling(None) == (SamplingOverrides(), None)
