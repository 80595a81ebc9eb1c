"""Testing your own code with ClawGym's fakes: a policy, a harness adapter and a grader of your own.

This is what a third party's test file looks like. Each test swaps one real piece for its fake from
:mod:`clawgym_env.testing` and runs the rest for real (proxy, bubblewrap sandbox, tokenizer, grading):

* your **policy** answers through the echo harness on the echo suite (one model call per episode);
* your **harness adapter** is driven by the echo policy, and leaves no process behind;
* your **grader** asks the fake LLM judge.

Run: ``python -m pytest -q examples/test_with_fakes.py`` (needs bubblewrap; about a minute on CPU).
"""

from __future__ import annotations

import json

import openai

from clawgym_env import (
    Endpoint,
    Generation,
    GradeContext,
    GradeResult,
    HarnessAdapter,
    HarnessOutput,
    LaunchSpec,
    PolicyBackend,
    RolloutPool,
    Runtime,
    Task,
    grade_episode,
    load_tokenizer,
    plugins,
)
from clawgym_env.testing import (
    EchoHarness,
    EchoScriptPolicy,
    JudgeServer,
    Marked,
    Watch,
    assert_no_survivors,
    echo_suite,
    sandbox_python,
)


# ---- your policy, tested through the echo harness ------------------------------------------------------
class Greeter(PolicyBackend):
    """Your policy: here it always greets (a real one samples from a model)."""

    name = "greeter"

    def __init__(self) -> None:
        self._tokenizer = load_tokenizer()

    @property
    def tokenizer(self):
        return self._tokenizer

    def generate(self, prompt_ids, params, ctx) -> Generation:
        ids = self._tokenizer.encode("hello, friend<|im_end|>", add_special_tokens=False)
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop",
                          policy_version=self.version)


def test_my_policy_end_to_end(tmp_path):
    suite = echo_suite(tmp_path / "suite")  # say-hello, say-clawgym, say-goodbye
    with Runtime(Greeter(), out_dir=tmp_path / "episodes") as rt:
        results = RolloutPool(rt, concurrency=3, progress=False).run(suite.tasks, EchoHarness())
    assert [r.record.final_message for r in results] == ["hello, friend"] * 3
    assert [r.record.reward for r in results] == [1.0, 0.0, 0.0]
    assert all(len(r.calls) == 1 and r.calls[0].token_exact for r in results)


# ---- your harness adapter, tested with the echo policy -------------------------------------------------
STREAMING_AGENT = r'''
import json, os, sys
import openai
api = openai.OpenAI(base_url=sys.argv[1], api_key=os.environ["OPENAI_API_KEY"])
chunks = api.chat.completions.create(model=sys.argv[2], stream=True,
                                     messages=[{"role": "user", "content": open(sys.argv[3]).read()}])
print(json.dumps({"answer": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)}))
'''


class StreamingHarness(HarnessAdapter):
    """Your harness adapter: one streamed Chat Completions call."""

    name = "streaming"

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        path = f"{home}/instruction.txt"
        return LaunchSpec(argv=[sandbox_python(), "-c", STREAMING_AGENT, endpoint.base_url, endpoint.model, path],
                          env={"OPENAI_API_KEY": endpoint.api_key}, files={path: task.instruction},
                          cwd=task.mount_dir)

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        lines = stdout.strip().splitlines()
        return HarnessOutput(final_message=json.loads(lines[-1])["answer"] if lines else None)


def test_my_harness_adapter(tmp_path):
    suite = echo_suite(tmp_path / "suite")
    adapter = Marked(StreamingHarness())  # adds a marker to the harness's environment
    with Runtime(EchoScriptPolicy(delay_s=1.0), out_dir=tmp_path / "episodes") as rt:
        with Watch(adapter.marker, every_s=0.2) as watch:
            result = rt.run(suite.get("say-hello"), adapter)
    assert result.record.final_message == "Echo: hello" and result.record.reward == 1.0
    assert result.calls[0].stream
    assert watch.seen  # the check saw the harness while it ran ...
    assert_no_survivors(adapter.marker)  # ... and nothing of it is left


# ---- your grader, tested with the fake judge -----------------------------------------------------------
class PolitenessGrader:
    """Your grader: asks an LLM judge whether the final answer is polite."""

    name = "politeness"
    needs_judge = True

    def grade(self, ctx: GradeContext) -> GradeResult:
        reply = ctx.judge.chat.completions.create(
            model="judge", messages=[{"role": "user", "content": f"Polite? {ctx.final_message}"}])
        verdict = json.loads(reply.choices[0].message.content)
        return GradeResult(1.0 if verdict["polite"] else 0.0, scorer=self.name)


def test_my_grader(tmp_path):
    task = echo_suite(tmp_path / "suite").get("say-hello").model_copy(update={"grader": "politeness"})
    with JudgeServer(lambda body: (200, json.dumps({"polite": "please" in str(body["messages"])}))) as judge, \
            plugins.graders.registered("politeness", PolitenessGrader):
        client = openai.OpenAI(base_url=judge.base_url, api_key="unused", max_retries=0)
        polite = grade_episode(task, tmp_path, final_message="yes, please", judge=client)
        rude = grade_episode(task, tmp_path, final_message="no", judge=client)
    assert (polite.reward, rude.reward) == (1.0, 0.0)
    assert [r["messages"][0]["content"] for r in judge.requests] == ["Polite? yes, please", "Polite? no"]
