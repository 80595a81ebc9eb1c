"""One JSON-over-HTTP request to a policy server, with retries: shared by the vLLM and remote backends.

Invariants: a connection failure, and an answer whose status is in ``retry_status``, is retried up to
``retries`` more times with exponential backoff; every other failure is one
:class:`~clawgym_env.errors.PolicyError` that names the service, its URL and the request; a status in
``status_hints`` raises its hint instead (e.g. what to set after a 401).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

from clawgym_env.errors import PolicyError


def error_message(resp: Any) -> str:
    """The server's own error message (an OpenAI-style ``{"error": ...}`` body), else the body's start."""
    try:
        err = resp.json().get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)[:500]
        if err:
            return str(err)[:500]
    except (ValueError, AttributeError):
        pass
    return str(resp.text)[:500]


def request_json(client: Any, method: str, path: str, *, service: str, url: str, retries: int, backoff_s: float,
                 retry_status: Collection[int], unreachable_hint: str, json: Any = None, content: bytes | None = None,
                 headers: Mapping[str, str] | None = None, status_hints: Mapping[int, str] | None = None) -> Any:
    """``client.request(method, path, ...)`` decoded as JSON (see the module invariants).

    ``client`` is an ``httpx.Client`` whose base URL is ``url``; ``service`` names it in errors ("the
    vLLM server"); ``unreachable_hint`` ends the error when no try reached it."""
    import httpx

    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * (2 ** (attempt - 1)))
        try:
            resp = client.request(method, path, json=json, content=content, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            last = f"{type(exc).__name__}: {exc}"
            continue
        except httpx.TimeoutException as exc:
            raise PolicyError(f"{service} at {url} did not answer {method} {path} in time ({type(exc).__name__}); "
                              "raise timeout_s or ask for fewer tokens") from exc
        except httpx.HTTPError as exc:
            raise PolicyError(f"{method} {url}{path} failed: {type(exc).__name__}: {exc}") from exc
        if status_hints and resp.status_code in status_hints:
            raise PolicyError(status_hints[resp.status_code])
        if resp.status_code in retry_status:
            last = f"HTTP {resp.status_code}: {error_message(resp)[:200]}"
            continue
        if resp.status_code >= 400:
            raise PolicyError(f"{service} at {url} refused {method} {path}: HTTP {resp.status_code}: "
                              f"{error_message(resp)}")
        try:
            return resp.json()
        except ValueError as exc:
            raise PolicyError(f"{service} at {url} answered {method} {path} with non-JSON: "
                              f"{resp.text[:200]}") from exc
    raise PolicyError(f"no {service.removeprefix('the ')} answers at {url} ({method} {path}, {retries + 1} tries; "
                      f"last: {last}); {unreachable_hint}")
