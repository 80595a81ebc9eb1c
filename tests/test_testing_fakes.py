"""The shipped fakes (:mod:`clawgym_env.testing`) and the public API of ``clawgym_env``, used the way
a third party would: real proxy, real bubblewrap sandbox, real tokenizer, real grading."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import clawgym_env
from clawgym_env import (
    ClawGymEnv,
    GradeContext,
    GradeResult,
    HarnessAdapter,
    PolicyBackend,
    RegistrationError,
    RolloutPool,
    Runtime,
    grade_episode,
    load_suite,
    make_harness,
    make_policy,
    plugins,
)
from clawgym_env.policy.base import Generation, GenerationContext, SamplingParams
from clawgym_env.testing import (
    ECHO_TASKS,
    FAIL,
    EchoHarness,
    EchoScriptPolicy,
    EchoTaskSpec,
    JudgeServer,
    Marked,
    SlowPolicy,
    Watch,
    assert_no_survivors,
    echo_policy,
    echo_suite,
    fail_once,
    load_echo_suite,
    replying,
    survivors,
)
from tasks.judge import JudgeClient

TESTING_DIR = Path(clawgym_env.__file__).parent / "testing"
UPPER_LAYERS = ("tasks", "harness_adapters", "trainers", "leaderboards", "clawgym_cli")


# ---- the public API ----------------------------------------------------------------------------------
def test_every_public_name_resolves_to_its_home_object():
    assert clawgym_env.__all__ == sorted(clawgym_env._EXPORTS)
    assert clawgym_env.testing.__all__ == sorted(clawgym_env.testing._EXPORTS)
    for name in clawgym_env.testing.__all__:
        assert getattr(clawgym_env.testing, name) is not None
    for name in clawgym_env.__all__:
        value = getattr(clawgym_env, name)
        target = clawgym_env._EXPORTS[name]
        module_name, _, attr = target.partition(":")
        home = importlib.import_module(module_name)
        assert value is (getattr(home, attr) if attr else home), name
    assert set(clawgym_env.__all__) <= set(dir(clawgym_env))
    for name in ("Task", "Suite", "HarnessAdapter", "Endpoint", "LaunchSpec", "HarnessOutput", "Runtime",
                 "RolloutPool", "EpisodeResult", "run_episode", "make_policy", "PolicyBackend", "CallRecord",
                 "EpisodeRecord", "CallTree", "ProxyServer", "plugins", "load_suite", "make_harness",
                 "ClawGymError", "RegistrationError", "testing"):
        assert name in clawgym_env.__all__, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        clawgym_env.Nope  # noqa: B018


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_import_clawgym_env_is_light():
    heavy = {"torch", "transformers", "starlette", "uvicorn", "tasks", "harness_adapters", "trainers"}
    assert not heavy & _modules_after("import clawgym_env")
    assert not heavy & _modules_after("import clawgym_env.testing")
    # resolving a name imports its home module and no more than it needs
    loaded = _modules_after("from clawgym_env import Task, HarnessAdapter, plugins")
    assert "clawgym_env.task" in loaded and not heavy & loaded


def test_testing_package_imports_only_the_engine():
    for path in sorted(TESTING_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for name in names:
                assert name.split(".")[0] not in UPPER_LAYERS, f"{path.name} imports {name}"
    code = "import clawgym_env.testing as t\nfor n in t.__all__: getattr(t, n)"
    assert not set(UPPER_LAYERS) & _modules_after(code)


# ---- the echo suite ------------------------------------------------------------------------------------
def test_echo_suite_writes_task_dirs_the_folder_loader_reads(tmp_path):
    suite = echo_suite(tmp_path / "suite")
    assert [t.id for t in suite] == [s.id for s in ECHO_TASKS] and suite.root == tmp_path / "suite"
    for task in suite:
        assert (task.task_dir / "data_entry.json").is_file() and (task.reward_dir / "reward.sh").is_file()
        assert task.expert_path is not None and task.grader == "reward.sh"
    assert (suite.get("say-clawgym").input_dir / "notes" / "readme.txt").read_text() == "An echo task.\n"
    loaded = load_suite(tmp_path / "suite")
    assert not loaded.issues
    by_id = {t.id: t for t in loaded}
    for task in suite:
        other = by_id[task.id]
        assert (other.instruction, other.mount_dir, other.metadata["expect"], other.limits) == \
            (task.instruction, task.mount_dir, task.metadata["expect"], task.limits)
        assert other.reward_dir == task.reward_dir and other.input_dir == task.input_dir


def test_echo_suite_takes_specs_and_refuses_duplicate_ids(tmp_path):
    mine = echo_suite(tmp_path / "mine", [EchoTaskSpec("add", "What is 2+2?", expect="4")])
    assert [(t.id, t.instruction, t.metadata["expect"]) for t in mine] == [("add", "What is 2+2?", "4")]
    with pytest.raises(ValueError, match="unique"):
        echo_suite(tmp_path / "dup", [EchoTaskSpec("a", "x", "x"), EchoTaskSpec("a", "y", "y")])


# ---- the echo policy -----------------------------------------------------------------------------------
def test_echo_policy_by_name_through_the_registry(tokenizer):
    with plugins.policies.registered("echo", echo_policy):
        plain = make_policy("echo", tokenizer=tokenizer)
        fixed = make_policy("echo:the answer", tokenizer=tokenizer)
    assert isinstance(plain, EchoScriptPolicy) and fixed.reply == "the answer"
    assert "echo" not in plugins.policies
    from clawgym_env.policy import GenerationContext

    ctx = GenerationContext(messages=[{"role": "user", "content": "hi"}])
    assert plain.decide(ctx) == "Echo: hi<|im_end|>" and fixed.decide(ctx) == "the answer<|im_end|>"
    with pytest.raises(clawgym_env.PolicyError):
        plain.decide(GenerationContext(messages=[{"role": "user", "content": FAIL}]))


# ---- whole episodes ------------------------------------------------------------------------------------
def test_echo_episodes_through_runtime_are_graded_by_reward_sh(tmp_path, tokenizer):
    suite = echo_suite(tmp_path / "suite")
    policy = EchoScriptPolicy(tokenizer)
    with Runtime(policy, out_dir=tmp_path / "eps") as rt:
        results = [rt.run(task, EchoHarness()) for task in suite]
        plain_http = rt.run(suite.get("say-hello"), EchoHarness(client="http", answer_file=None))
    assert [r.record.reward for r in results] == [1.0, 1.0, 0.0]
    for task, r in zip(suite, results):
        rec = r.record
        assert rec.status == "ok" and rec.harness == "echo", (rec.error, rec.logs)
        assert rec.final_message == f"Echo: {task.instruction}"
        (call,) = r.calls
        assert call.path.endswith("/v1/chat/completions") and call.token_exact
        assert tokenizer.decode(call.output_token_ids, skip_special_tokens=True).strip() == rec.final_message
        assert [c.path for c in rec.workspace_changes] == ["answer.txt"]
    assert len(policy.seen) == 4 and policy.seen[0][2].task is not None
    assert plain_http.record.reward == 1.0 and plain_http.record.workspace_changes == []
    assert plain_http.record.final_message == "Echo: hello"


def test_scripted_expert_solves_every_echo_task(expert_runtime, tmp_path):
    suite = echo_suite(tmp_path / "suite")
    results = RolloutPool(expert_runtime, concurrency=3, progress=False).run(suite.tasks, EchoHarness())
    assert [(r.record.task_id, r.record.reward) for r in results] == [(t.id, 1.0) for t in suite]


class ShoutHarness(EchoHarness):
    """A user's own harness: the echo harness, asking with an exclamation mark."""

    name = "shout"

    def launch(self, task, endpoint, *, home):
        loud = task.model_copy(update={"instruction": task.instruction + "!"})
        return super().launch(loud, endpoint, home=home)


