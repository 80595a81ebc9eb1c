"""Conformance check: run a probe episode through a harness and report how it talks to the model.

``check_harness("claude-code")`` (or ``clawgym harness check claude-code``) runs one builtin task
with the scripted expert, under ``strace`` for network attempts, and :func:`analyze` reports:
dialect(s), streaming, number of calls and side calls, the main thread, its tools, prompt size in tokens,
whether each main-thread call extends the previous one's prompt + output (by messages and by token ids), which
fields the harness rewrote in the history it sent back (tool-call ids, argument serialisation,
dropped thinking, whitespace, a moved trailing context message, re-serialised raw history),
network attempts other than the proxy, startup time and peak memory.

The main thread is found exactly as the call tree labels it (:func:`clawgym_env.capture.call_kinds.classify_calls`):
the adapter's own ``call_kinds`` first, else the structural default (the conversation with the most calls); a dead
retry (``discarded_by``) is not part of it. Every other call counts as a side call, so a title or classifier call
made before the agent's first turn never becomes the thread the report measures.

Adding a harness is: write its adapter, run the check, read the report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from clawgym_env.capture.call_kinds import KindsAdapter, classify_calls
from clawgym_env.capture.records import CallRecord, EpisodeRecord
from clawgym_env.errors import HarnessError
from clawgym_env.jsontypes import JSONObject, JSONValue
from clawgym_env.plugins import load_suite
from clawgym_env.policy.chat_format import normalize_messages
from clawgym_env.proxy.dialects.registry import spec as dialect_spec
from clawgym_env.proxy.splice import turn_key
from clawgym_env.sandbox.base import DEFAULT_PROXY_PORT
from clawgym_env.task import Task
from harness_adapters.options import build_harness

DEFAULT_PROBE_TASK = "builtin/csv_total"
_CONNECT = re.compile(r'connect\(\d+, \{sa_family=(AF_INET6?), sin6?_port=htons\((\d+)\), '
                      r'(?:sin_addr=inet_addr\("([^"]+)"\)|.*?inet_pton\(AF_INET6, "([^"]+)")')


@dataclasses.dataclass
class ConformanceReport:
    """What :func:`analyze` found about one harness (see the module doc for each field)."""

    harness: str
    status: str
    reward: float
    dialects: list[str]
    streaming: bool | None
    num_calls: int
    side_calls: int
    main_calls: list[int]
    main_thread_by: str
    call_kinds: dict[str, int]
    discarded_calls: int
    tools_offered: list[str]
    first_prompt_tokens: int
    max_prompt_tokens: int
    extends_by_messages: list[bool]
    extends_by_tokens: list[bool]
    token_exact_share: float
    rewrites: dict[str, int]
    network_attempts: list[str]
    startup_s: float | None
    wall_s: float
    peak_memory_mb: float | None
    notes: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> JSONObject:
        """The report as plain JSON-able data."""
        return dataclasses.asdict(self)

    def render(self) -> str:
        """The report as an aligned two-column text table."""
        def yes(flags: list[bool]) -> str:
            return f"{sum(flags)}/{len(flags)}" if flags else "-"

        rows = [("harness", self.harness), ("probe episode", f"{self.status}, reward {self.reward:.2f}"),
                ("dialect", ", ".join(self.dialects) or "-"),
                ("streaming", {True: "yes", False: "no", None: "mixed"}[self.streaming]),
                ("calls (side calls)", f"{self.num_calls} ({self.side_calls})"),
                ("call kinds", ", ".join(f"{k} ×{v}" for k, v in sorted(self.call_kinds.items())) or "-"),
                ("main thread (call indices)", f"{', '.join(map(str, self.main_calls)) or 'none'}"
                                               f" - {self.main_thread_by}"),
                ("discarded retries", str(self.discarded_calls)),
                ("tools offered", f"{len(self.tools_offered)}: {', '.join(self.tools_offered)}"),
                ("prompt tokens (first / max)", f"{self.first_prompt_tokens} / {self.max_prompt_tokens}"),
                ("extends previous call, by messages", yes(self.extends_by_messages)),
                ("extends previous call, by token ids", yes(self.extends_by_tokens)),
                ("token-exact calls", f"{self.token_exact_share:.0%}"),
                ("history rewrites", ", ".join(f"{k} ×{v}" for k, v in sorted(self.rewrites.items())) or "none"),
                ("network attempts (not the proxy)", "; ".join(self.network_attempts) or "none"),
                ("startup to first call", f"{self.startup_s:.2f} s" if self.startup_s is not None else "-"),
                ("episode wall time", f"{self.wall_s:.2f} s"),
                ("peak memory", f"{self.peak_memory_mb:.0f} MiB" if self.peak_memory_mb is not None else "-")]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def parsed_messages(call: CallRecord) -> tuple[list[JSONObject], list[JSONObject]]:
    """(normalised OpenAI-chat messages, tools) of a recorded request, through its dialect's parser."""
    module = dialect_spec(call.dialect).load()
    req = module.parse_request(call.request)
    return normalize_messages(req.messages), list(req.tools)


