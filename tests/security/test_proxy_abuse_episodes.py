"""Abusing the serving proxy from inside a real episode, under bubblewrap and Docker.

The agent is the ``mini`` harness in a real sandbox, driven by a scripted policy whose bash step runs a
standard-library Python client against the episode's own proxy endpoint, as any process in the sandbox
could: the proxy at ``$CLAWGYM_PROXY_URL``, the episode's path ``/ep/<token>/v1`` read from the command
line the harness was launched with (``--base-url``). It sends

1. a chat completion carrying a 20 MB unknown field, once with a ``Content-Length`` and once chunked (so the
   proxy has to count the bytes as they come): each is refused with 413 ``request_too_large`` in OpenAI's
   error shape;
2. ``{"pad": [{}, {}, ...]}`` with more JSON values than ``max_json_values``: 413 ``request_too_large``;
3. three concurrent chat-completion uploads, each held open one byte short of its ``Content-Length``, that
   together pass the episode's bytes in flight (``max_episode_inflight_bytes``) while any two fit: the proxy
   refuses at least one (429 ``episode_inflight_limit``, or it closes the connection) and, once the last
   bytes are sent, serves the ones it held.

And the episode is not derailed by it: it ends as the agent's outcome (``ok``), its recorded calls stay
small (the 12 MiB unknown fields of the served uploads are recorded only up to ``max_unknown_bytes``), and
an honest episode on the same runtime right after completes ``ok``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawgym_env.envs.runtime import Runtime
from clawgym_env.plugins import make_harness
from clawgym_env.proxy.guards.bounds import ProxyLimits
from tasks import load_task_dir

MOUNT = "/root/.openclaw/workspace"
BACKENDS = ["bwrap", pytest.param("docker", marks=pytest.mark.docker)]
LIMITS = ProxyLimits()
HUGE_FIELD = 20_000_000  # the 20 MB unknown field, past max_body_bytes
PAD_VALUES = LIMITS.max_json_values + 1024  # `{}`s in the pad list, past max_json_values
UPLOADS = 3
UPLOAD_BYTES = LIMITS.max_episode_inflight_bytes * 3 // 8  # each upload's body: any two fit, three do not
RECORDS_BOUND = 1 << 20  # what the abusive episode's calls.jsonl may take

# The client run inside the sandbox (standard library only). It prints one line `PROBE <json>` per attack.
ABUSE = r'''
import http.client, json, os, select, threading, time
from urllib.parse import urlsplit

HUGE, PAD, UPLOADS, UPLOAD = {huge}, {pad}, {uploads}, {upload}


def base_path():
    """The episode's /ep/<token>/v1, from the command line of the harness this step runs under."""
    pid = os.getpid()
    while pid > 1:
        try:
            argv = open(f"/proc/{{pid}}/cmdline", "rb").read().split(b"\0")
            stat = open(f"/proc/{{pid}}/stat").read()
        except OSError:
            break
        if b"--base-url" in argv:
            return urlsplit(argv[argv.index(b"--base-url") + 1].decode()).path.rstrip("/")
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    raise SystemExit("PROBE_ERROR no ancestor was launched with --base-url")


PROXY = urlsplit(os.environ["CLAWGYM_PROXY_URL"])
PATH = base_path() + "/chat/completions"
HEAD = b'{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "pad": "'
TAIL = b'"}}'
BLOCK = b"x" * 65536


def xs(n):
    while n > 0:
        yield BLOCK[:min(n, len(BLOCK))]
        n -= len(BLOCK)


def open_post(length, chunked=False):
    conn = http.client.HTTPConnection(PROXY.hostname, PROXY.port, timeout=90)
    conn.putrequest("POST", PATH)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding" if chunked else "Content-Length", "chunked" if chunked else str(length))
    conn.endheaders()
    return conn


