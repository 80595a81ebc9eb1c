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
  * sampling: OpenAI gets max_tokens (as ``max_completion_tokens``), temperature, top_p, stop (first
    4) and seed; Anthropic gets max_tokens and stop sequences only (its Messages API, as of the
    pinned SDK, takes no temperature or top_p).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from clawgym_env.errors import PolicyError
from clawgym_env.policy.base import Generation, GenerationContext, PolicyBackend, SamplingParams
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
                 tokenizer=None, timeout: float = 300.0, max_retries: int = 2, client: Any = None) -> None:
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
        register_secret(api_key)  # an upstream that echoes the key must not put it into views or records
        if client is not None:
            self._client = client
            register_secret(getattr(client, "api_key", None))
            return
        try:
            if provider == "openai":
                import openai

                self._client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout,
                                             max_retries=max_retries)
            else:
                import anthropic

                self._client = anthropic.Anthropic(base_url=base_url, api_key=api_key, timeout=timeout,
                                                   max_retries=max_retries)
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

    def generate(self, prompt_ids: list[int], params: SamplingParams, ctx: GenerationContext) -> Generation:
        """Send the call's messages to the upstream API and re-encode its answer as Qwen3 ids
        (``token_exact=False``, logprobs carrying no information)."""
        try:
            content, reasoning, calls, finish = (self._openai if self.provider == "openai" else self._anthropic)(
                ctx, params)
        except PolicyError as exc:
            self._remember(ctx.episode_id, str(exc))
            raise
        except Exception as exc:  # noqa: BLE001 - SDK errors (HTTP, connection, timeout) are policy failures
            msg = redact(f"upstream {self.provider} model {self.model!r} failed: {type(exc).__name__}: {exc}")
            self._remember(ctx.episode_id, msg)
            raise PolicyError(msg) from exc
        text = assistant_text(content, reasoning=reasoning, tool_calls=calls)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish, token_exact=False)

    def _remember(self, episode_id: str, message: str) -> None:
        with self._lock:
            self._failures.setdefault(episode_id, []).append(redact(message)[:500])

    def _openai(self, ctx: GenerationContext, params: SamplingParams):
        kwargs: dict[str, Any] = {"model": self.model, "messages": openai_messages(ctx.messages),
                                  "max_completion_tokens": params.max_tokens, "temperature": params.temperature,
                                  "top_p": params.top_p}
        if ctx.tools:
            kwargs["tools"] = [{"type": "function", "function": t.get("function", t)} for t in ctx.tools]
        if params.stop:
            kwargs["stop"] = params.stop[:4]
        if params.seed is not None:
            kwargs["seed"] = params.seed
        resp = self._client.chat.completions.create(**kwargs)
        if not resp.choices:
            raise PolicyError(f"upstream {self.model!r} returned no choices")
        choice = resp.choices[0]
        msg = choice.message
        extra = getattr(msg, "model_extra", None) or {}
        reasoning = extra.get("reasoning_content") or extra.get("reasoning") or None
        calls = [(tc.function.name, _args(tc.function.arguments)) for tc in (msg.tool_calls or [])
                 if getattr(tc, "function", None) is not None]
        finish = "length" if choice.finish_reason == "length" else "stop"
        return msg.content or "", reasoning if isinstance(reasoning, str) else None, calls, finish

    def _anthropic(self, ctx: GenerationContext, params: SamplingParams):
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
        resp = self._client.messages.create(**kwargs)
        texts, thinking, calls = [], [], []
        for block in resp.content:
            kind = getattr(block, "type", None)
            if kind == "text":
                texts.append(block.text)
            elif kind == "thinking":
                thinking.append(getattr(block, "thinking", ""))
            elif kind == "tool_use":
                calls.append((block.name, dict(block.input or {})))
        finish = "length" if resp.stop_reason == "max_tokens" else "stop"
        return "".join(texts), ("\n".join(thinking) if thinking else None), calls, finish
