"""The row an evaluation writes per episode, and reading a results file back.

A results file is JSON Lines: one :class:`ResultRow` per finished episode, appended as episodes
finish (see :mod:`leaderboards.run`).

Invariants:
  * a row's identity is :attr:`ResultRow.key` = (suite, task_id, harness, policy, sample); a file
    holds at most one *final* row per key: readers keep the last row of a key (a rerun of an
    infrastructure failure appends its new row after the old one);
  * ``status == "infra_error"`` means the episode could not be run (sandbox, harness launch,
    upstream API) even after the runner's retries, and ``reward_invalid`` that no valid reward could
    be computed (the judge failed); such a row carries no task outcome (:attr:`ResultRow.is_task_outcome`
    is False) and is excluded from every mean, never counted as a 0; ``failure_boundary`` says where
    a failure happened (sandbox, harness, proxy, policy, grader, internal);
  * a line that is not a complete JSON object (a crash cut the last write short) is skipped and
    counted, never fatal: :func:`read_results` returns the rows that did parse.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from clawgym_env.capture.records import NOT_TASK_OUTCOMES

ROW_SCHEMA_VERSION = 1
RowKey = tuple[str, str, str, str, int]


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string (second precision), e.g. ``2026-01-02T03:04:05Z``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ResultRow(BaseModel):
    """One evaluated episode (or one episode that infrastructure failures kept from running)."""

    schema_version: int = ROW_SCHEMA_VERSION
    suite: str
    task_id: str
    category: str | None = None
    harness: str
    policy: str
    sample: int = Field(ge=0, description="0-based sample index of this (task, harness, policy)")
    status: str = Field(description="EpisodeRecord.status: ok, harness_error, timeout, no_final_answer, "
                                    "reward_error, reward_invalid or infra_error")
    failure_boundary: str | None = Field(default=None, description="where a failure happened (EpisodeRecord)")
    reward: float = 0.0
    subscores: dict[str, float] = Field(default_factory=dict)
    num_calls: int = 0
    wall_s: float = 0.0
    calls_path: str | None = None
    episode_dir: str | None = None
    error: str | None = None
    timestamp: str = Field(default_factory=utc_now)
    attempts: int = Field(default=1, ge=1, description="episodes started for this row (1 + infra retries)")
    scorer: str | None = Field(default=None, description="host-side scorer that set the reward, if any")
    token_exact: bool | None = Field(default=None, description="every captured call was token-exact")

    @property
    def key(self) -> RowKey:
        """The row's identity ``(suite, task_id, harness, policy, sample)``: a resumed run skips keys it has."""
        return (self.suite, self.task_id, self.harness, self.policy, self.sample)

    @property
    def is_task_outcome(self) -> bool:
        """The reward is the agent's own outcome (scored); False for infra_error and reward_invalid."""
        return self.status not in NOT_TASK_OUTCOMES

    @property
    def is_infra_failure(self) -> bool:
        """No task outcome (see :attr:`is_task_outcome`): retried by the runner, excluded from means."""
        return not self.is_task_outcome

    @property
    def success(self) -> bool:
        """Strict success: the verifier gave full marks."""
        return self.reward >= 1.0


class ReadResult(BaseModel):
    """The rows of a results file and how many of its lines were not valid rows."""

    rows: list[ResultRow] = Field(default_factory=list)
    bad_lines: int = 0
    """Lines that were not a valid row (a truncated last write, hand edits); skipped."""


def parse_lines(lines: Iterable[str]) -> ReadResult:
    """Parse JSONL lines into rows; blank lines are skipped, invalid ones counted in ``bad_lines``."""
    out = ReadResult()
    for line in lines:
        if not line.strip():
            continue
        try:
            out.rows.append(ResultRow.model_validate(json.loads(line)))
        except (ValueError, ValidationError):
            out.bad_lines += 1
    return out


def read_results(paths: str | Path | Iterable[str | Path]) -> ReadResult:
    """Read one or more results files (missing files read as empty) without deduplicating."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out = ReadResult()
    for p in paths:
        p = Path(p)
        if not p.exists():
            continue
        part = parse_lines(p.read_text(encoding="utf-8", errors="replace").splitlines())
        out.rows += part.rows
        out.bad_lines += part.bad_lines
    return out


def latest_by_key(rows: Iterable[ResultRow]) -> list[ResultRow]:
    """One row per key, the last one seen, in first-seen key order."""
    latest: dict[RowKey, ResultRow] = {}
    for row in rows:
        latest[row.key] = row
    return list(latest.values())