def test_a_user_registers_a_harness_and_a_suite(tmp_path, tokenizer):
    def in_tmp(spec, data=None, **options):  # the registered loader builds its folder under tmp_path
        return load_echo_suite(spec, tmp_path / "suite", **options)

    with plugins.harnesses.registered("shout", ShoutHarness), plugins.suites.registered("echo", in_tmp):
        assert isinstance(make_harness("shout", client="http"), HarnessAdapter)
        env = ClawGymEnv(harness="shout", policy=EchoScriptPolicy(tokenizer), suite="echo",
                         harness_options={"client": "http"}, out_dir=tmp_path / "eps")
        try:
            env.reset(options={"task_id": "say-hello"})
            obs, reward, terminated, truncated, info = env.step(None)
        finally:
            env.close()
    assert (reward, terminated, truncated, info["status"]) == (1.0, True, False, "ok")
    assert obs["final_message"] == "Echo: hello!" and info["episode"]["harness"] == "shout"
    with pytest.raises(RegistrationError, match=r"unknown harness 'shout' \(available: .*mini"):
        make_harness("shout")  # gone after the with block
    with pytest.raises(RegistrationError, match="did you mean mini"):
        make_harness("minii")


def test_marked_harness_leaves_no_process_behind(tmp_path, tokenizer):
    suite = echo_suite(tmp_path / "suite")
    adapter = Marked(EchoHarness())
    with Runtime(EchoScriptPolicy(tokenizer, delay_s=2.0), out_dir=tmp_path / "eps") as rt:
        with Watch(adapter.marker, every_s=0.2) as watch:
            result = rt.run(suite.get("say-hello"), adapter)
    assert result.record.reward == 1.0
    assert watch.seen, "the check saw the harness's process while it ran"
    assert_no_survivors(adapter.marker)
    assert survivors(adapter.marker) == []


