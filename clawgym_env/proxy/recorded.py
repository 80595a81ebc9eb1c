"""The request body a call record keeps: as received, except that fields the dialect does not read are
kept only up to a byte budget.

A dialect validates a body with its pydantic models (:mod:`~clawgym_env.proxy.dialects.request_base`), which ignore
fields they do not declare; without a bound, a harness (or a model steering it) could make every record
carry megabytes nobody reads. :func:`recorded_body` walks the body alongside the validated model.

Invariants:
  * Every field a model declares is kept exactly as sent, at any depth, and so is every part the pipeline
    passes on whole (:class:`~clawgym_env.proxy.dialects.openai_chat.request.PassedOn`, free-form ``dict`` fields
    such as tool schemas) and the discriminators that pick a union's branch (``type``, ``role``, when a string of at
    most 256 characters): the record still parses to the same request.
  * The other fields ("unknown") are kept, in body order, while their total size stays within ``budget``
    bytes (sizes as :func:`approx_json_bytes` counts them); from the first one that does not fit on, each is
    left out (so what is kept is a prefix, the same in every call that sends the same fields), and the
    body gets one field :data:`ELIDED_KEY` saying how many were left out. Unknown fields thus add at most
    ``budget`` bytes, plus that one marker, to a record.
  * The input is never modified; the result shares unmodified parts with it. Sizes are counted
    iteratively, and the walk goes only as deep as the request models do.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from clawgym_env.jsontypes import JSONObject

DISCRIMINATORS = frozenset({"type", "role"})
"""Keys read by the request models' discriminators (never declared as fields, always kept)."""
ELIDED_KEY = "clawgym_elided"
"""The field a recorded body gets when unknown fields were left out of it."""
ELIDED = ("{count} field(s) this dialect does not read were left out of the record: past the {budget} bytes such "
          "fields may take in one (max_unknown_bytes)")


def approx_json_bytes(value: Any, stop_above: int | None = None) -> int:
    """About the bytes ``value`` takes as JSON (strings: their length + 2; numbers 8; separators counted).
    Iterative; with ``stop_above`` it stops counting once the total passes that number."""
    total, stack = 0, [value]
    while stack:
        obj = stack.pop()
        if isinstance(obj, str):
            total += len(obj) + 3
        elif isinstance(obj, dict):
            total += 2
            for k, v in obj.items():
                total += (len(k) if isinstance(k, str) else 8) + 4
                stack.append(v)
        elif isinstance(obj, (list, tuple)):
            total += 2
            stack.extend(obj)
        else:
            total += 8
        if stop_above is not None and total > stop_above:
            return total
    return total


class _Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.dropped = 0

    def keep(self, value: Any) -> bool:
        """Whether ``value`` fits what is left of the budget (then it is counted in)."""
        left = self.limit - self.used
        if not self.dropped:
            size = approx_json_bytes(value, stop_above=left)
            if size <= left:
                self.used += size
                return True
        self.dropped += 1  # every unknown field after one left out is left out too: the kept ones are a prefix
        return False


def recorded_body(body: Any, model: BaseModel | None, budget: int) -> Any:
    """``body`` with its unknown fields bounded to ``budget`` bytes (see the module invariants); ``model``
    is the request model the dialect validated ``body`` as (None: ``body`` is returned as is)."""
    if model is None:
        return body
    counter = _Budget(budget)
    out = _walk(model, body, counter)
    if counter.dropped and isinstance(out, dict):
        out[ELIDED_KEY] = ELIDED.format(count=counter.dropped, budget=budget)
    return out


def _walk(model: Any, raw: Any, budget: _Budget) -> Any:
    if isinstance(model, BaseModel):
        if getattr(model, "sent", None) is raw or not isinstance(raw, dict):
            return raw  # passed on whole to the template, or validated from another shape
        known = type(model).model_fields
        out: JSONObject = {}
        for key, value in raw.items():
            if key in known:
                out[key] = _walk(getattr(model, key), value, budget)
            elif key in DISCRIMINATORS and (value is None or isinstance(value, str) and len(value) <= 256):
                out[key] = value
            elif budget.keep([key, value]):
                out[key] = value
        return out
    if isinstance(model, list) and isinstance(raw, list) and len(model) == len(raw):
        if not any(isinstance(m, (BaseModel, list)) for m in model):
            return raw
        return [_walk(m, r, budget) for m, r in zip(model, raw)]
    return raw
