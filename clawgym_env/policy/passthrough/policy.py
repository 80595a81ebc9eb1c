"""A policy that forwards each call to an upstream OpenAI- or Anthropic-compatible API.

It lets a user evaluate an API model through any harness: the harness talks to the serving proxy
as usual, the proxy asks this policy, and this policy asks the upstream model with the request's
messages and tools (``GenerationContext.messages``/``tools``, OpenAI chat shape) through the
official SDK (``openai`` or ``anthropic``). The upstream's answer (text, tool calls, reasoning
when the API returns it) is written as the Qwen3 assistant text
(:func:`~clawgym_env.policy.chat_format.assistant_text`) and encoded with the Qwen3 tokenizer, so
the proxy's pipeline (parsing, dialect rendering, capture) runs unchanged. With the ``openai`` SDK's own
clients a reply is read raw (the JSON body, the streamed events: :mod:`~clawgym_env.policy.passthrough.wire`)
rather than as the SDK's typed models: the same request, retries and errors at half the client's CPU time.

Invariants:
  * every :class:`Generation` has ``token_exact=False``: the ids are a re-tokenisation of the
    upstream's text, not what a model sampled; the proxy records each call with
    ``token_exact=False`` and a reason starting "passthrough: text-level"; logprobs are all 0.0
    and carry no information (use these records for evaluation, not for policy-gradient training);
  * ``decode(token_ids)`` is the rendered assistant text (``<|im_end|>`` included);
  * an upstream failure (after the SDK's own retries) raises :class:`PolicyError` (the proxy answers
    502) and is remembered per episode: :meth:`PassthroughPolicy.pop_failures` lets the eval runner
    report an episode the upstream ended as an infrastructure failure rather than a 0;
  * the API key (given or resolved by the SDK) is registered with :func:`clawgym_env.redact.register_secret`
    when the policy is built, and failure messages are redacted: an upstream that echoes the key in an
    error puts it neither into the agent's view (the proxy's error body) nor into any record;
  * thread safe: one SDK client (thread safe by design), failures kept under a lock;
  * every SDK client the policy built is closed: the sync one by :meth:`PassthroughPolicy.close`; an async
    one (bound to its event loop) when its loop's runner shuts down (a holder task, cancelled at shutdown,
    closes it there: the proxy's loop ends with the proxy) or by :meth:`PassthroughPolicy.close`, whichever
    comes first. Clients given to the constructor belong to the caller and are never closed here;
  * streaming (:meth:`PassthroughPolicy.generate_stream`, used by the proxy for a streaming request):
    the upstream is asked with ``stream=True`` through the SDK's async client (one per event loop) and
    its content/reasoning text is yielded as it arrives; the final :class:`Generation` is built from the
    same answer fields the non-streaming call reads (content, reasoning, tool calls, finish), so a
    streamed call is captured exactly as a non-streamed one of the same reply; a stream cut midway (an
    error, a dropped connection, or an end without the stream's terminator) is a :class:`PolicyError`
    remembered like any other upstream failure. The SDKs' own clients are read raw (OpenAI chat chunks,
    Anthropic Messages events) through :func:`~clawgym_env.policy.passthrough.bounds.bounded_lines`;
  * a streamed answer is bounded (:mod:`~clawgym_env.policy.passthrough.bounds`): its text is ended as
    ``length`` past :data:`~clawgym_env.policy.passthrough.bounds.CHARS_PER_TOKEN` per token of the call's
    ``max_tokens``; its raw bytes (SDK clients) past ``max_stream_bytes`` (default: derived from
    ``max_tokens``) and an upstream silent, keep-alives aside, for ``silence_s`` (default: ``timeout``)
    fail the call with a :class:`PolicyError` that says which;
  * sampling: OpenAI gets max_tokens (as ``max_completion_tokens``), temperature, top_p, stop (first
    4) and seed; Anthropic gets max_tokens and stop sequences only (its Messages API, as of the
    pinned SDK, takes no temperature or top_p).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypedDict

from clawgym_env.errors import PolicyError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams, TextDelta
from clawgym_env.policy.chat_format import assistant_text
from clawgym_env.policy.passthrough.bounds import SilenceWatch, StreamBounds, bounded_lines
from clawgym_env.policy.passthrough.wire import (  # noqa: F401 - openai_messages, anthropic_request re-exported
    Answer,
    anthropic_answer,
    anthropic_json_answer,
    anthropic_raw_stream,
    anthropic_request,
    anthropic_stream,
    clip_answer,
    openai_answer,
    openai_json_answer,
    openai_messages,
    openai_raw_stream,
    openai_stream,
)
from clawgym_env.redact import redact, register_secret

if TYPE_CHECKING:
    from clawgym_env.policy.hf import Tokenizer

PROVIDERS = ("openai", "anthropic")
log = logging.getLogger("clawgym.policy")
_INLINE = 4096  # answers shorter than this (characters) are encoded on the event loop (well under a millisecond)


class _ClientOptions(TypedDict):
    """The SDK client's constructor options (the same four for both providers)."""

    base_url: str | None
    api_key: str | None
    timeout: float
    max_retries: int


