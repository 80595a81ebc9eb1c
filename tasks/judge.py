"""The shared LLM judge: one OpenAI-compatible chat endpoint, asked for verdicts as JSON.

Any server that speaks Chat Completions works (a hosted model, a local vLLM, or this project's own
policy served through the proxy): configure it with a base URL and a model name, in code or through
the environment (:meth:`JudgeClient.from_env` reads ``CLAWGYM_JUDGE_BASE_URL``,
``CLAWGYM_JUDGE_MODEL`` and ``CLAWGYM_JUDGE_API_KEY``).

Invariants:
  * every request goes through the official ``openai`` SDK (``chat.completions.create``) at the
    client's temperature (0.0 unless told otherwise), never streaming;
  * connection errors, timeouts and 5xx answers are retried with exponential backoff, at most
    ``max_retries`` times; any 4xx (bad key, unknown model, bad request) fails at once — retrying
    cannot fix it; the SDK's own retry loop is switched off so this is the only one;
  * every failure is a :class:`TaskError` that names the endpoint and model; an answer that is
    empty or holds no JSON object is its subclass :class:`JudgeAnswerError`, carrying the raw text;
  * :meth:`JudgeClient.judge_json` returns a ``dict``: a JSON object found in the answer, tolerating
    code fences, prose around it, and a ``<think>…</think>`` preamble.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from clawgym_env.errors import TaskError
from clawgym_env.jsontypes import JSONObject

ENV_BASE_URL = "CLAWGYM_JUDGE_BASE_URL"
ENV_MODEL = "CLAWGYM_JUDGE_MODEL"
ENV_API_KEY = "CLAWGYM_JUDGE_API_KEY"

JSON_INSTRUCTION = ("Answer with one JSON object only, no prose before or after it, "
                    "no code fences.")


class JudgeAnswerError(TaskError):
    """The judge answered, but not with what was asked (no JSON object, or empty); ``raw`` is the
    text it gave. Graders may count this against one item; transport failures stay TaskError."""

    def __init__(self, message: str, raw: str = "") -> None:
        super().__init__(message)
        self.raw = raw


class JudgeClient:
    """A temperature-0 chat client for grading; thread-safe (one SDK client, no mutable state)."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 temperature: float = 0.0, timeout: float = 120.0, *,
                 max_retries: int = 3, backoff_s: float = 1.0, max_tokens: int | None = None) -> None:
        if not base_url or not model:
            raise TaskError("JudgeClient needs a base_url and a model name "
                            f"(or set {ENV_BASE_URL} and {ENV_MODEL} and use JudgeClient.from_env())")
        import openai

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.temperature = float(temperature)
        self.timeout = float(timeout)
        self.max_retries = max(0, int(max_retries))
        self.backoff_s = max(0.0, float(backoff_s))
        self.max_tokens = max_tokens
        # Local endpoints accept any key; the SDK refuses to build without one.
        self._client = openai.OpenAI(base_url=self.base_url, api_key=api_key or "not-needed",
                                     timeout=self.timeout, max_retries=0)

    @classmethod
    def from_env(cls) -> JudgeClient:
        """Build from ``CLAWGYM_JUDGE_BASE_URL``/``_MODEL`` (required) and ``_API_KEY`` (optional)."""
        base_url = os.environ.get(ENV_BASE_URL, "").strip()
        model = os.environ.get(ENV_MODEL, "").strip()
        missing = [n for n, v in ((ENV_BASE_URL, base_url), (ENV_MODEL, model)) if not v]
        if missing:
            raise TaskError(
                f"the LLM judge is not configured: set {' and '.join(missing)} "
                f"(an OpenAI-compatible base URL such as http://host:8000/v1 and a model name; "
                f"{ENV_API_KEY} is optional)")
        return cls(base_url, model, api_key=os.environ.get(ENV_API_KEY) or None)

    def __repr__(self) -> str:
        return f"JudgeClient(base_url={self.base_url!r}, model={self.model!r}, temperature={self.temperature})"

    # -- requests -----------------------------------------------------------------------------

    def complete(self, messages: list[dict]) -> str:
        """The assistant text for ``messages`` (retrying transient failures, see module doc)."""
        import openai

        kwargs: JSONObject = {"model": self.model, "messages": messages,
                                  "temperature": self.temperature}
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        where = f"judge {self.model!r} at {self.base_url}"
        attempt = 0
        while True:
            try:
                resp = self._client.chat.completions.create(**kwargs)
                break
            except openai.APIStatusError as e:
                if e.status_code < 500 or attempt >= self.max_retries:
                    raise TaskError(f"{where} answered HTTP {e.status_code}: {_short(e.message)}"
                                    + ("" if e.status_code < 500 else f" (after {attempt + 1} tries)")) from e
            except (openai.APIConnectionError, openai.APITimeoutError) as e:
                if attempt >= self.max_retries:
                    raise TaskError(f"{where} unreachable after {attempt + 1} tries: {e}; "
                                    f"check the URL and that the server is up") from e
            except openai.OpenAIError as e:  # malformed answer bodies and the like
                raise TaskError(f"{where} failed: {e}") from e
            time.sleep(self.backoff_s * (2 ** attempt))
            attempt += 1
        if not resp.choices:
            raise TaskError(f"{where} returned no choices")
        msg = resp.choices[0].message
        text = msg.content if msg is not None else None
        if not isinstance(text, str) or not text.strip():
            raise JudgeAnswerError(f"{where} returned an empty answer (finish_reason="
                                   f"{getattr(resp.choices[0], 'finish_reason', None)!r})", "")
        return text

    def judge_json(self, system: str, user: str) -> JSONObject:
        """Ask for one JSON object and parse it leniently; TaskError (with the raw text) if none."""
        system = f"{system.rstrip()}\n\n{JSON_INSTRUCTION}" if JSON_INSTRUCTION not in system else system
        text = self.complete([{"role": "system", "content": system},
                              {"role": "user", "content": user}])
        try:
            return parse_json_object(text)
        except ValueError as e:
            raise JudgeAnswerError(f"judge {self.model!r} at {self.base_url} did not answer with a JSON "
                                   f"object ({e}); raw answer: {_short(text, 2000)!r}", text) from None


