"""A policy that forwards each call to an upstream OpenAI- or Anthropic-compatible API.

It lets a user evaluate an API model through any harness: the harness talks to the serving proxy
as usual, the proxy asks this policy, and this policy asks the upstream model with the request's
messages and tools (``GenerationContext.messages``/``tools``, OpenAI chat shape) through the
official SDK (``openai`` or ``anthropic``). The upstream's answer (text, tool calls, reasoning
when the API returns it) is written as the Qwen3 assistant text
(:func:`~clawgym_env.policy.chat_format.assistant_text`) and encoded with the Qwen3 tokenizer, so
the proxy's pipeline (parsing, dialect rendering, capture) runs unchanged.

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
  * streaming (:meth:`PassthroughPolicy.generate_stream`, used by the proxy for a streaming request):
    the upstream is asked with ``stream=True`` through the SDK's async client (one per event loop) and
    its content/reasoning text is yielded as it arrives; the final :class:`Generation` is built from the
    same answer fields the non-streaming call reads (content, reasoning, tool calls, finish), so a
    streamed call is captured exactly as a non-streamed one of the same reply; a stream cut midway is a
    :class:`PolicyError` remembered like any other upstream failure;
  * sampling: OpenAI gets max_tokens (as ``max_completion_tokens``), temperature, top_p, stop (first
    4) and seed; Anthropic gets max_tokens and stop sequences only (its Messages API, as of the
    pinned SDK, takes no temperature or top_p).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

from clawgym_env.errors import PolicyError
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams, TextDelta
from clawgym_env.policy.chat_format import assistant_text
from clawgym_env.redact import redact, register_secret

PROVIDERS = ("openai", "anthropic")


def _args(arguments: Any) -> dict[str, Any] | str:
    """Tool-call arguments as an object when they are valid JSON (canonical rendering), else as given."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return str(arguments)
    return value if isinstance(value, dict) else str(arguments)


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalised chat messages → the Chat Completions request shape (only the fields it accepts)."""
    out = []
    for m in messages:
        role = m.get("role")
        msg: dict[str, Any] = {"role": role, "content": m.get("content") or ""}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [{"id": tc.get("id") or f"call_{i}", "type": "function",
                                  "function": {"name": tc["function"]["name"],
                                               "arguments": tc["function"].get("arguments") or "{}"}}
                                 for i, tc in enumerate(m["tool_calls"])]
            if not msg["content"]:
                msg["content"] = None
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id") or ""
        out.append(msg)
    return out


def anthropic_request(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> tuple[str, list, list]:
    """Normalised chat messages and function tools → (system, messages, tools) for the Messages API.

    System messages join into ``system``; tool results become ``tool_result`` blocks of a user turn;
    consecutive turns of one role merge (the API wants them alternating).
    """
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": list(blocks)})

    for m in messages:
        role, text = m.get("role"), m.get("content") or ""
        if role == "system":
            system.append(text)
        elif role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text.strip() else []
            for i, tc in enumerate(m.get("tool_calls") or []):
                args = _args(tc["function"].get("arguments"))
                blocks.append({"type": "tool_use", "id": tc.get("id") or f"toolu_{len(out)}_{i}",
                               "name": tc["function"]["name"], "input": args if isinstance(args, dict) else {}})
            add("assistant", blocks)
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m.get("tool_call_id") or "", "content": text}])
        elif text:
            add("user", [{"type": "text", "text": text}])
    specs = []
    for t in tools:
        fn = t.get("function", t)
        specs.append({"name": fn["name"], "description": fn.get("description") or "",
                      "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}})
    return "\n\n".join(s for s in system if s), out, specs


class PassthroughPolicy(PolicyBackend):
    """Forward to an upstream API. ``provider``: ``openai`` or ``anthropic``; ``model``: its model name.

    ``base_url``/``api_key`` default to the SDK's own environment variables (``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY``; ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``); see
    :func:`clawgym_env.policy.make_policy` for the ``CLAWGYM_UPSTREAM_*`` overrides.
    """

    def __init__(self, provider: str, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 tokenizer=None, timeout: float = 300.0, max_retries: int = 2, client: Any = None,
                 async_client: Any = None) -> None:
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
        self._async_given = async_client
        self._async: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = {}  # id(loop) -> (loop, async client)
        self._build_async = client is None  # an injected sync client comes without the means to stream
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
    def tokenizer(self):
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
        try:
            if self.provider == "openai":
                answer = _openai_answer(self._client.chat.completions.create(**self._openai_kwargs(ctx, params)),
                                        self.model)
            else:
                answer = _anthropic_answer(self._client.messages.create(**self._anthropic_kwargs(ctx, params)))
        except Exception as exc:  # noqa: BLE001 - SDK errors (HTTP, connection, timeout) are policy failures
            raise self._failed(ctx.episode_id, exc) from exc
        return self._generation(answer)

    async def generate_stream(self, prompt_ids: list[int], params: SamplingParams,
                              ctx: GenerationContext) -> AsyncIterator[TextDelta | Generation]:
        """:meth:`generate`, streamed from the upstream with its async SDK client: text deltas as they arrive,
        then the same :class:`Generation` the non-streaming call gives for the same answer."""
        answer = _Answer()
        try:
            client = self._async_client()
            if self.provider == "openai":
                deltas = _openai_stream(client, self._openai_kwargs(ctx, params), self.model, answer)
            else:
                deltas = _anthropic_stream(client, self._anthropic_kwargs(ctx, params), answer)
            async for delta in deltas:
                yield delta
        except Exception as exc:  # noqa: BLE001 - SDK errors (HTTP, connection, timeout, a cut stream)
            raise self._failed(ctx.episode_id, exc) from exc
        yield await asyncio.to_thread(self._generation, answer)

    def _failed(self, episode_id: str, exc: Exception) -> PolicyError:
        """The :class:`PolicyError` for an upstream failure, remembered for the episode."""
        if isinstance(exc, PolicyError):
            msg = str(exc)
        else:
            msg = redact(f"upstream {self.provider} model {self.model!r} failed: {type(exc).__name__}: {exc}")
        self._remember(episode_id, msg)
        return exc if isinstance(exc, PolicyError) else PolicyError(msg)

    def _generation(self, answer: _Answer) -> Generation:
        text = assistant_text(answer.content, reasoning=answer.reasoning, tool_calls=answer.calls)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=answer.finish, token_exact=False)

    def _async_client(self) -> Any:
        """The async SDK client for the running event loop (one per loop: an async client is bound to its loop)."""
        if self._async_given is not None:
            return self._async_given
        loop = asyncio.get_running_loop()
        with self._lock:
            for key in [k for k, (other, _) in self._async.items() if other.is_closed()]:
                del self._async[key]
            entry = self._async.get(id(loop))
            if entry is None or entry[0] is not loop:
                entry = (loop, self._make_client(asynchronous=True))
                self._async[id(loop)] = entry
            return entry[1]

    def _make_client(self, *, asynchronous: bool) -> Any:
        opts: dict[str, Any] = {"base_url": self.base_url, "api_key": self._api_key, "timeout": self._timeout,
                "max_retries": self._max_retries}
        if self.provider == "openai":
            import openai

            return openai.AsyncOpenAI(**opts) if asynchronous else openai.OpenAI(**opts)
        import anthropic

        return anthropic.AsyncAnthropic(**opts) if asynchronous else anthropic.Anthropic(**opts)

    def _remember(self, episode_id: str, message: str) -> None:
        with self._lock:
            self._failures.setdefault(episode_id, []).append(redact(message)[:500])

    def _openai_kwargs(self, ctx: GenerationContext, params: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model, "messages": openai_messages(ctx.messages),
                                  "max_completion_tokens": params.max_tokens, "temperature": params.temperature,
                                  "top_p": params.top_p}
        if ctx.tools:
            kwargs["tools"] = [{"type": "function", "function": t.get("function", t)} for t in ctx.tools]
        if params.stop:
            kwargs["stop"] = params.stop[:4]
        if params.seed is not None:
            kwargs["seed"] = params.seed
        return kwargs

    def _anthropic_kwargs(self, ctx: GenerationContext, params: SamplingParams) -> dict[str, Any]:
        system, messages, tools = anthropic_request(ctx.messages, ctx.tools)
        if not messages:
            raise PolicyError("nothing to send upstream: the conversation has no user or assistant turn")
        # The Messages API of the pinned SDK takes no temperature/top_p: they are not forwarded.
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": params.max_tokens}
        if system:
            kwargs["system"] = system
        if tools:
            kwargs["tools"] = tools
        stops = [s for s in params.stop if s.strip()]
        if stops:
            kwargs["stop_sequences"] = stops
        return kwargs


@dataclasses.dataclass
class _Answer:
    """The upstream's answer as the capture reads it (filled in by a stream as it ends)."""

    content: str = ""
    reasoning: str | None = None
    calls: list[tuple[str, dict[str, Any] | str]] = dataclasses.field(default_factory=list)
    finish: str = "stop"


