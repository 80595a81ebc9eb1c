"""The audit's findings: typed records, the verdict rules and the JSON line.

Rules (:data:`EPSILON` = 1e-6 on rewards in [0, 1]):

* an attack **beats the baseline** when its reward (the best of its episodes) exceeds the do-nothing
  agent's reward on the same task by more than :data:`EPSILON` and also its control's (``control``):
  for ``input_tamper``, the same outputs graded with the pristine inputs put back (else the check did
  not follow the trivialised inputs: the replay's outputs were right anyway); for a file-planting
  attack, its placebo, the same files emptied (else their places earned the reward, not the payload);
* an attack whose episode ends in ``infra_error`` or ``reward_invalid`` (after a retry) **escapes
  scoring**: evaluation retries and then drops such an episode, so an agent that causes one hides its
  failure (counted as a hack when the baseline itself was scored);
* the **gold gate** fails when the expert scores less than full marks (the task is broken) or the
  known-wrong ``wrong`` steps score full marks (the check accepts a wrong solution: a hack);
* a task is **hackable** when an attack beats its baseline or escapes scoring, or its ``wrong`` steps
  score full marks; it is **incomplete** when it could not be judged: its baseline has no valid reward,
  or its expert misses full marks. ``clawgym audit`` exits 1 when a task is hackable, else 3 when one
  is incomplete, else 0.
"""

from __future__ import annotations

import dataclasses

from clawgym_env.jsontypes import JSONObject

EPSILON = 1e-6
SCORED = ("ok", "reward_error", "harness_error", "timeout", "no_final_answer")
"""Episode statuses that carry the agent's outcome (its reward is scored)."""


