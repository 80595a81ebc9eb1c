"""Running the audit: every adversary of the kit against every task, through the real harness, at once.

:func:`run_audit` plays, for each task, the do-nothing baseline, the gold gate (expert, ``wrong``) and
each attack of :mod:`leaderboards.audit.kit` as real episodes on one :class:`~clawgym_env.Runtime`
(one proxy, one :class:`~leaderboards.audit.policy.AuditPolicy`), ``concurrency`` episodes at once.
The heavy attacks (disk fill, inode flood) start first, at most ``heavy_concurrency`` at a time while
lighter episodes wait or run, then on every slot. Attacks that read the expert's outputs are planned
as soon as that task's expert and baseline have finished; a file-planting attack that beat the
baseline is followed by its placebo (:mod:`~leaderboards.audit.placebo`).

Invariants: every planned episode ends with exactly one record (an episode that raises is an
``infra_error`` record); an episode that ends in ``infra_error``/``reward_invalid`` is played again
up to ``retries`` times before it counts; the episodes' folders (kept workspaces included) live in a
private temporary folder removed at the end, unless ``out_dir`` is given; a progress bar goes to
stderr when ``progress`` is set.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import sys
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Sequence
from pathlib import Path

from clawgym_env.capture.records import EpisodeRecord
from clawgym_env.envs.runtime import Runtime, failed_episode
from clawgym_env.files.workspace import private_tempdir
from clawgym_env.grading.judge import Judge
from clawgym_env.harness import HarnessAdapter
from clawgym_env.task import Task
from leaderboards.audit.facts import TaskFacts, gather_facts, with_expert_outputs
from leaderboards.audit.kit import ATTACKS, DEFAULT_INODES, EARLY, GOLD, AttackPlan, EpisodePlan, plan_attack, plan_gold
from leaderboards.audit.payloads import EVIDENCE_PREFIX
from leaderboards.audit.placebo import PLANTING, placebo_plan
from leaderboards.audit.placebo import WHY as PLACEBO_WHY
from leaderboards.audit.policy import AuditPolicy
from leaderboards.audit.steps import NOOP
from leaderboards.audit.tamper import WHY as TAMPER_WHY
from leaderboards.audit.tamper import judge_tamper
from leaderboards.audit.verdict import EPSILON, AttackOutcome, AuditReport, GoldOutcome, TaskAudit, judge_attack

BASELINE = "baseline"
MAX_EVIDENCE = 5


@dataclasses.dataclass(frozen=True)
class AuditOptions:
    """How to run an audit. ``attacks``: the kit's attacks to play (all by default, in kit order);
    ``concurrency``: episodes at once, of which at most ``heavy_concurrency`` heavy ones while lighter
    episodes are waiting."""

    harness: str
    sandbox: str = "bwrap"
    concurrency: int = 2
    heavy_concurrency: int = 1
    attacks: tuple[str, ...] = ATTACKS
    inodes: int = DEFAULT_INODES
    fill_data: bool = False
    """``disk_fill`` writes zeros throughout instead of allocating the room (slow; stresses the grader's copy)."""
    retries: int = 1
    progress: bool = False
    out_dir: Path | None = None
    judge: Judge | None = None

    def __post_init__(self) -> None:
        unknown = [a for a in self.attacks if a not in ATTACKS]
        if unknown:
            raise ValueError(f"unknown attack(s) {unknown}; the kit has {', '.join(ATTACKS)}")
        if self.concurrency < 1 or self.heavy_concurrency < 1 or self.retries < 0 or self.inodes < 1:
            raise ValueError("concurrency and heavy_concurrency must be >= 1, retries >= 0, inodes >= 1")


@dataclasses.dataclass
class Played:
    """One finished episode of an attack: its plan, its record, and its kept workspace (if kept)."""

    plan: EpisodePlan
    record: EpisodeRecord
    workspace: Path | None


def evidence(records: list[EpisodeRecord]) -> tuple[str, ...]:
    """The payloads' own ``clawgym-audit: ...`` lines found in the verifier's logs (first few, unique)."""
    seen: dict[str, None] = {}
    for rec in records:
        for key in ("reward_stderr", "reward_stdout"):
            for line in (rec.logs.get(key) or "").splitlines():
                if EVIDENCE_PREFIX in line:
                    seen.setdefault(line.strip()[:200], None)
    return tuple(list(seen)[:MAX_EVIDENCE])


class _Audit:
    """The state of one audit run (see :func:`run_audit`)."""

    def __init__(self, tasks: Sequence[Task], options: AuditOptions, adapter: HarnessAdapter, runtime: Runtime,
                 policy: AuditPolicy, out_dir: Path) -> None:
        self.tasks = {t.id: t for t in tasks}
        self.options, self.adapter, self.runtime, self.policy, self.out_dir = options, adapter, runtime, policy, out_dir
        self.facts: dict[str, TaskFacts] = {t.id: gather_facts(t) for t in tasks}
        self.plans: dict[str, dict[str, AttackPlan]] = defaultdict(dict)
        self.played: dict[str, dict[str, list[Played]]] = defaultdict(lambda: defaultdict(list))
        self.first_left: dict[str, int] = {}
        self.pending: dict[cf.Future, tuple[str, str, bool]] = {}
        self.light_q: deque[tuple[Task, str, EpisodePlan]] = deque()
        self.heavy_q: deque[tuple[Task, str, EpisodePlan]] = deque()
        self.episodes = 0

    def play(self, task: Task, plan: EpisodePlan) -> Played:
        """One episode of ``plan`` (played again after an infrastructure failure, up to ``retries`` times)."""
        record: EpisodeRecord | None = None
        for _ in range(1 + self.options.retries):
            eid = uuid.uuid4().hex[:16]
            self.policy.assign(eid, plan.script)
            try:
                record = self.runtime.run(task, self.adapter, episode_id=eid, keep_workspace=plan.keep_workspace).record
            except Exception as exc:  # noqa: BLE001 - one broken episode is a record, never a lost audit
                record = failed_episode(task, self.adapter.name, self.policy.name, exc).record
            finally:
                self.policy.release(eid)
            if record.is_task_outcome:
                break
        assert record is not None
        ws = self.out_dir / record.episode_id / "workspace" if plan.keep_workspace else None
        return Played(plan, record, ws)

    def queue(self, task: Task, plan: AttackPlan, bar) -> None:
        """Queue the episodes of ``plan`` (heavy ones in their own queue)."""
        self.plans[task.id][plan.name] = plan
        for ep in plan.episodes:
            (self.heavy_q if ep.heavy else self.light_q).append((task, plan.name, ep))
        if bar is not None and plan.episodes:
            bar.total = (bar.total or 0) + len(plan.episodes)
            bar.refresh()

    def _fill(self, pool: cf.Executor) -> None:
        """Start queued episodes while a slot is free: heavy ones first, at most ``heavy_concurrency`` of them
        while lighter episodes are queued or running, on every slot once none is."""
        while len(self.pending) < self.options.concurrency:
            heavy_running = sum(1 for _, _, heavy in self.pending.values() if heavy)
            light_busy = bool(self.light_q) or heavy_running < len(self.pending)
            cap = self.options.heavy_concurrency if light_busy else self.options.concurrency
            if self.heavy_q and heavy_running < cap:
                task, attack, ep = self.heavy_q.popleft()
            elif self.light_q:
                task, attack, ep = self.light_q.popleft()
            else:
                return
            self.pending[pool.submit(self.play, task, ep)] = (task.id, attack, ep.heavy)

    def run(self, pool: cf.Executor, bar) -> None:
        """Play every episode: baselines, gold gates and early attacks first, the rest per task as it is ready."""
        late = [a for a in self.options.attacks if a not in EARLY]
        for task in self.tasks.values():
            for name in self.options.attacks:
                if name in EARLY:
                    self.queue(task, plan_attack(name, self.facts[task.id], inodes=self.options.inodes,
                                                 fill_data=self.options.fill_data), bar)
            gold = plan_gold(self.facts[task.id])
            self.queue(task, AttackPlan(BASELINE, (EpisodePlan(BASELINE, NOOP),)), bar)
            self.queue(task, gold, bar)
            self.first_left[task.id] = 1 + len(gold.episodes)
        self._drain(pool, late, bar)
        for task_id in self.tasks:  # placebos of the planting attacks that beat the baseline
            self._queue_placebos(task_id, bar)
        self._drain(pool, late, bar)

    def _drain(self, pool: cf.Executor, late: list[str], bar) -> None:
        """Start queued episodes and collect finished ones until none is left."""
        self._fill(pool)
        while self.pending:
            done, _ = cf.wait(list(self.pending), return_when=cf.FIRST_COMPLETED)
            for fut in done:
                task_id, attack, _heavy = self.pending.pop(fut)
                played = fut.result()
                self.episodes += 1
                self.played[task_id][attack].append(played)
                if bar is not None:
                    bar.set_postfix_str(f"{task_id}/{played.plan.label}: {played.record.status} "
                                        f"r={played.record.reward:.2f}", refresh=False)
                    bar.update(1)
                if attack in (BASELINE, GOLD):
                    self.first_left[task_id] -= 1
                    if self.first_left[task_id] == 0:
                        self._plan_late(task_id, late, bar)
            self._fill(pool)

    def _baseline(self, task_id: str) -> EpisodeRecord:
        return self.played[task_id][BASELINE][0].record

    def _queue_placebos(self, task_id: str, bar) -> None:
        base = self._baseline(task_id)
        if not base.is_task_outcome:
            return
        for name in PLANTING:
            plan = self.plans[task_id].get(name)
            if plan is None or plan.skipped is not None:
                continue
            scored = [p.record for p in self.played[task_id][name] if p.record.is_task_outcome]
            best = max(scored, key=lambda r: r.reward, default=None)
            if best is None or best.reward <= base.reward + EPSILON:
                continue
            placebo = placebo_plan(name, best)
            if placebo is not None:
                self.queue(self.tasks[task_id], AttackPlan(f"{name}:placebo", (placebo,)), bar)

    def _plan_late(self, task_id: str, late: list[str], bar) -> None:
        expert = next((p.record for p in self.played[task_id][GOLD] if p.plan.label == "expert"), None)
        self.facts[task_id] = with_expert_outputs(self.facts[task_id], expert)
        for name in late:
            self.queue(self.tasks[task_id], plan_attack(name, self.facts[task_id]), bar)

    def verdict(self, task_id: str) -> TaskAudit:
        """The :class:`TaskAudit` of one task from its played episodes."""
        base = self._baseline(task_id)
        baseline = base.reward if base.is_task_outcome else None
        audit = TaskAudit(task_id=task_id, baseline=baseline, baseline_status=base.status,
                          baseline_error=None if base.is_task_outcome else base.error)
        audit.gold = self._gold(task_id)
        for name in self.options.attacks:
            plan = self.plans[task_id][name]
            if plan.skipped is not None:
                audit.attacks[name] = AttackOutcome(name=name, skipped=plan.skipped)
            elif name == "input_tamper":
                audit.attacks[name] = self._tamper(task_id, baseline)
            else:
                recs = [p.record for p in self.played[task_id][name]]
                placebo = [p.record for p in self.played[task_id].get(f"{name}:placebo", [])]
                control = placebo[0].reward if placebo and placebo[0].is_task_outcome else None
                audit.attacks[name] = judge_attack(name, [r.reward for r in recs], [r.status for r in recs], baseline,
                                                   errors=[r.error for r in recs], control=control,
                                                   control_why=PLACEBO_WHY, evidence=evidence(recs))
        return audit

    def _gold(self, task_id: str) -> GoldOutcome:
        plan = self.plans[task_id][GOLD]
        if plan.skipped is not None:
            return GoldOutcome(skipped=plan.skipped)
        out = GoldOutcome()
        reasons = []
        for p in self.played[task_id][GOLD]:
            rec = p.record
            value = rec.reward if rec.is_task_outcome else None
            if value is None:
                reasons.append(f"{p.plan.label}: {rec.status} ({rec.error or rec.reward_reason or 'no reason'})")
            elif p.plan.label == "expert" and value < 1.0:
                reasons.append(f"expert scored {value:.3f}" + (f" ({rec.reward_reason})" if rec.reward_reason else ""))
            setattr(out, p.plan.label, value)
        out.reason = "; ".join(reasons) or None
        return out

    def _tamper(self, task_id: str, baseline: float | None) -> AttackOutcome:
        by_label = {p.plan.label: p for p in self.played[task_id]["input_tamper"]}
        pristine, tampered = by_label["pristine"], by_label["tampered"]
        skipped, control, note = judge_tamper(self.facts[task_id], pristine.record, pristine.workspace,
                                              tampered.record, tampered.workspace, baseline,
                                              sandbox=self.options.sandbox, judge=self.options.judge)
        if skipped is not None:
            return AttackOutcome(name="input_tamper", skipped=skipped)
        rec = tampered.record
        return judge_attack("input_tamper", [rec.reward], [rec.status], baseline, errors=[rec.error],
                            control=control, control_why=TAMPER_WHY, note=note)


def run_audit(suite: str, tasks: Sequence[Task], options: AuditOptions, *,
              adapter: HarnessAdapter | None = None) -> AuditReport:
    """Audit ``tasks`` (of the suite named ``suite``) with the kit; see the module doc for the invariants."""
    from clawgym_env.plugins import make_harness

    t0 = time.monotonic()
    adapter = adapter if adapter is not None else make_harness(options.harness)
    policy = AuditPolicy()
    with contextlib.ExitStack() as stack:
        if options.out_dir is not None:
            out_dir = Path(options.out_dir)
            out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        else:
            out_dir = stack.enter_context(private_tempdir("clawgym-audit-"))
        runtime = stack.enter_context(Runtime(policy, sandbox=options.sandbox, out_dir=out_dir,
                                              judge=options.judge))
        audit = _Audit(tasks, options, adapter, runtime, policy, out_dir)
        bar = None
        if options.progress:
            from tqdm.auto import tqdm

            bar = stack.enter_context(tqdm(total=0, desc=f"audit {suite} ({adapter.name})", unit="ep",
                                           file=sys.stderr))
        with cf.ThreadPoolExecutor(options.concurrency, thread_name_prefix="audit") as pool:
            audit.run(pool, bar)
            verdicts = list(pool.map(audit.verdict, list(audit.tasks)))
    walls: dict[str, list[float]] = defaultdict(list)
    for by_attack in audit.played.values():
        for attack, played in by_attack.items():
            walls[attack.split(":")[0] + (":placebo" if ":" in attack else "")] += [p.record.wall_s for p in played]
    return AuditReport(suite=suite, harness=adapter.name, sandbox=options.sandbox,
                       tasks={v.task_id: v for v in verdicts}, wall_s=time.monotonic() - t0,
                       episodes=audit.episodes, episode_walls=dict(walls))
