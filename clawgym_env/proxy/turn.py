"""The dialect-neutral call pipeline: render → generate → cut → parse → record.

:func:`run_turn` is the whole pipeline, blocking (a worker thread runs it). It is two halves around the
policy call, so a streamed call (:mod:`~clawgym_env.proxy.stream.live`) can run the policy itself in between:
:func:`prepare_turn` (check, render and tokenise the prompt, resolve the sampling) and
:func:`finish_turn` (check the generation, cut, parse, record).

Invariants:
  * :func:`run_turn` records exactly the ids the policy was given and the (possibly cut) ids it
    sampled; the returned text is the decoding of those ids, so ``decode(output_token_ids)`` is what
    the client receives. Cutting (max_tokens, stop strings) only ever removes a suffix.
  * ``prepare_turn`` then ``finish_turn`` records what ``run_turn`` records for the same generation:
    ``run_turn`` is nothing but the two around ``policy.generate``.
  * The dialect module never touches the policy or the records: it parses a request into a
    :class:`TurnRequest` and renders a :class:`TurnResult`.
  * Where the halves run changes nothing they compute: a live call (:mod:`~clawgym_env.proxy.stream.live`) runs
    them on the event loop itself when they are short — a request body of at most ``inline_bytes`` (whose
    full render costs at most a few ms, about one GIL switch interval: what a worker thread holding the GIL
    could keep the loop waiting anyway) and an answer of at most :data:`INLINE_OUTPUT_TOKENS` — and in a
    worker thread otherwise; a whole turn (``run_turn``, a blocking ``generate``) always runs in a worker.
  * :func:`warm_up` runs before a server reports ready: the tokenizer is loaded and the chat template
    compiled, so neither is paid by a first call (nor ever on the event loop).
"""

from __future__ import annotations

import dataclasses
import time

from clawgym_env.capture.records import CallRecord
from clawgym_env.errors import PolicyError, ProxyError
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams
from clawgym_env.policy.chat_format import normalize_messages
from clawgym_env.proxy.deltas import segment, stop_cut, token_bytes, token_pieces
from clawgym_env.proxy.guards.limits import check_prompt_size
from clawgym_env.proxy.incremental import PromptCache
from clawgym_env.proxy.sessions import EpisodeSession, Limits, TurnMeta, TurnRequest, TurnResult, resolve_sampling

INLINE_BODY_BYTES = 4096
"""Default ``inline_bytes``: a body this small renders in ~1-3 ms even from scratch (400 tiny messages in 15 KB
took 12 ms on a busy 2-core machine: under 1 ms per KB)."""
INLINE_OUTPUT_TOKENS = 256
"""An answer this short is cut, parsed and recorded in well under a millisecond (~0.5 ms for 200 tokens)."""


def warm_up(policy: PolicyBackend) -> float:
    """Load ``policy.tokenizer`` and run the pipeline's tokenizer paths once on a one-message prompt (the chat
    template compiled, the splice encoder built, ids decoded to pieces); the seconds it took. Blocking."""
    t0 = time.perf_counter()
    tokenizer = policy.tokenizer
    prompt = PromptCache(max_states=1).prompt(tokenizer, normalize_messages([{"role": "user", "content": "hi"}]),
                                              None, None, [])
    token_pieces(tokenizer, list(prompt.ids[-4:]))
    return time.perf_counter() - t0


@dataclasses.dataclass
class PreparedTurn:
    """A call ready for its policy: the prompt ids, the sampling and the context to generate with."""

    prompt_ids: list[int]
    params: SamplingParams
    ctx: GenerationContext
    token_exact: bool
    exact_reason: str | None
    t0: float
    """``perf_counter`` when the turn started rendering."""
    t1: float
    """``perf_counter`` when the prompt was ready (the policy call starts)."""
    version_before: int = 0
    """the policy's ``version`` just before generating: the call's version when the generation names none
    (read after generating, a weight update landing meanwhile would mislabel the call)"""


def prepare_turn(session: EpisodeSession, policy: PolicyBackend, req: TurnRequest, limits: Limits) -> PreparedTurn:
    """Check, render and tokenise the prompt and resolve the sampling. Blocking: call it from a worker thread,
    or on the loop only when short (see the module invariants)."""
    t0 = time.perf_counter()
    tokenizer = policy.tokenizer
    check_prompt_size(req.messages, req.tools, limits.max_prompt_chars, limits.max_context)
    messages = normalize_messages(req.messages)
    try:
        # the ids splice_prompt gives, at the cost of what this call appended to an earlier one
        prompt = session.prompts.prompt(tokenizer, messages, req.tools or None, req.enable_thinking,
                                        session.snapshot())
    except Exception as exc:  # noqa: BLE001 - a template failure is a bad request, not a crash
        raise ProxyError(f"the chat template could not render these messages: {exc}", field="messages") from exc
    prompt_ids = list(prompt.ids)
    if len(prompt_ids) >= limits.max_context:
        raise ProxyError(f"the prompt is {len(prompt_ids)} tokens but the maximum context is {limits.max_context} "
                         "tokens (prompt plus completion); shorten the conversation", field="messages",
                         code="context_length_exceeded")
    params = resolve_sampling(req, session.sampling_overrides, len(prompt_ids), limits)
    ctx = GenerationContext(episode_id=session.episode_id, messages=messages, tools=list(req.tools),
                            task=session.task, harness=session.harness)
    return PreparedTurn(prompt_ids, params, ctx, prompt.token_exact, prompt.reason, t0, time.perf_counter(),
                        version_before=int(policy.version))


