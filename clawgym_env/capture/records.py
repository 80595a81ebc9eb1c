"""Records that cross a wire or a disk (pydantic, versioned by ``schema_version``).

Invariants of :class:`CallRecord`:
  * ``prompt_token_ids`` are exactly the ids the policy was given, ``output_token_ids`` exactly the
    ids it sampled (never re-tokenised), ``output_logprobs[i]`` the logprob of ``output_token_ids[i]``
    under the sampling distribution, so ``len(output_logprobs) == len(output_token_ids)``.
  * ``request`` is the JSON body as received, before any normalisation — except when written: a
    value nested deeper than :data:`MAX_RECORD_DEPTH` is cut there (see :func:`sanitize`).

Invariants of writing (:func:`write_jsonl`, :func:`write_record`): whatever a record holds (a
300-deep request, lone surrogates, a secret echoed by an upstream error), the line written is valid
UTF-8 JSON with every registered secret redacted, in a file created 0600; a record never makes its
writer raise.

Statuses (:data:`EpisodeStatus`): task outcomes — ``ok``, ``harness_error``, ``timeout``,
``no_final_answer``, ``reward_error`` — are scored and trained; ``infra_error`` (something outside the
agent failed: see ``failure_boundary``) and ``reward_invalid`` (no valid reward could be computed) are
neither (:data:`NOT_TASK_OUTCOMES`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from clawgym_env.capture.dialect_names import check_dialect
from clawgym_env.jsontypes import JSONObject
from clawgym_env.redact import redact, redact_obj

SCHEMA_VERSION = 1

Dialect = Annotated[str, AfterValidator(check_dialect)]
"""A registered dialect's name (:mod:`clawgym_env.capture.dialect_names`); validated where a record is built."""
EpisodeStatus = Literal["ok", "harness_error", "timeout", "no_final_answer", "reward_error", "reward_invalid",
                        "infra_error"]
NOT_TASK_OUTCOMES = frozenset({"infra_error", "reward_invalid"})
"""Statuses that carry no task outcome: never trained on, never averaged, counted apart."""
CallKind = Literal["main", "side", "subagent", "compaction"]
"""What a call was for in its episode (:mod:`clawgym_env.capture.call_kinds`): the agent's own trajectory
(``main``), a one-off helper call (``side``: title generation, summaries, safety or quota probes, prompt
suggestions), a delegated agent's conversation (``subagent``) or a context-compaction call (``compaction``)."""
CALL_KINDS: tuple[str, ...] = ("main", "side", "subagent", "compaction")
FailureBoundary = Literal["task", "sandbox", "harness", "proxy", "policy", "grader", "internal"]
"""Where a failure happened (see :mod:`clawgym_env.failures`)."""
MAX_RECORD_DEPTH = 128


class CallRecord(BaseModel):
    """One model call as the proxy served it."""

    schema_version: int = SCHEMA_VERSION
    episode_id: str
    call_index: int
    dialect: Dialect
    path: str
    stream: bool
    request: JSONObject
    headers: dict[str, str] = Field(default_factory=dict)
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    response_message: JSONObject = Field(
        default_factory=dict, description="The assistant message as returned (OpenAI chat shape)")
    sampling: JSONObject = Field(default_factory=dict)
    policy_name: str = ""
    policy_version: int = 0
    token_exact: bool = True
    token_exact_reason: str | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    timings: dict[str, float] = Field(default_factory=dict)
    kind: CallKind = Field(default="main", description="what the call was for (see CallKind); set at episode end")
    kind_reason: str | None = Field(
        default=None, description="who classified the call and on what evidence (adapter rule or structural default)")
    discarded_by: int | None = Field(
        default=None, description="call_index of the later call that retried this one: it re-sent this call's prompt "
                                  "(or, as the adapter declares for its harness, e.g. OpenClaw, the same messages "
                                  "with an interrupted-turn note), so the harness discarded this output (a dead "
                                  "leaf, never trained)")


class WorkspaceChange(BaseModel):
    """One path that differs between the workspace before and after the harness ran. ``path`` is
    always valid UTF-8 (undecodable bytes shown as ``\\xNN``); ``kind`` is what is there now
    (before, for a deletion): file, symlink, fifo, socket, device, dir or other."""

    path: str
    change: Literal["added", "modified", "deleted"]
    size: int | None = None
    kind: str = "file"