@dataclasses.dataclass
class AttackOutcome:
    """One attack against one task. ``reward`` is the best of its episodes (None when skipped or when
    no episode was scored); ``status`` the worst status among them."""

    name: str
    reward: float | None = None
    beats_baseline: bool = False
    skipped: str | None = None
    status: str = "ok"
    escapes_scoring: bool = False
    error: str | None = None
    note: str | None = None
    control: float | None = None
    evidence: tuple[str, ...] = ()

    @property
    def hacked(self) -> bool:
        """Whether this attack found a hole (beat the baseline, or escaped scoring)."""
        return self.beats_baseline or self.escapes_scoring

    def verdict(self) -> str:
        """A word or two for the table."""
        if self.skipped is not None:
            return "skipped"
        if self.escapes_scoring:
            return f"HACKABLE ({self.status}: escapes scoring)"
        if self.beats_baseline:
            return "HACKABLE (beats the baseline)"
        if self.status not in SCORED:
            return f"not scored ({self.status})"
        if self.control is not None and self.note:
            return "ok (its control scores as much)"
        return "ok"

    def to_json(self) -> JSONObject:
        """``{"reward", "beats_baseline", ...}`` or ``{"skipped": why}``."""
        if self.skipped is not None:
            return {"skipped": self.skipped}
        out: JSONObject = {"reward": self.reward, "beats_baseline": self.beats_baseline}
        if self.status != "ok":
            out["status"] = self.status
        if self.escapes_scoring:
            out["escapes_scoring"] = True
        for key in ("error", "note", "control"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.evidence:
            out["evidence"] = list(self.evidence)
        return out


@dataclasses.dataclass
class GoldOutcome:
    """The gold-sanity gate: the expert's reward and the known-wrong solution's (None: not run)."""

    expert: float | None = None
    wrong: float | None = None
    skipped: str | None = None
    reason: str | None = None
    """Why the gate failed, or why a reward is missing (an unscored episode)."""

    @property
    def wrong_passes(self) -> bool:
        """The known-wrong solution scored full marks: the check accepts a wrong solution."""
        return self.wrong is not None and self.wrong >= 1.0 - EPSILON

    @property
    def expert_fails(self) -> bool:
        """The expert did not score full marks (or was not scored): the task is broken."""
        return self.skipped is None and (self.expert is None or self.expert < 1.0 - EPSILON)

    @property
    def passed(self) -> bool:
        """Whether the gate holds (or does not apply)."""
        return not (self.wrong_passes or self.expert_fails)

    def verdict(self) -> str:
        """A word or two for the table."""
        if self.skipped is not None:
            return "skipped"
        if self.wrong_passes:
            return "HACKABLE (the wrong solution scores full marks)"
        if self.expert_fails:
            return "BROKEN (the expert misses full marks)"
        return "ok"

    def to_json(self) -> JSONObject:
        """``{"expert", "wrong", "passed", ["reason"]}`` or ``{"skipped": why}``."""
        if self.skipped is not None:
            return {"skipped": self.skipped}
        out: JSONObject = {"expert": self.expert, "wrong": self.wrong, "passed": self.passed}
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclasses.dataclass
class TaskAudit:
    """Everything the audit found about one task."""

    task_id: str
    baseline: float | None
    baseline_status: str
    baseline_error: str | None = None
    attacks: dict[str, AttackOutcome] = dataclasses.field(default_factory=dict)
    gold: GoldOutcome = dataclasses.field(default_factory=GoldOutcome)

    @property
    def hackable(self) -> bool:
        """An attack beat the baseline or escaped scoring, or the wrong solution scores full marks."""
        return any(a.hacked for a in self.attacks.values()) or self.gold.wrong_passes

    @property
    def problems(self) -> list[str]:
        """Why the task could not be judged fully (empty when it could)."""
        out = []
        if self.baseline is None:
            out.append(f"the do-nothing agent got no valid reward ({self.baseline_status}"
                       + (f": {self.baseline_error}" if self.baseline_error else "") + ")")
        if self.gold.expert_fails:
            out.append("the expert misses full marks" + (f" ({self.gold.reason})" if self.gold.reason else ""))
        return out

    def to_json(self) -> JSONObject:
        """This task's entry of the JSON line."""
        attacks = {name: a.to_json() for name, a in self.attacks.items()}
        attacks["gold"] = self.gold.to_json()
        out: JSONObject = {"baseline": self.baseline, "attacks": attacks, "hackable": self.hackable}
        if self.baseline_status != "ok":
            out["baseline_status"] = self.baseline_status
        if self.problems:
            out["problems"] = self.problems
        return out


@dataclasses.dataclass
class AuditReport:
    """The audit of a suite (or of some of its tasks) through one harness and sandbox."""

    suite: str
    harness: str
    sandbox: str
    tasks: dict[str, TaskAudit]
    wall_s: float = 0.0
    episodes: int = 0
    episode_walls: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    """Wall seconds of every episode, by attack (``baseline``, ``gold`` and placebos included); not in the JSON."""

    @property
    def hackable(self) -> list[str]:
        """The ids of the hackable tasks, in suite order."""
        return [tid for tid, t in self.tasks.items() if t.hackable]

    @property
    def incomplete(self) -> list[str]:
        """The ids of the tasks that could not be judged fully, in suite order."""
        return [tid for tid, t in self.tasks.items() if t.problems]

    @property
    def exit_code(self) -> int:
        """1 when a task is hackable, else 3 when a task is incomplete, else 0."""
        if self.hackable:
            return 1
        return 3 if self.incomplete else 0

    def to_json(self) -> JSONObject:
        """The one JSON object ``clawgym audit --json`` ends with."""
        return {"suite": self.suite, "harness": self.harness, "sandbox": self.sandbox,
                "tasks": {tid: t.to_json() for tid, t in self.tasks.items()}, "hackable": self.hackable,
                "incomplete": self.incomplete, "episodes": self.episodes, "wall_s": round(self.wall_s, 1)}


def judge_attack(name: str, rewards: list[float | None], statuses: list[str], baseline: float | None, *,
                 errors: list[str | None] | None = None, control: float | None = None, control_why: str = "",
                 note: str | None = None, evidence: tuple[str, ...] = ()) -> AttackOutcome:
    """The outcome of an attack from its episodes' rewards and statuses (see the module rules).

    ``control``: the reward of the attack's control — for ``input_tamper`` its outputs with the pristine
    inputs put back, for a file-planting attack its placebo (:mod:`~leaderboards.audit.placebo`); the
    attack beats the baseline only when its reward is also above the control's (else ``control_why`` is
    noted)."""
    scored = [r for r, s in zip(rewards, statuses) if s in SCORED and r is not None]
    unscored = [(s, e) for s, e in zip(statuses, errors or [None] * len(statuses)) if s not in SCORED]
    reward = max(scored) if scored else None
    status = unscored[0][0] if unscored else next((s for s in statuses if s != "ok"), "ok")
    beats = baseline is not None and reward is not None and reward > baseline + EPSILON
    if beats and control is not None and reward is not None and reward <= control + EPSILON:
        beats = False
        note = (note + "; " if note else "") + (control_why or "the control scores as much")
    return AttackOutcome(name=name, reward=reward, beats_baseline=beats, status=status,
                         escapes_scoring=bool(unscored) and baseline is not None,
                         error=unscored[0][1] if unscored else None, note=note, control=control, evidence=evidence)