def answer(conn, note=""):
    """(status, the error object of the answer, or a note on how the connection ended)."""
    try:
        resp = conn.getresponse()
        text = resp.read(1 << 16)
    except (OSError, http.client.HTTPException) as exc:
        return "closed", f"{{note}} {{type(exc).__name__}}".strip()
    try:
        err = json.loads(text).get("error")
    except (ValueError, AttributeError):
        err = text[:200].decode(errors="replace")
    return resp.status, err


def push(conn, pieces, chunked=False):
    """Send the pieces until the proxy answers early or the connection breaks; '' or how it stopped."""
    try:
        for piece in pieces:
            if select.select([conn.sock], [], [], 0)[0]:
                return "answered early"
            conn.send(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        if chunked:
            conn.send(b"0\r\n\r\n")
    except OSError as exc:
        return type(exc).__name__
    return ""


def report(name, **fields):
    print("PROBE " + json.dumps(dict(name=name, **fields)), flush=True)


def huge_field(chunked):
    total = len(HEAD) + HUGE + len(TAIL)
    conn = open_post(total, chunked)
    note = push(conn, [HEAD, *xs(HUGE), TAIL], chunked)
    status, err = answer(conn, note)
    report("chunked" if chunked else "sized", status=status, error=err, sent=total, note=note)
    conn.close()


def pad():
    body = b'{{"pad": [' + b", ".join([b"{{}}"] * PAD) + b"]}}"
    conn = open_post(len(body))
    note = push(conn, [body[i:i + 65536] for i in range(0, len(body), 65536)])
    status, err = answer(conn, note)
    report("pad", status=status, error=err, sent=len(body), note=note)
    conn.close()


def held():
    """UPLOADS concurrent bodies of UPLOAD bytes each, all held one byte short; then the answers."""
    fill = UPLOAD - len(HEAD) - len(TAIL)
    conns = [open_post(UPLOAD) for _ in range(UPLOADS)]
    notes = [""] * UPLOADS

    def upload(i):
        notes[i] = push(conns[i], [HEAD, *xs(fill), TAIL[:-1]])

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(UPLOADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outcomes = [None] * UPLOADS
    deadline = time.monotonic() + 60  # a safety net: the proxy answers the one past the bound at once
    while time.monotonic() < deadline and all(o is None for o in outcomes):
        for i, conn in enumerate(conns):
            if notes[i] or select.select([conn.sock], [], [], 0.2)[0]:
                outcomes[i] = answer(conn, notes[i])
    for i, conn in enumerate(conns):  # the rest were held: complete them
        if outcomes[i] is None:
            note = push(conn, [TAIL[-1:]])
            outcomes[i] = answer(conn, note)
        conn.close()
    report("held", outcomes=outcomes, notes=notes, upload=UPLOAD)


huge_field(False)
huge_field(True)
pad()
held()
'''


def _task(root: Path, name: str, attacker: bool):
    """A small task whose workspace holds ``ATTACKER`` in the abusive episode only (one script runs both)."""
    d = root / name
    (d / "reward").mkdir(parents=True)
    (d / "input_files").mkdir()
    (d / "input_files" / "notes.txt").write_text("nothing to do\n")
    if attacker:
        (d / "input_files" / "ATTACKER").write_text("1\n")
    (d / "data_entry.json").write_text(json.dumps({"task_id": name, "user_query": "say done",
                                                   "input_mount_dir": MOUNT, "metadata": {}}))
    (d / "reward" / "reward.sh").write_text("#!/usr/bin/env bash\necho 1.0\n")
    return load_task_dir(d)


def _script(root: Path) -> Path:
    client = ABUSE.format(huge=HUGE_FIELD, pad=PAD_VALUES, uploads=UPLOADS, upload=UPLOAD_BYTES)
    step = f"if [ -f ATTACKER ]; then python3 - <<'EOF'\n{client}EOF\nelse echo HONEST_STEP; fi"
    path = root / "script.json"
    path.write_text(json.dumps({"steps": [{"tool": "bash", "command": step}, {"final": "done"}]}))
    return path


def _tool_results(calls_path: str) -> str:
    """The tool results the harness sent back to the model, read from the episode's calls file."""
    lines = [json.loads(line) for line in Path(calls_path).read_text().splitlines() if line.strip()]
    assert lines, f"no call recorded in {calls_path}"
    messages = lines[-1]["request"].get("messages") or []
    return "\n".join(str(m.get("content")) for m in messages if m.get("role") == "tool")


def _probes(text: str) -> dict[str, dict]:
    return {p["name"]: p for p in (json.loads(line.split("PROBE ", 1)[1]) for line in text.splitlines()
                                  if line.startswith("PROBE {"))}


def _backend(name: str) -> str:
    if name == "docker":
        from helpers_docker import require_engine

        require_engine()
    return name


def _openai_error(probe: dict, code: str) -> None:
    err = probe["error"]
    assert isinstance(err, dict) and {"message", "type", "code"} <= set(err), probe
    assert err["code"] == code, probe


def test_the_sizes_attack_the_default_bounds():
    """The attacks below are sized against the default limits: keep them past the bounds they attack."""
    assert HUGE_FIELD > LIMITS.max_body_bytes
    assert PAD_VALUES > LIMITS.max_json_values and 4 * PAD_VALUES < LIMITS.max_body_bytes
    assert UPLOAD_BYTES <= LIMITS.max_body_bytes
    assert 2 * UPLOAD_BYTES < LIMITS.max_episode_inflight_bytes < UPLOADS * UPLOAD_BYTES


@pytest.mark.parametrize("sandbox", BACKENDS)
def test_proxy_abuse_from_inside_an_episode_is_refused_and_serving_goes_on(tmp_path, sandbox):
    sandbox = _backend(sandbox)
    abuser, honest = _task(tmp_path, "abuser", True), _task(tmp_path, "honest", False)
    with Runtime(f"scripted:file:{_script(tmp_path)}", sandbox=sandbox, out_dir=tmp_path / "eps") as rt:
        assert rt.proxy.bounds == LIMITS, "the runtime's proxy does not run the default limits this test sizes for"
        bad = rt.run(abuser, make_harness("mini")).record
        good = rt.run(honest, make_harness("mini")).record

    seen = _tool_results(bad.calls_path)
    probes = _probes(seen)
    assert set(probes) == {"sized", "chunked", "pad", "held"}, (bad.status, bad.error, seen[-3000:], bad.logs)
    # (1) the 20 MB unknown field, announced up front or chunked: 413 in OpenAI's error shape
    for name in ("sized", "chunked"):
        assert probes[name]["status"] == 413, probes[name]
        _openai_error(probes[name], "request_too_large")
        assert "max_body_bytes" in probes[name]["error"]["message"], probes[name]
    # (2) more JSON values than max_json_values: 413 before it is parsed
    assert probes["pad"]["status"] == 413, probes["pad"]
    _openai_error(probes["pad"], "request_too_large")
    assert "max_json_values" in probes["pad"]["error"]["message"], probes["pad"]
    # (3) held uploads past the episode's bytes in flight: refused (429 or closed); the others served once complete
    outcomes = probes["held"]["outcomes"]
    refused = [o for o in outcomes if o[0] in (429, "closed")]
    served = [o for o in outcomes if o[0] == 200]
    assert len(refused) + len(served) == UPLOADS, outcomes
    assert refused and served, outcomes
    for status, err in refused:
        if status == 429:
            assert isinstance(err, dict) and err.get("code") == "episode_inflight_limit", outcomes

    # the episode ends as the agent's outcome, and what it recorded stays small
    assert bad.status == "ok" and not bad.is_infra_failure, (bad.status, bad.error, bad.logs)
    assert Path(bad.calls_path).stat().st_size < RECORDS_BOUND, Path(bad.calls_path).stat().st_size
    assert bad.num_calls == 2 + len(served), (bad.num_calls, outcomes)
    # the proxy goes on serving its other episodes
    assert good.status == "ok" and good.num_calls == 2, (good.status, good.error, good.logs)
    assert "HONEST_STEP" in _tool_results(good.calls_path)