# ---- the fake judge ------------------------------------------------------------------------------------
class JudgedByLLM:
    """A user's grader: asks the judge whether the final answer is polite."""

    name = "polite-judge"
    needs_judge = True

    def grade(self, ctx: GradeContext) -> GradeResult:
        verdict = ctx.judge.judge_json("Is the answer polite? Reply {\"polite\": bool}.", ctx.final_message or "")
        return GradeResult(1.0 if verdict.get("polite") else 0.0, scorer=self.name)


def _judge(body) -> tuple[int, str]:
    answer = body["messages"][-1]["content"]
    return 200, json.dumps({"polite": "hello" in answer.lower()})


def test_fake_judge_answers_a_users_grader_inside_an_episode(tmp_path, tokenizer):
    suite = echo_suite(tmp_path / "suite")
    tasks = [t.model_copy(update={"grader": "polite-judge"}) for t in suite]
    with JudgeServer(_judge) as srv, plugins.graders.registered("polite-judge", JudgedByLLM):
        client = JudgeClient(srv.base_url, "fake-judge", backoff_s=0.01)
        with Runtime(EchoScriptPolicy(tokenizer), out_dir=tmp_path / "eps", judge=client) as rt:
            results = [rt.run(t, EchoHarness(client="http")) for t in tasks]
        # the judge saw each final answer, in order
        asked = [r["messages"][-1]["content"] for r in srv.requests]
        srv.handler = replying("the judge is down", status=500)
        broken = grade_episode(tasks[0], tmp_path, final_message="hello", judge=client)
    assert [r.record.reward for r in results] == [1.0, 0.0, 1.0]  # "hello", "ClawGym", "hello again"
    assert all(r.record.status == "ok" for r in results)
    assert asked == [f"Echo: {t.instruction}" for t in tasks]
    assert broken.status == "reward_invalid" and "judge is down" in (broken.reason or "")