class PassthroughPolicy(PolicyBackend):
    """Forward to an upstream API. ``provider``: ``openai`` or ``anthropic``; ``model``: its model name.

    ``base_url``/``api_key`` default to the SDK's own environment variables (``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY``; ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``); see
    :func:`clawgym_env.policy.make_policy` for the ``CLAWGYM_UPSTREAM_*`` overrides. A streamed answer's
    bounds: ``silence_s`` (None: ``timeout``; <= 0: none) and ``max_stream_bytes`` (None: derived from each
    call's ``max_tokens``), see the module invariants.
    """

    def __init__(self, provider: str, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 tokenizer: Tokenizer = None, timeout: float = 300.0, max_retries: int = 2, client: Any = None,
                 async_client: Any = None, silence_s: float | None = None,
                 max_stream_bytes: int | None = None) -> None:
        if provider not in PROVIDERS:
            raise PolicyError(f"unknown passthrough provider {provider!r}; use one of {list(PROVIDERS)}")
        if not model:
            raise PolicyError("a passthrough policy needs a model name: passthrough:PROVIDER:MODEL")
        self.provider, self.model = provider, model
        self.name = f"passthrough:{provider}:{model}"
        self.version = 0
        self.base_url = base_url
        self._tokenizer = tokenizer
        self._failures: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._api_key, self._timeout, self._max_retries = api_key, timeout, max_retries
        self.silence_s = float(timeout if silence_s is None else silence_s)
        if max_stream_bytes is not None and max_stream_bytes <= 0:
            raise PolicyError(f"max_stream_bytes={max_stream_bytes!r} must be positive (None: derived from max_tokens)")
        self.max_stream_bytes = max_stream_bytes
        self._async_given = async_client
        # id(loop) -> (loop, async client, the task that holds it open and closes it when the loop shuts down)
        self._async: dict[int, tuple[asyncio.AbstractEventLoop, Any, asyncio.Task]] = {}
        self._build_async = client is None  # an injected sync client comes without the means to stream
        self._owns_client = client is None
        register_secret(api_key)  # an upstream that echoes the key must not put it into views or records
        register_secret(getattr(async_client, "api_key", None))
        if client is not None:
            self._client = client
            register_secret(getattr(client, "api_key", None))
            return
        try:
            self._client = self._make_client(asynchronous=False)
        except ImportError as exc:
            raise PolicyError(f"the {provider} SDK is not installed: pip install {provider}") from exc
        except Exception as exc:  # noqa: BLE001 - the SDKs raise their own errors for a missing key
            raise PolicyError(redact(f"cannot build the {provider} client for {self.name}: {exc}")) from exc
        register_secret(getattr(self._client, "api_key", None))  # the key the SDK resolved from its env

    @property
    def tokenizer(self) -> Tokenizer:
        """The Qwen3 tokenizer, loaded on first use (prompts are decoded to text for the upstream API)."""
        if self._tokenizer is None:
            from clawgym_env.policy.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer()
        return self._tokenizer

    def pop_failures(self, episode_id: str) -> list[str]:
        """Upstream failures seen in ``episode_id`` since the last call (and forget them)."""
        with self._lock:
            return self._failures.pop(episode_id, [])

    @property
    def streams_text(self) -> bool:  # type: ignore[override]  # a property over the base's class attribute
        """True when streaming requests can be served streamed (an async client exists or can be built)."""
        return self._async_given is not None or self._build_async

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """Send the call's messages to the upstream API and re-encode its answer as Qwen3 ids
        (``token_exact=False``, logprobs carrying no information)."""
        bounds = StreamBounds.for_call(params.max_tokens, self.silence_s, self.max_stream_bytes)
        what = f"upstream {self.provider} model {self.model!r}"
        try:
            if self.provider != "openai":
                kwargs = self._anthropic_kwargs(ctx, params)
                if _anthropic_raw_capable(self._client):
                    with self._client.messages.with_streaming_response.create(**kwargs) as resp:
                        answer = anthropic_json_answer(json.loads(_read_capped(resp, bounds.max_bytes, what)),
                                                       self.model)
                else:
                    answer = anthropic_answer(self._client.messages.create(**kwargs))
            elif _raw_capable(self._client):
                with self._client.chat.completions.with_streaming_response.create(
                        **self._openai_kwargs(ctx, params)) as resp:
                    answer = openai_json_answer(json.loads(_read_capped(resp, bounds.max_bytes, what)), self.model)
            else:
                answer = openai_answer(self._client.chat.completions.create(**self._openai_kwargs(ctx, params)),
                                       self.model)
        except Exception as exc:  # noqa: BLE001 - SDK errors (HTTP, connection, timeout) are policy failures
            raise self._failed(ctx.episode_id, exc) from exc
        return self._generation(clip_answer(answer, bounds.max_chars))

    async def generate_stream(self, prompt_ids: list[int], params: SamplingParams,
                              ctx: GenerationContext) -> AsyncIterator[TextDelta | Generation]:
        """:meth:`generate`, streamed from the upstream with its async SDK client: text deltas as they arrive,
        then the same :class:`Generation` the non-streaming call gives for the same answer."""
        answer = Answer()
        bounds = StreamBounds.for_call(params.max_tokens, self.silence_s, self.max_stream_bytes)
        what = f"upstream {self.provider} model {self.model!r}"
        try:
            client = self._async_client()
            async with SilenceWatch(bounds.silence_s, what) as watch:
                if self.provider != "openai":
                    kwargs = self._anthropic_kwargs(ctx, params)
                    if _anthropic_raw_capable(client):
                        deltas = _raw_anthropic(client, kwargs, self.model, answer, bounds, watch, what)
                    else:
                        deltas = anthropic_stream(client, kwargs, answer, bounds, watch)
                elif _raw_capable(client):
                    deltas = _raw_stream(client, self._openai_kwargs(ctx, params), self.model, answer, bounds, watch,
                                         what)
                else:
                    deltas = openai_stream(client, self._openai_kwargs(ctx, params), self.model, answer, bounds, watch)
                async for delta in deltas:  # the consumer awaits nothing between items (the watch's task)
                    yield delta
        except Exception as exc:  # noqa: BLE001 - SDK errors (HTTP, connection, timeout, a cut stream)
            raise self._failed(ctx.episode_id, exc) from exc
        answer = clip_answer(answer, bounds.max_chars)  # the last chunk read may have passed the bound

        if len(answer.content) + len(answer.reasoning or "") + sum(len(str(a)) for _, a in answer.calls) < _INLINE:
            yield self._generation(answer)  # a short answer encodes faster than a hop to a worker thread
        else:
            yield await asyncio.to_thread(self._generation, answer)

    def _failed(self, episode_id: str, exc: Exception) -> PolicyError:
        """The :class:`PolicyError` for an upstream failure, remembered for the episode."""
        if isinstance(exc, PolicyError):
            msg = str(exc)
        else:
            msg = redact(f"upstream {self.provider} model {self.model!r} failed: {type(exc).__name__}: {exc}")
        self._remember(episode_id, msg)
        return exc if isinstance(exc, PolicyError) else PolicyError(msg)

    def _generation(self, answer: Answer) -> Generation:
        text = assistant_text(answer.content, reasoning=answer.reasoning, tool_calls=answer.calls)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=answer.finish, token_exact=False)

    def _async_client(self) -> Any:
        """The async SDK client for the running event loop (one per loop: an async client is bound to its loop),
        built on first use together with the task that closes it when the loop shuts down."""
        if self._async_given is not None:
            return self._async_given
        loop = asyncio.get_running_loop()
        with self._lock:
            for key in [k for k, (other, _, _) in self._async.items() if other.is_closed()]:
                del self._async[key]
            entry = self._async.get(id(loop))
            if entry is None or entry[0] is not loop:
                client = self._make_client(asynchronous=True)
                holder = loop.create_task(self._hold(id(loop), client), name=f"{self.name} client holder")
                entry = (loop, client, holder)
                self._async[id(loop)] = entry
            return entry[1]

    async def _hold(self, key: int, client: Any) -> None:
        """Keep ``client`` open until cancelled (by the loop's runner as it shuts down, or by :meth:`close`),
        then close it on its own loop."""
        try:
            await asyncio.get_running_loop().create_future()  # never set
        finally:
            with self._lock:
                entry = self._async.get(key)
                if entry is not None and entry[1] is client:
                    del self._async[key]
            try:
                await client.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort; the loop is going away
                log.debug("closing the async %s client failed: %s", self.provider, exc)

    def open_clients(self) -> list[Any]:
        """The SDK clients this policy built and has not closed yet: the sync one, one async one per event
        loop that streamed and still runs."""
        with self._lock:
            clients = [client for loop, client, _ in self._async.values() if not loop.is_closed()]
        if self._owns_client:
            clients.insert(0, self._client)
        return [c for c in clients if not c.is_closed()]

    def close(self) -> None:
        """Close the SDK clients this policy built (idempotent); the policy answers no call afterwards.

        An async client is closed on its own loop: scheduled there (and awaited up to 5 s) from another
        thread, or left to its holder task when called on that loop."""
        with self._lock:
            entries, self._async = list(self._async.values()), {}
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for loop, _, holder in entries:
            if loop is here:
                holder.cancel()
            elif loop.is_running():
                with contextlib.suppress(RuntimeError, TimeoutError):  # the loop stopped meanwhile
                    asyncio.run_coroutine_threadsafe(_cancel(holder), loop).result(timeout=5)
        if self._owns_client:
            self._client.close()

    def _make_client(self, *, asynchronous: bool) -> Any:
        opts: _ClientOptions = {"base_url": self.base_url, "api_key": self._api_key, "timeout": self._timeout,
                                "max_retries": self._max_retries}
        if self.provider == "openai":
            import openai

            return openai.AsyncOpenAI(**opts) if asynchronous else openai.OpenAI(**opts)
        import anthropic

        return anthropic.AsyncAnthropic(**opts) if asynchronous else anthropic.Anthropic(**opts)

    def _remember(self, episode_id: str, message: str) -> None:
        with self._lock:
            self._failures.setdefault(episode_id, []).append(redact(message)[:500])

    def _openai_kwargs(self, ctx: GenerationContext, params: SamplingParams) -> JSONObject:
        kwargs: JSONObject = {"model": self.model, "messages": openai_messages(ctx.messages),
                                  "max_completion_tokens": params.max_tokens, "temperature": params.temperature,
                                  "top_p": params.top_p}
        if ctx.tools:
            kwargs["tools"] = [{"type": "function", "function": t.get("function", t)} for t in ctx.tools]
        if params.stop:
            kwargs["stop"] = params.stop[:4]
        if params.seed is not None:
            kwargs["seed"] = params.seed
        return kwargs

    def _anthropic_kwargs(self, ctx: GenerationContext, params: SamplingParams) -> JSONObject:
        system, messages, tools = anthropic_request(ctx.messages, ctx.tools)
        if not messages:
            raise PolicyError("nothing to send upstream: the conversation has no user or assistant turn")
        # The Messages API of the pinned SDK takes no temperature/top_p: they are not forwarded.
        kwargs: JSONObject = {"model": self.model, "messages": messages, "max_tokens": params.max_tokens}
        if system:
            kwargs["system"] = system
        if tools:
            kwargs["tools"] = tools
        stops = [s for s in params.stop if s.strip()]
        if stops:
            kwargs["stop_sequences"] = stops
        return kwargs


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _raw_capable(client: Any) -> bool:
    """Whether ``client`` is the ``openai`` SDK's own (sync or async) client: then a reply is read raw (the
    same request, retries, auth and error types, without a typed model per reply or stream chunk; about
    half the client's CPU time per call)."""
    import openai

    return isinstance(client, openai.OpenAI | openai.AsyncOpenAI)


