"""The episode record of every path through :func:`~clawgym_env.episodes.run.run_episode`, pinned.

Real episodes (echo policy, echo harness, bwrap, ``reward.sh`` or a registered grader) walk each path
the episode runner knows — graded, ungraded, network-traced, a hostile task folder, a sandbox that
cannot start, a harness that cannot launch, a harness that gets no answer, a policy failure, a
timeout, a flooded workspace, a changed input file, every grader outcome (notes, reward_error,
reward_invalid, a full place, a sandbox failure, a bug) and a record that cannot be built — and each
record's JSON (field order and the order of its ``logs``/``timings``/``resources`` keys included) is
compared with the one stored in ``tests/data/episode_records.json``. Values that vary from run to run
(durations, start times, peak memory, temporary folders) are replaced by markers first.

``CLAWGYM_WRITE_GOLDEN=1`` rewrites the stored records from the code under test (review the diff).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from clawgym_env import plugins
from clawgym_env.envs.runtime import Runtime
from clawgym_env.errors import HarnessError, SandboxError
from clawgym_env.grading.grade import GradeContext, GradeResult
from clawgym_env.harness import HarnessOutput
from clawgym_env.sandbox import PlaceFullError
from clawgym_env.testing import FAIL, EchoHarness, EchoScriptPolicy, echo_suite
from clawgym_env.testing.suite import ECHO_TASKS, EchoTaskSpec

GOLDEN = Path(__file__).parent / "data" / "episode_records.json"


class BrokenSandbox:
    """A sandbox backend whose start fails."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def __enter__(self) -> Any:
        raise SandboxError("cannot start (test)")

    def __exit__(self, *exc: Any) -> None:
        return None


class NoLaunch(EchoHarness):
    """An adapter that cannot configure its harness."""

    def launch(self, task, endpoint, *, home):
        raise HarnessError("no config for this harness (test)")


class Shell(EchoHarness):
    """The echo agent wrapped in a shell: ``before`` runs first, ``after`` after it (``exit`` ends it early)."""

    def __init__(self, before: str = ":", after: str = ":") -> None:
        super().__init__(client="http")
        self.before, self.after = before, after

    def launch(self, task, endpoint, *, home):
        spec = super().launch(task, endpoint, home=home)
        spec.argv = ["sh", "-c", f'{self.before}; "$@"; {self.after}', "sh", *spec.argv]
        return spec


class NumberAnswer(EchoHarness):
    """An adapter whose output reader returns a number as the final message: the record cannot be built."""

    def read_output(self, stdout, stderr):
        return HarnessOutput(final_message=123, transcript=[])  # type: ignore[arg-type]


class FixedGrader:
    """A grader answering ``result`` or raising ``exc``."""

    needs_judge = False

    def __init__(self, name: str, result: GradeResult | None = None, exc: BaseException | None = None) -> None:
        self.name, self.result, self.exc = name, result, exc

    def grade(self, ctx: GradeContext) -> GradeResult:
        if self.exc is not None:
            raise self.exc
        assert self.result is not None
        return self.result


GRADERS = {
    "g-notes": FixedGrader("g-notes", GradeResult(0.5, {"a": 0.5}, "ok", "half right", "g-notes", "out", "err",
                                                  notes=["restored input x", "removed reward/"])),
    "g-error": FixedGrader("g-error", GradeResult(0.0, {}, "reward_error", "verifier failed", "g-error")),
    "g-invalid": FixedGrader("g-invalid", GradeResult(0.0, {}, "reward_invalid", "judge down", "g-invalid")),
    "g-full": FixedGrader("g-full", exc=PlaceFullError("workspace too big (test)")),
    "g-sandbox": FixedGrader("g-sandbox", exc=SandboxError("grader sandbox down (test)")),
    "g-bug": FixedGrader("g-bug", exc=RuntimeError("grader bug (test)")),
}


def _scenarios(suite, tmp: Path) -> list[tuple[str, Any, Any, dict[str, Any]]]:
    hello, readme, bye = suite.get("say-hello"), suite.get("say-clawgym"), suite.get("say-goodbye")
    outside = tmp / "outside"
    outside.mkdir()
    hostile_dir = tmp / "hostile"
    hostile_dir.mkdir()
    (hostile_dir / "input_files").symlink_to(outside)
    hostile = hello.model_copy(update={"id": "hostile", "task_dir": hostile_dir,
                                       "input_dir": hostile_dir / "input_files"})
    failing = hello.model_copy(update={"id": "fail", "instruction": FAIL})
    slow = hello.model_copy(deep=True, update={"id": "slow"})
    slow.limits.timeout_s = 8
    http = EchoHarness(client="http")
    out = [
        ("ok", hello, http, {}),
        ("zero_reward", bye, http, {}),
        ("inputs", readme, http, {}),
        ("ungraded", hello, http, {"grade": False}),
        ("traced", hello, http, {"trace_network": True}),
        ("task_error", hostile, http, {}),
        ("sandbox_failure", hello, http, {"sandbox": "golden-broken"}),
        ("launch_failure", hello, NoLaunch(), {}),
        ("no_answer", hello, Shell(before="exit 3"), {}),
        ("exit_after_answer", hello, Shell(after="exit 4"), {}),
        ("policy_failure", failing, http, {}),
        ("timeout", slow, Shell(after="sleep 60"), {}),
        ("flood", hello, Shell(before="for i in $(seq 2005); do : > f$i; done"), {}),
        ("input_changed", readme, Shell(before="echo changed > notes/readme.txt; rm -f nothing"), {}),
        ("record_unbuildable", hello, NumberAnswer(client="http"), {}),
    ]
    out += [(name, hello.model_copy(update={"grader": name}), http, {}) for name in GRADERS]
    return out


