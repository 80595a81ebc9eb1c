"""Records that cross a wire or a disk (pydantic, versioned by ``schema_version``).

Invariants of :class:`CallRecord`:
  * ``prompt_token_ids`` are exactly the ids the policy was given, ``output_token_ids`` exactly the
    ids it sampled (never re-tokenised), ``output_logprobs[i]`` the logprob of ``output_token_ids[i]``
    under the sampling distribution, so ``len(output_logprobs) == len(output_token_ids)``.
  * ``request`` is the JSON body as received, before any normalisation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1

Dialect = Literal["openai_chat", "anthropic_messages", "openai_responses"]
EpisodeStatus = Literal["ok", "harness_error", "timeout", "no_final_answer", "reward_error", "infra_error"]


class CallRecord(BaseModel):
    """One model call as the proxy served it."""

    schema_version: int = SCHEMA_VERSION
    episode_id: str
    call_index: int
    dialect: Dialect
    path: str
    stream: bool
    request: dict[str, Any]
    headers: dict[str, str] = Field(default_factory=dict)
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    response_message: dict[str, Any] = Field(
        default_factory=dict, description="The assistant message as returned (OpenAI chat shape)")
    sampling: dict[str, Any] = Field(default_factory=dict)
    policy_name: str = ""
    policy_version: int = 0
    token_exact: bool = True
    token_exact_reason: str | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    timings: dict[str, float] = Field(default_factory=dict)


class WorkspaceChange(BaseModel):
    path: str
    change: Literal["added", "modified", "deleted"]
    size: int | None = None


class EpisodeRecord(BaseModel):
    """The outcome of one whole harness episode. A failed episode is a record, not a crash."""

    schema_version: int = SCHEMA_VERSION
    episode_id: str
    task_id: str
    suite: str | None = None
    harness: str
    policy: str
    status: EpisodeStatus
    reward: float = 0.0
    subscores: dict[str, float] = Field(default_factory=dict)
    reward_reason: str | None = None
    final_message: str | None = None
    num_calls: int = 0
    calls_path: str | None = None
    wall_s: float = 0.0
    timings: dict[str, float] = Field(default_factory=dict)
    workspace_changes: list[WorkspaceChange] = Field(default_factory=list)
    exit_code: int | None = None
    error: str | None = None
    logs: dict[str, str] = Field(default_factory=dict)
    sampling: dict[str, Any] = Field(default_factory=dict)
    policy_version: int = 0
    resources: dict[str, float] = Field(
        default_factory=dict, description="harness_started_at (epoch s), peak_memory_mb where measurable")

    @property
    def is_infra_failure(self) -> bool:
        return self.status == "infra_error"


def write_jsonl(path: str | Path, records: Iterable[BaseModel]) -> Path:
    """Write records one JSON object per line (overwrites ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(rec.model_dump_json() + "\n")
    return path


def read_calls(path: str | Path) -> list[CallRecord]:
    """Read a calls JSONL file written by :func:`write_jsonl`."""
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                out.append(CallRecord.model_validate(json.loads(line)))
    return out