def _anthropic_raw_capable(client: Any) -> bool:
    """Whether ``client`` is the ``anthropic`` SDK's own (sync or async) client: then a reply is read raw,
    bounded in bytes."""
    import anthropic

    return isinstance(client, anthropic.Anthropic | anthropic.AsyncAnthropic)


def _read_capped(resp: Any, max_bytes: int, what: str) -> bytes:
    """The body of a (sync, not yet read) SDK response, reading at most ``max_bytes``."""
    body = bytearray()
    for chunk in resp.iter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise PolicyError(f"{what} sent more than {max_bytes} bytes in one answer (the bound derived from the "
                              "call's max_tokens, or the passthrough's max_stream_bytes); the upstream is misbehaving")
    return bytes(body)


async def _raw_stream(client: Any, kwargs: JSONObject, model: str, answer: Answer, bounds: StreamBounds,
                      watch: SilenceWatch, what: str) -> AsyncIterator[TextDelta]:
    """A streamed Chat Completions call through the async SDK client, its server-sent events read raw."""
    async with client.chat.completions.with_streaming_response.create(**kwargs, stream=True) as resp:
        lines = bounded_lines(resp.iter_bytes(), bounds.max_bytes, what)
        async for delta in openai_raw_stream(lines, model, answer, bounds, watch):
            yield delta


async def _raw_anthropic(client: Any, kwargs: JSONObject, model: str, answer: Answer, bounds: StreamBounds,
                         watch: SilenceWatch, what: str) -> AsyncIterator[TextDelta]:
    """A streamed Messages call through the async SDK client, its server-sent events read raw."""
    async with client.messages.with_streaming_response.create(**kwargs, stream=True) as resp:
        lines = bounded_lines(resp.iter_bytes(), bounds.max_bytes, what)
        async for delta in anthropic_raw_stream(lines, model, answer, bounds, watch):
            yield delta