def _normal(rec: dict[str, Any], tmp: Path) -> dict[str, Any]:
    text = json.dumps(rec).replace(str(tmp), "<tmp>").replace(sys.executable, "<python>")
    rec = json.loads(text)
    rec["wall_s"] = "<s>"
    rec["timings"] = {k: "<s>" for k in rec["timings"]}
    rec["resources"] = {k: "<v>" for k in rec["resources"]}
    if "network_trace" in rec["logs"]:  # process ids, the episode's token
        rec["logs"]["network_trace"] = "<trace>"
    changes = rec["workspace_changes"]
    if len(changes) > 8:  # a flood: its length, its ends
        rec["workspace_changes"] = [*changes[:3], f"<{len(changes) - 6} more>", *changes[-3:]]
    if rec["error"]:
        rec["error"] = re.sub(r"errors\.pydantic\.dev/[0-9.]+/", "errors.pydantic.dev/<v>/", rec["error"])
    return rec


@pytest.fixture(scope="module")
def records(tmp_path_factory, tokenizer) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("golden")
    specs = [*ECHO_TASKS]
    assert specs[1].files, "say-clawgym has an input file"
    suite = echo_suite(tmp / "suite", [EchoTaskSpec(s.id, s.instruction, s.expect, dict(s.files)) for s in specs])
    got: dict[str, dict[str, Any]] = {}
    with plugins.sandboxes.registered("golden-broken", BrokenSandbox), \
            Runtime(EchoScriptPolicy(tokenizer), out_dir=tmp / "eps") as rt:
        registered = [plugins.graders.registered(name, lambda g=g: g) for name, g in GRADERS.items()]
        for r in registered:
            r.__enter__()
        try:
            for name, task, adapter, kwargs in _scenarios(suite, tmp):
                res = rt.run(task, adapter, episode_id=f"golden-{name}", **kwargs)
                on_disk = json.loads((tmp / "eps" / f"golden-{name}" / "episode.json").read_text())
                dumped = res.record.model_dump(mode="json")
                assert list(on_disk) == list(dumped), name
                got[name] = _normal(on_disk, tmp)
        finally:
            for r in reversed(registered):
                r.__exit__(None, None, None)
    return got


def test_every_path_writes_the_record_it_always_wrote(records):
    if os.environ.get("CLAWGYM_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert list(records) == list(want)
    for name, rec in records.items():
        assert json.dumps(rec, indent=1) == json.dumps(want[name], indent=1), name


def test_the_paths_reach_the_statuses_they_are_named_for(records):
    got = {name: (r["status"], r["failure_boundary"]) for name, r in records.items()}
    assert got["ok"] == ("ok", None) and records["ok"]["reward"] == 1.0
    assert got["task_error"] == ("infra_error", "task")
    assert got["sandbox_failure"] == ("infra_error", "sandbox")
    assert got["launch_failure"] == ("infra_error", "harness")
    assert got["no_answer"] == ("infra_error", "harness")
    assert got["exit_after_answer"][0] == "ok" and records["exit_after_answer"]["exit_code"] == 4
    assert got["policy_failure"] == ("infra_error", "policy")
    assert got["timeout"] == ("timeout", "harness")
    assert "workspace_changes" in records["flood"]["logs"] and records["flood"]["workspace_changes"][3] == "<1994 more>"
    assert records["input_changed"]["inputs_modified"]
    assert got["record_unbuildable"] == ("infra_error", "internal")
    assert got["g-notes"] == ("ok", None) and "grader_notes" in records["g-notes"]["logs"]
    assert got["g-error"] == ("reward_error", "grader")
    assert got["g-invalid"] == ("reward_invalid", "grader")
    assert got["g-full"] == ("reward_error", "grader")
    assert got["g-sandbox"] == ("infra_error", "grader")
    assert got["g-bug"] == ("infra_error", "grader")
    assert "network_trace" in records["traced"]["logs"]