def _tool_names(tools: Sequence[JSONObject]) -> list[str]:
    return [str(t.get("function", t).get("name")) for t in tools]


def _compare_turn(sent: JSONObject, returned: JSONObject, rewrites: Counter) -> None:
    """Count what the harness changed in an assistant turn it sent back (``returned`` = what we answered)."""
    ours, theirs = returned.get("tool_calls") or [], sent.get("tool_calls") or []
    if [t.get("id") for t in ours] != [t.get("id") for t in theirs]:
        rewrites["tool_call_ids"] += 1
    if [t["function"].get("arguments") for t in ours] != [t["function"].get("arguments") for t in theirs]:
        rewrites["argument_serialisation"] += 1
    if returned.get("reasoning_content") and not sent.get("reasoning_content"):
        rewrites["thinking_dropped"] += 1
    if (returned.get("content") or "") != (sent.get("content") or ""):
        rewrites["content_whitespace"] += 1


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {"t": 9, "n": 10, "v": 11, "f": 12, "r": 13, "\\": 92, '"': 34}


def _strace_bytes(text: str) -> bytes:
    """Decode one strace-quoted string (C escapes: \\t, \\n, octal \\ooo, ...) into bytes."""
    out, i = bytearray(), 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out += c.encode("latin-1", "replace")
            i += 1
            continue
        nxt = text[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
            continue
        m = re.match(r"[0-7]{1,3}", text[i + 1:])
        if m:
            out.append(int(m.group(0), 8) & 0xFF)
            i += 1 + len(m.group(0))
        else:
            out += nxt.encode("latin-1", "replace")
            i += 2
    return bytes(out)


def _dns_qname(packet: bytes) -> str | None:
    """The question name of a DNS query packet (None if it does not parse as one)."""
    labels: list[str] = []
    pos = 12
    while pos < len(packet):
        n = packet[pos]
        if n == 0:
            return ".".join(labels) if labels else None
        if n > 63 or pos + 1 + n > len(packet):
            return None
        labels.append(packet[pos + 1:pos + 1 + n].decode("ascii", "replace"))
        pos += 1 + n
    return None


def network_attempts(trace: str | None) -> list[str]:
    """Socket connects other than the proxy relay, and DNS names queried, from an strace log.

    The check runs the harness with ``nameserver 127.0.0.1`` so that DNS queries are sent (and fail
    at once) instead of failing at ``connect``: their names then appear in the payloads.
    """
    seen: list[str] = []

    def add(item: str) -> None:
        if item not in seen:
            seen.append(item)

    for line in (trace or "").splitlines():
        m = _CONNECT.search(line)
        if m:
            port, addr = int(m.group(2)), m.group(3) or m.group(4)
            if port == 53 and addr not in ("127.0.0.1", "::1"):
                add(f"dns via {addr}")
            elif port != 53 and not (addr in ("127.0.0.1", "::1") and port == DEFAULT_PROXY_PORT):
                add(f"connect {addr}:{port}")
        elif re.search(r"\b(sendto|sendmsg|sendmmsg)\(", line):
            for quoted in _QUOTED.findall(line):
                name = _dns_qname(_strace_bytes(quoted))
                if name:
                    add(f"dns {name}")
    return seen


def _main_thread(labelled: Sequence[CallRecord]) -> tuple[list[int], str]:
    """(positions of the main thread in ``labelled``, what decided it): the calls that
    :func:`~clawgym_env.capture.call_kinds.classify_calls` labelled ``main`` and that are not a discarded retry."""
    main = [i for i, c in enumerate(labelled) if c.kind == "main" and c.discarded_by is None]
    reasons = list(dict.fromkeys(str(labelled[i].kind_reason) for i in main))
    more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
    return main, "; ".join(reasons[:3]) + more if reasons else "no call is of kind main"


def analyze(harness: str, record: EpisodeRecord, calls: Sequence[CallRecord],
            adapter: KindsAdapter | None = None) -> ConformanceReport:
    """Pure analysis of one episode's captured calls (see the module docstring); ``adapter`` (the harness's
    adapter, when at hand) labels the calls as it does for the call tree."""
    calls = sorted(calls, key=lambda c: c.call_index)
    labelled = classify_calls(calls, adapter)
    main, decided_by = _main_thread(labelled)
    parsed = [parsed_messages(c) for c in calls]
    rewrites: Counter = Counter()
    by_msgs, by_tokens = [], []
    for a, b in zip(main, main[1:]):
        prev, nxt = calls[a], calls[b]
        pm, nm = parsed[a][0], parsed[b][0]
        head = prev.prompt_token_ids + prev.output_token_ids
        by_tokens.append(nxt.prompt_token_ids[:len(head)] == head)
        key = turn_key(prev.response_message)
        j = next((k for k, m in enumerate(nm) if m["role"] == "assistant" and turn_key(m) == key), None)
        if j is None:
            rewrites["assistant_turn_missing"] += 1
            by_msgs.append(False)
            continue
        _compare_turn(nm[j], prev.response_message, rewrites)
        extends = j == len(pm) and _same_context(nm[:len(pm)], pm)
        by_msgs.append(extends)
        if not extends and pm and pm[-1]["role"] == "user" and nm[-1] == pm[-1] and \
                _same_context(nm[:len(pm) - 1], pm[:-1]):
            rewrites["trailing_context_message_moved"] += 1
        raw_key = dialect_spec(prev.dialect).history_key
        raw_prev, raw_next = prev.request.get(raw_key), nxt.request.get(raw_key)
        if isinstance(raw_prev, list) and isinstance(raw_next, list):
            n = min(len(raw_prev), len(raw_next), j)
            if any(raw_prev[k] != raw_next[k] for k in range(n)) and _same_context(nm[:n], pm[:n]):
                rewrites["raw_history_reserialised"] += 1
    streams = {c.stream for c in calls}
    tools = _tool_names(parsed[main[0]][1]) if main else []
    started = record.resources.get("harness_started_at")
    notes = []
    if calls and not main:
        notes.append("no call is the main thread: the adapter's call_kinds marked every call otherwise")
    if record.status != "ok":
        notes.append(f"probe episode ended with status {record.status}: {record.error}")
    if record.logs.get("network_trace", "").startswith("(no trace"):
        notes.append("network attempts not traced: strace is not installed")
    return ConformanceReport(
        harness=harness, status=record.status, reward=record.reward,
        dialects=sorted({c.dialect for c in calls}), streaming=streams.pop() if len(streams) == 1 else None,
        num_calls=len(calls), side_calls=len(calls) - len(main),
        main_calls=[calls[i].call_index for i in main], main_thread_by=decided_by,
        call_kinds=dict(Counter(c.kind for c in labelled)),
        discarded_calls=sum(c.discarded_by is not None for c in labelled), tools_offered=tools,
        first_prompt_tokens=len(calls[main[0]].prompt_token_ids) if main else 0,
        max_prompt_tokens=max((len(c.prompt_token_ids) for c in calls), default=0),
        extends_by_messages=by_msgs, extends_by_tokens=by_tokens,
        token_exact_share=sum(c.token_exact for c in calls) / len(calls) if calls else 0.0,
        rewrites=dict(rewrites), network_attempts=network_attempts(record.logs.get("network_trace")),
        startup_s=(min(c.started_at for c in calls) - started) if calls and started else None, wall_s=record.wall_s,
        peak_memory_mb=record.resources.get("peak_memory_mb"), notes=notes)


def _same_context(a: list[JSONObject], b: list[JSONObject]) -> bool:
    """Messages equal up to what a harness may legitimately rewrite in assistant turns."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x["role"] != y["role"]:
            return False
        if x["role"] == "assistant":
            if turn_key(x) != turn_key(y):
                return False
        elif x.get("content") != y.get("content"):
            return False
    return True


def probe_task(spec: Task | str | Path) -> Task:
    """The probe task: a :class:`Task`, ``SUITE/ID`` or a path to one task dir, found through the
    suite registry (:func:`clawgym_env.plugins.load_suite`), so the check needs no task package."""
    if isinstance(spec, Task):
        return spec
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "data_entry.json").is_file():  # one task dir: load its folder, pick it
        suite = load_suite(path.resolve().parent)
        found = [t for t in suite.tasks if t.task_dir is not None and Path(t.task_dir).resolve() == path.resolve()]
        issue = next((i.error for i in suite.issues if Path(i.path).resolve() == path.resolve()), None)
        if found:
            return found[0]
        raise HarnessError(f"probe task {spec}: {issue or 'not a loadable task dir'}")
    text = str(spec).rstrip("/")
    if "/" not in text:
        raise HarnessError(f"probe task {text!r} must be SUITE/ID or a path to a task dir")
    head, task_id = text.rsplit("/", 1)
    return load_suite(head).get(task_id)


def check_harness(harness: str, *, task: Task | str | Path = DEFAULT_PROBE_TASK, policy: str = "scripted:expert",
                  sandbox: str = "bwrap", out_dir: str | None = None, options: Mapping[str, JSONValue] | None = None,
                  cache_dir: str | os.PathLike | None = None) -> ConformanceReport:
    """Install (if needed) and probe ``harness`` with one episode on ``task`` (see :func:`probe_task`);
    return the report. ``options`` are the harness adapter's own constructor keywords and ``cache_dir`` its
    harness cache, checked against its constructor (:func:`harness_adapters.options.build_harness`)."""
    from clawgym_env.envs.runtime import Runtime

    probe = probe_task(task)
    adapter = build_harness(harness, options, cache_dir=cache_dir)
    adapter.install()
    with Runtime(policy, sandbox=sandbox, out_dir=out_dir) as rt:
        result = rt.run(probe, adapter, trace_network=True)
    return analyze(adapter.name, result.record, result.calls, adapter)


def report_json(report: ConformanceReport) -> str:
    """The report as indented JSON."""
    return json.dumps(report.as_dict(), indent=2)
