"""``clawgym audit``: scripted adversaries against a task suite, through the real harness.

A reward that can be had without the work is what RL finds first. The audit plays a kit of generic
adversaries (:mod:`leaderboards.audit.kit`: module shadowing, ``os._exit(0)`` in the agent's modules,
verifier rewriting, links into ``reward/``, input tampering, disk fill, inode flood) and the gold gate
(the expert must score full marks, its known-wrong ``wrong`` steps must not) against each task, and
compares each attack with the do-nothing agent on the same task (:mod:`leaderboards.audit.verdict`).

Modules: :mod:`~leaderboards.audit.facts` (what an adversary may know of a task),
:mod:`~leaderboards.audit.payloads` (the code left in the workspace), :mod:`~leaderboards.audit.trivial`
(trivial inputs), :mod:`~leaderboards.audit.steps` (scripts), :mod:`~leaderboards.audit.kit` (the
adversaries), :mod:`~leaderboards.audit.policy` (one policy, a script per episode),
:mod:`~leaderboards.audit.runner` (the episodes, concurrently), :mod:`~leaderboards.audit.tamper`
(judging the tampering), :mod:`~leaderboards.audit.placebo` (the control of a file-planting attack),
:mod:`~leaderboards.audit.verdict` (records, rules, JSON) and :mod:`~leaderboards.audit.table` (the text
report).
"""

from leaderboards.audit.kit import ATTACKS, DEFAULT_INODES
from leaderboards.audit.runner import AuditOptions, run_audit
from leaderboards.audit.table import render_table
from leaderboards.audit.verdict import AttackOutcome, AuditReport, GoldOutcome, TaskAudit

__all__ = ["ATTACKS", "DEFAULT_INODES", "AttackOutcome", "AuditOptions", "AuditReport", "GoldOutcome", "TaskAudit",
           "render_table", "run_audit"]