def run_turn(session: EpisodeSession, policy: PolicyBackend, req: TurnRequest, meta: TurnMeta,
             limits: Limits) -> TurnResult:
    """Render → generate → cut → parse → record. Blocking: call it from a worker thread. The call counts as
    in flight on the session (:meth:`EpisodeSession.call_started`) until it is recorded or failed."""
    session.call_started()
    try:
        prep = prepare_turn(session, policy, req, limits)
        try:
            gen = policy.generate(list(prep.prompt_ids), prep.params, prep.ctx)
        except PolicyError:
            raise
        except Exception as exc:  # noqa: BLE001 - any policy crash is a policy failure (502), not ours
            raise PolicyError(f"policy {policy.name!r} failed: {type(exc).__name__}: {exc}") from exc
        return finish_turn(session, policy, req, meta, prep, gen)
    finally:
        session.call_ended()


def finish_turn(session: EpisodeSession, policy: PolicyBackend, req: TurnRequest, meta: TurnMeta,
                prep: PreparedTurn, gen: Generation) -> TurnResult:
    """Check the generation, cut it (max_tokens, stop strings), parse it and record the call.
    Blocking: call it from a worker thread, or on the loop only when short (see the module invariants)."""
    t2 = time.perf_counter()
    tokenizer = policy.tokenizer
    params, token_exact, exact_reason = prep.params, prep.token_exact, prep.exact_reason
    if not getattr(gen, "token_exact", True):  # e.g. a passthrough: upstream text re-encoded, not sampled ids
        token_exact = False
        exact_reason = "passthrough: text-level" + (f"; {exact_reason}" if exact_reason else "")
    ids, logprobs, finish = _checked(gen, policy)
    if len(ids) > params.max_tokens:
        ids, logprobs, finish = ids[:params.max_tokens], logprobs[:params.max_tokens], "length"
    pieces = token_pieces(tokenizer, ids)
    keep = stop_cut(pieces, params.stop) if params.stop else None
    matched = None
    if keep is not None:
        matched = _first_stop("".join(pieces), params.stop)
        ids, logprobs, finish = ids[:keep], logprobs[:keep], "stop"
        pieces = token_pieces(tokenizer, ids)
    seg = segment("".join(pieces))
    if req.tool_id_prefix != "call_":
        for call in seg.tool_calls:
            call.id = req.tool_id_prefix + call.id.removeprefix("call_")
    parsed = seg.parsed()
    message = parsed.to_openai_message()
    if parsed.tool_calls and finish == "stop":
        finish = "tool_calls"
    t3 = time.perf_counter()
    if gen.policy_version:
        version = gen.policy_version
    else:
        version = session.policy_version if session.policy_version is not None else prep.version_before
    record = CallRecord(
        episode_id=session.episode_id, call_index=-1, dialect=meta.dialect, path=meta.path, stream=req.stream,
        request=meta.body, headers=meta.headers, prompt_token_ids=list(prep.prompt_ids), output_token_ids=ids,
        output_logprobs=logprobs, finish_reason=finish, response_message=message, sampling=params.as_dict(),
        policy_name=policy.name, policy_version=int(version), token_exact=token_exact,
        token_exact_reason=exact_reason, started_at=meta.started_at, ended_at=time.time(),
        timings={"render_s": prep.t1 - prep.t0, "generate_s": t2 - prep.t1, "parse_s": t3 - t2,
                 "total_s": max(time.time() - meta.started_at, t3 - prep.t0)})
    if not session.append(record):
        raise ProxyError("this episode was closed while the call was in flight", status=404,
                         code="episode_not_found")
    raw = token_bytes(tokenizer, ids) if req.want_logprobs else None
    return TurnResult(req, record, pieces, seg, message, finish, logprobs, raw, matched)


def _first_stop(text: str, stops: list[str]) -> str | None:
    """The stop string occurring earliest in ``text`` (the one :func:`stop_cut` cut at)."""
    hits = [(text.find(s), i) for i, s in enumerate(stops) if s and s in text]
    return stops[min(hits)[1]] if hits else None


def _checked(gen: Generation, policy: PolicyBackend) -> tuple[list[int], list[float], str]:
    try:
        ids = [int(i) for i in gen.token_ids]
        logprobs = [float(x) for x in gen.logprobs]
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy {policy.name!r} returned non-numeric tokens or logprobs: {exc}") from exc
    if len(ids) != len(logprobs):
        raise PolicyError(f"policy {policy.name!r} returned {len(ids)} tokens but {len(logprobs)} logprobs")
    if any(i < 0 for i in ids):
        raise PolicyError(f"policy {policy.name!r} returned a negative token id")
    finish = gen.finish_reason if gen.finish_reason in ("stop", "length") else "stop"
    return ids, logprobs, finish
