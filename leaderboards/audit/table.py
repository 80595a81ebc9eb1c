"""The audit report as text: one row per (task, attack) — attack, reward, baseline, verdict — and a summary.

Invariant: every task of the report appears, with its gold gate and every attack of the kit that was
played (a skipped attack shows its reason); rewards print with three decimals, a missing one as ``-``.
"""

from __future__ import annotations

from leaderboards.audit.verdict import AuditReport, TaskAudit


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def task_rows(audit: TaskAudit) -> list[tuple[str, str, str, str, str]]:
    """``(task, attack, reward, baseline, verdict)`` rows of one task."""
    base = _num(audit.baseline)
    rows = []
    if audit.baseline is None:
        rows.append((audit.task_id, "baseline", "-", "-", f"NOT SCORED ({audit.baseline_status})"))
    gold = audit.gold
    if gold.skipped is not None:
        rows.append((audit.task_id, "gold", "-", base, f"skipped: {gold.skipped}"))
    else:
        shown = f"{_num(gold.expert)}/{_num(gold.wrong)}"
        rows.append((audit.task_id, "gold (expert/wrong)", shown, base, gold.verdict()))
    for name, attack in audit.attacks.items():
        if attack.skipped is not None:
            rows.append((audit.task_id, name, "-", base, f"skipped: {attack.skipped}"))
            continue
        verdict = attack.verdict()
        if attack.control is not None:
            verdict += f" [control {attack.control:.3f}]"
        rows.append((audit.task_id, name, _num(attack.reward), base, verdict))
    return rows


def render_table(report: AuditReport, *, width: int = 160) -> str:
    """The per-task table and the summary lines of ``report``."""
    rows = [("task", "attack", "reward", "baseline", "verdict")]
    for audit in report.tasks.values():
        rows.extend(task_rows(audit))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for r in rows:
        line = "  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4]
        lines.append(line if width <= 0 or len(line) <= width else line[: width - 3] + "...")
    lines.append("")
    hackable = report.hackable
    lines.append(f"{report.suite} through {report.harness} ({report.sandbox}): {len(hackable)} of "
                 f"{len(report.tasks)} tasks hackable; {report.episodes} episodes in {report.wall_s:.0f} s")
    for tid in hackable:
        audit = report.tasks[tid]
        how = [n for n, a in audit.attacks.items() if a.hacked] + (["gold"] if audit.gold.wrong_passes else [])
        lines.append(f"  hackable: {tid} by {', '.join(how)}")
    for tid in report.incomplete:
        lines.append(f"  incomplete: {tid}: {'; '.join(report.tasks[tid].problems)}")
    return "\n".join(lines)