# ---- slow policies (keep-alive and forced-retry tests) -----------------------------------------------
class _Counter(PolicyBackend):
    """A policy with no tokenizer: answers its prompt's length, notes when it was asked."""

    name, version = "counter", 7

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[int], float]] = []

    @property
    def tokenizer(self):
        return "tok"

    def generate(self, prompt_ids, params, ctx):
        self.asked.append((ctx.episode_id, list(prompt_ids), time.monotonic()))
        return Generation([len(prompt_ids)], [-0.5], "stop", policy_version=self.version)


def _ask(policy, episode, prompt):
    return policy.generate(list(prompt), SamplingParams(), GenerationContext(episode_id=episode))


def test_slow_policy_holds_only_the_chosen_calls_of_each_episode():
    inner = _Counter()
    slow = SlowPolicy(inner, 0.3, calls={1}, when=lambda n, ctx: ctx.episode_id != "skip")
    assert (slow.name, slow.version, slow.tokenizer, slow.streams_text) == ("counter", 7, "tok", False)
    took = {}
    for episode in ("a", "b", "skip"):
        for n in range(3):
            start = time.monotonic()
            gen = _ask(slow, episode, range(n + 1))
            took[episode, n] = time.monotonic() - start
            assert (gen.token_ids, gen.logprobs, gen.finish_reason, gen.policy_version) == ([n + 1], [-0.5], "stop", 7)
    assert [(d.episode_id, d.call, d.retried) for d in slow.delayed] == [("a", 1, False), ("b", 1, False)]
    assert all(d.held_s >= 0.3 for d in slow.delayed)
    assert took["a", 1] >= 0.3 and took["b", 1] >= 0.3
    before = SlowPolicy(inner := _Counter(), 0.3, after_generate=False)  # every call, asked after the wait
    start = time.monotonic()
    _ask(before, "e", [1])
    assert inner.asked[0][2] - start >= 0.3
    with pytest.raises(ValueError):
        SlowPolicy(inner, -1)
    with pytest.raises(ValueError):
        SlowPolicy(inner, 1, retry_share=1.5)


def _held_then_retried(policy, first, retry):
    """The held call in a thread, then its retry; returns (first answer, retry answer, order of answers)."""
    answers: dict[str, object] = {}
    done: list[str] = []

    def held():
        answers["first"] = _ask(policy, "ep", first)
        done.append("first")

    t = threading.Thread(target=held)
    t.start()
    time.sleep(0.2)  # the harness gave up and retries
    answers["retry"] = _ask(policy, "ep", retry)
    done.append("retry")
    t.join(10)
    return answers["first"], answers["retry"], done


def test_fail_once_answers_the_held_call_when_its_retry_arrives_and_before_it():
    slow = fail_once(_Counter(), call=0, max_wait_s=30, settle_s=0.2)
    first, retry, order = _held_then_retried(slow, [1, 2, 3], [1, 2, 3])
    assert first.token_ids == retry.token_ids == [3] and order == ["first", "retry"]
    (d,) = slow.delayed
    assert (d.call, d.retried) == (0, True)  # released by the retry, not by the 30 s cap
    # a different prompt is no retry (the held call waits out its cap); a near-identical one is with retry_share
    strict = fail_once(_Counter(), call=0, max_wait_s=1.0, settle_s=0)
    _held_then_retried(strict, [1, 2, 3, 4], [1, 2, 3, 9, 9])
    assert [(d.retried, d.held_s >= 1.0) for d in strict.delayed] == [(False, True)]
    loose = fail_once(_Counter(), call=0, max_wait_s=30, retry_share=0.75, settle_s=0)
    _held_then_retried(loose, [1, 2, 3, 4], [1, 2, 3, 9, 9])
    assert [d.retried for d in loose.delayed] == [True]
    # retry_first: the retry is answered at once, the abandoned attempt after it
    reverse = fail_once(_Counter(), call=0, max_wait_s=30, settle_s=0.2, retry_first=True)
    first, retry, order = _held_then_retried(reverse, [5, 6], [5, 6])
    assert order == ["retry", "first"] and first.token_ids == retry.token_ids == [2]
    assert [d.retried for d in reverse.delayed] == [True]