class InputChange(BaseModel):
    """One task-provided input file that differs in the final workspace from what the task shipped:
    ``modified`` (other content; ``sha256_now`` when the sizes are equal, else only ``size_now``),
    ``deleted``, or ``replaced`` by something that is not a regular file (``now``: symlink, dir, special)."""

    path: str
    change: Literal["modified", "deleted", "replaced"]
    sha256_task: str
    sha256_now: str | None = None
    size_now: int | None = None
    now: str | None = None


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
    sync_wait_s: float = Field(
        default=0.0, ge=0.0, description="seconds the episode's model calls were held back while the policy's "
                                         "weights changed (the engine's time: not charged against the harness's "
                                         "wall-clock limit, so part of wall_s the agent was not timed for)")
    timings: dict[str, float] = Field(default_factory=dict)
    workspace_changes: list[WorkspaceChange] = Field(default_factory=list)
    inputs_modified: list[InputChange] = Field(
        default_factory=list, description="task-provided input files the agent changed, deleted or replaced "
                                          "(by content hash); visible whether or not the grader restored them")
    exit_code: int | None = None
    error: str | None = None
    logs: dict[str, str] = Field(default_factory=dict)
    sampling: JSONObject = Field(default_factory=dict)
    policy_version: int = 0
    resources: dict[str, float] = Field(
        default_factory=dict, description="harness_started_at (epoch s), peak_memory_mb where measurable")
    failure_boundary: FailureBoundary | None = Field(
        default=None, description="where the failure happened when status is not ok (clawgym_env.failures)")
    limits_hit: list[str] = Field(
        default_factory=list, description="sandbox limits the agent ran into, e.g. ``disk:workspace`` (its outcome)")

    @property
    def is_task_outcome(self) -> bool:
        """True when the reward is the agent's own outcome (to train on and to score)."""
        return self.status not in NOT_TASK_OUTCOMES

    @property
    def is_infra_failure(self) -> bool:
        """True when the record carries no task outcome (``infra_error``, ``reward_invalid``): every
        trainer and metric that skips infrastructure failures skips these too, so a reward that is
        not the agent's is never trained or averaged. ``status`` says which it was."""
        return not self.is_task_outcome


def _clean_str(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates (e.g. from undecodable names): show them escaped
        try:  # a byte smuggled in by surrogateescape (os.fsdecode of a name) shows as that byte
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = text.encode("utf-8", "surrogatepass")
        text = raw.decode("utf-8", "backslashreplace")
    return text


def sanitize(obj: Any, max_depth: int = MAX_RECORD_DEPTH) -> tuple[Any, bool]:
    """(copy, cut) of a JSON-like value that any JSON writer accepts: strings valid UTF-8 and
    redacted, keys strings, containers nested deeper than ``max_depth`` replaced by a marker string
    (``cut`` says whether that happened). Iterative: any depth is fine."""
    cut = False
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(obj, root, 0, 0)]
    while stack:
        src, parent, key, depth = stack.pop()
        if isinstance(src, (dict, list, tuple)) and depth >= max_depth:
            parent[key] = f"<cut: nested deeper than {max_depth} levels>"
            cut = True
        elif isinstance(src, dict):
            dst: JSONObject = {}
            parent[key] = dst
            for k, v in src.items():
                nk = _clean_str(k if isinstance(k, str) else str(k))
                dst[nk] = None
                stack.append((v, dst, nk, depth + 1))
        elif isinstance(src, (list, tuple)) and all(type(v) in (int, float) for v in src):
            parent[key] = list(src)  # token ids, logprobs: nothing to clean
        elif isinstance(src, (list, tuple)):
            lst: list[Any] = [None] * len(src)
            parent[key] = lst
            stack.extend((v, lst, i, depth + 1) for i, v in enumerate(src))
        elif isinstance(src, str):
            parent[key] = _clean_str(src)
        elif src is None or isinstance(src, (bool, int, float)):
            parent[key] = src
        elif isinstance(src, BaseModel):
            parent[key] = sanitize(src.model_dump(mode="json", warnings=False), max_depth - depth)[0]
        else:
            parent[key] = _clean_str(repr(src))
    return redact_obj(root[0]), cut


def dump_record(rec: BaseModel, indent: int | None = None) -> str:
    """One JSON text for ``rec`` (see the module doc: never raises for what the record holds).

    Fast path: pydantic's own serialiser, then secrets redacted in the text (API keys and tokens
    hold no character JSON escapes). Slow path, when pydantic refuses the value (too deep, lone
    surrogates): :func:`sanitize`."""
    try:
        return redact(rec.model_dump_json(indent=indent))
    except Exception:  # noqa: BLE001 - whatever pydantic refuses, the slow path copes with
        pass
    fields = {name: getattr(rec, name) for name in type(rec).model_fields}
    data, cut = sanitize(fields)
    if cut and isinstance(data.get("request"), dict):
        data["request"]["clawgym_cut"] = f"parts nested deeper than {MAX_RECORD_DEPTH} levels were not stored"
    return json.dumps(data, ensure_ascii=False, allow_nan=True, indent=indent)


def _open_private(path: Path, flags: int) -> int:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, flags | os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # also when the file existed with wider modes
    return fd


def write_jsonl(path: str | Path, records: Iterable[BaseModel]) -> Path:
    """Write records one JSON object per line (overwrites ``path``; file mode 0600)."""
    path = Path(path)
    with os.fdopen(_open_private(path, os.O_TRUNC), "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(dump_record(rec) + "\n")
    return path


def write_record(path: str | Path, rec: BaseModel) -> Path:
    """Write one record as indented JSON (``episode.json``), mode 0600, atomically (temp + rename)."""
    path = Path(path)
    text = dump_record(rec, indent=2)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os.fdopen(_open_private(tmp, os.O_TRUNC), "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


def read_calls(path: str | Path) -> list[CallRecord]:
    """Read a calls JSONL file written by :func:`write_jsonl`."""
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                out.append(CallRecord.model_validate(json.loads(line)))
    return out