# -- lenient parsing ----------------------------------------------------------------------------

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)


def parse_json_object(text: str) -> dict:
    """The JSON object in ``text``: whole text, then fenced blocks, then the first balanced ``{…}``
    that parses. Raises ValueError saying why when there is none (arrays and scalars do not count).
    """
    if not isinstance(text, str):
        raise ValueError(f"expected text, got {type(text).__name__}")
    body = _THINK.sub("", text).strip()
    if "<think>" in body.lower() and "</think>" not in body.lower():
        body = body[body.lower().index("<think>") + 7:]  # unterminated reasoning: search inside it
    candidates = [body] + [m.group(1).strip() for m in _FENCE.finditer(body)]
    for cand in candidates:
        obj = _loads_object(cand)
        if obj is not None:
            return obj
    for cand in candidates:
        obj = _scan_objects(cand)
        if obj is not None:
            return obj
    if "{" not in body:
        raise ValueError("no '{' in the answer")
    raise ValueError("found '{' but no complete, valid JSON object")


def _loads_object(s: str) -> dict | None:
    try:
        v = json.loads(s)
    except (json.JSONDecodeError, ValueError):
        return None
    return v if isinstance(v, dict) else None


def _scan_objects(s: str) -> dict | None:
    """First ``{`` from which a JSON object decodes (raw_decode ignores trailing text)."""
    dec = json.JSONDecoder()
    for m in re.finditer(r"\{", s):
        try:
            v, _ = dec.raw_decode(s, m.start())
        except (json.JSONDecodeError, ValueError):
            v = _loads_object(_relaxed(s[m.start():]))
        if isinstance(v, dict):
            return v
    return None


def _relaxed(s: str) -> str:
    """Up to the matching close brace, with trailing commas dropped (a common model slip)."""
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(s):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return re.sub(r",\s*([}\]])", r"\1", s[:i + 1])
    return s


def _short(text: Any, limit: int = 300) -> str:
    s = str(text)
    return s if len(s) <= limit else s[:limit] + f"… [{len(s) - limit} more chars]"