def _reasoning(obj: Any) -> str | None:
    extra = getattr(obj, "model_extra", None) or {}
    value = extra.get("reasoning_content") or extra.get("reasoning") or None
    return value if isinstance(value, str) else None


def _openai_answer(resp: Any, model: str) -> _Answer:
    if not resp.choices:
        raise PolicyError(f"upstream {model!r} returned no choices")
    choice = resp.choices[0]
    msg = choice.message
    calls = [(tc.function.name, _args(tc.function.arguments)) for tc in (msg.tool_calls or [])
             if getattr(tc, "function", None) is not None]
    return _Answer(msg.content or "", _reasoning(msg), calls, "length" if choice.finish_reason == "length" else "stop")


async def _openai_stream(client: Any, kwargs: dict[str, Any], model: str, answer: _Answer) -> AsyncIterator[TextDelta]:
    """Chat Completions streamed: yield text as it comes, then fill ``answer`` as :func:`_openai_answer` would."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, list[str]] = {}  # index -> [name, arguments so far]
    finish, chosen = None, False
    stream = await client.chat.completions.create(**kwargs, stream=True)
    async with stream:
        async for chunk in stream:
            if not chunk.choices:
                continue
            choice, chosen = chunk.choices[0], True
            delta = choice.delta
            think = _reasoning(delta)
            if think:
                reasoning.append(think)
                yield TextDelta("reasoning", think)
            if delta.content:
                content.append(delta.content)
                yield TextDelta("content", delta.content)
            for tc in delta.tool_calls or []:
                slot = calls.setdefault(tc.index, ["", ""])
                if tc.function is not None:
                    slot[0] = slot[0] or tc.function.name or ""
                    slot[1] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    if not chosen:
        raise PolicyError(f"upstream {model!r} returned no choices")
    answer.content, answer.reasoning = "".join(content), ("".join(reasoning) if reasoning else None)
    answer.calls = [(name, _args(args)) for _, (name, args) in sorted(calls.items()) if name]
    answer.finish = "length" if finish == "length" else "stop"


def _anthropic_answer(resp: Any) -> _Answer:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[tuple[str, dict[str, Any] | str]] = []
    for block in resp.content:
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(block.text)
        elif kind == "thinking":
            thinking.append(getattr(block, "thinking", ""))
        elif kind == "tool_use":
            calls.append((block.name, dict(block.input or {})))
    finish = "length" if resp.stop_reason == "max_tokens" else "stop"
    return _Answer("".join(texts), "\n".join(thinking) if thinking else None, calls, finish)


async def _anthropic_stream(client: Any, kwargs: dict[str, Any], answer: _Answer) -> AsyncIterator[TextDelta]:
    """Messages streamed (the SDK's stream helper): yield text as it comes, then fill ``answer`` from the
    final message exactly as :func:`_anthropic_answer` reads a non-streamed one."""
    async with client.messages.stream(**kwargs) as stream:
        async for event in stream:
            if event.type == "text" and event.text:
                yield TextDelta("content", event.text)
            elif event.type == "thinking" and event.thinking:
                yield TextDelta("reasoning", event.thinking)
        final = await stream.get_final_message()
    done = _anthropic_answer(final)
    for field in dataclasses.fields(done):
        setattr(answer, field.name, getattr(done, field.name))
