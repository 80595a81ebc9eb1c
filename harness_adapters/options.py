"""A harness adapter's own options from the command line and config files, checked against its constructor.

Every registered harness adapter declares its options as constructor keywords (OpenClaw's ``api``, mini's
``stream``, an npm harness's ``cache_dir``, ...). ``--harness-opt KEY=VALUE`` (repeatable) and a config file's
``harness_options:`` mapping hand them over, and ``--harness-cache-dir PATH`` / ``harness_cache_dir:`` sets the
``cache_dir`` option: the folder the adapter finds (and installs) its pinned harness in, the same folder as
``clawgym harness install --cache-dir`` (it holds one ``<package>-<version>/`` prefix per harness); without it an
adapter uses ``$CLAWGYM_CACHE/harnesses`` (default ``~/.cache/clawgym/harnesses``).

Invariants:
  * a VALUE is read as JSON when it parses as JSON (``true``, ``3``, ``2.5``, ``null``, ``[..]``, ``{..}``,
    ``"text"``), else kept as the string it is;
  * :func:`build_harness` never lets a ``TypeError`` of a constructor through: a key the constructor does not take
    is a :class:`~clawgym_env.errors.ConfigError` naming the harness and every option it accepts, and a value the
    constructor refuses (``TypeError``/``ValueError``) is one naming the options given; a harness's own
    :class:`~clawgym_env.errors.ClawGymError` (e.g. an unknown OpenClaw ``api``) passes unchanged;
  * an adapter whose constructor takes ``**kwargs`` is trusted with any key.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
from collections.abc import Iterable, Mapping

from clawgym_env.errors import ClawGymError, ConfigError
from clawgym_env.harness import HarnessAdapter
from clawgym_env.jsontypes import JSONObject, JSONValue
from clawgym_env.plugins import harnesses, make_harness

__all__ = ["CACHE_OPTION", "accepted_options", "add_harness_arguments", "build_harness", "config_overrides",
           "harness_from_args", "parse_harness_opts", "parse_value", "takes_cache_dir"]

CACHE_OPTION = "cache_dir"
"""The constructor keyword that ``--harness-cache-dir`` sets (the npm harnesses' own, :mod:`harness_adapters.npm`)."""


def parse_value(raw: str) -> JSONValue:
    """``raw`` as JSON when it parses (``true`` → True, ``3`` → 3, ``[1]`` → [1]), else the string itself."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_harness_opts(pairs: Iterable[str], *, flag: str = "--harness-opt") -> JSONObject:
    """``["KEY=VALUE", ...]`` → ``{KEY: parsed VALUE}`` (later pairs win); a pair without ``=`` or with an empty or
    non-identifier KEY is a :class:`ConfigError` naming ``flag`` and the form it takes."""
    out: JSONObject = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(f"{flag} {pair!r}: use KEY=VALUE with KEY an adapter option name "
                              "(e.g. --harness-opt stream=true; the VALUE is read as JSON when it parses)")
        out[key] = parse_value(raw)
    return out


def accepted_options(name: str) -> list[str] | None:
    """The keyword options the adapter registered as ``name`` accepts (its constructor's parameters), or None when
    it takes any keyword (``**kwargs``). Loads the adapter's class, constructs nothing."""
    factory = harnesses.load(name)
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: let the call itself decide
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                 inspect.Parameter.KEYWORD_ONLY)]


def takes_cache_dir(name: str) -> bool:
    """Whether the adapter registered as ``name`` has a harness cache (a ``cache_dir`` option, or any keyword)."""
    accepted = accepted_options(name)
    return accepted is None or CACHE_OPTION in accepted


def _describe(name: str, accepted: list[str]) -> str:
    return f"harness {name!r} accepts " + (", ".join(accepted) if accepted else "no options")


def build_harness(name: str, options: Mapping[str, JSONValue] | None = None, *,
                  cache_dir: str | os.PathLike | None = None) -> HarnessAdapter:
    """The adapter registered as ``name`` built with ``options`` (and ``cache_dir`` as its ``cache_dir`` option when
    given: it wins over one in ``options``), after checking every key against its constructor (module invariants)."""
    opts: dict[str, object] = dict(options or {})
    if cache_dir is not None:
        opts[CACHE_OPTION] = str(cache_dir)
    accepted = accepted_options(name) if opts else None
    if accepted is not None:
        unknown = sorted(k for k in opts if k not in accepted)
        if unknown:
            why = ""
            if CACHE_OPTION in unknown:
                why = (f" ({name!r} has no harness cache: it installs nothing, so --harness-cache-dir / "
                       "harness_cache_dir does not apply)")
            raise ConfigError(f"harness option {', '.join(unknown)} unknown{why}; {_describe(name, accepted)} "
                              "(set them with --harness-opt KEY=VALUE or harness_options: in a config)")
    try:
        return make_harness(name, **opts)
    except ClawGymError:
        raise
    except (TypeError, ValueError) as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in opts.items())
        raise ConfigError(f"harness {name!r} refused its options ({given}): {exc}") from None


OPT_HELP = ("an option of the harness adapter (a keyword of its constructor, e.g. stream=true for mini, api=... for "
            "openclaw), repeatable; VALUE is read as JSON when it parses (true, 3, [..], {..}), else as a string")
CACHE_HELP = ("the harness cache the adapter finds its pinned harness in (and installs it into): the folder that "
              "`clawgym harness install --cache-dir` fills; default $CLAWGYM_CACHE/harnesses "
              "(~/.cache/clawgym/harnesses)")


def add_harness_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--harness-opt KEY=VALUE`` (repeatable, into ``harness_opts``) and ``--harness-cache-dir PATH`` (into
    ``harness_cache_dir``) to a command that builds a harness."""
    parser.add_argument("--harness-opt", dest="harness_opts", action="append", default=[], metavar="KEY=VALUE",
                        help=OPT_HELP)
    parser.add_argument("--harness-cache-dir", dest="harness_cache_dir", metavar="PATH", help=CACHE_HELP)
    return parser


def harness_from_args(name: str, args: argparse.Namespace) -> HarnessAdapter:
    """The adapter ``name`` built from a command's ``--harness-opt`` and ``--harness-cache-dir`` (see
    :func:`add_harness_arguments`)."""
    return build_harness(name, parse_harness_opts(getattr(args, "harness_opts", None) or []),
                         cache_dir=getattr(args, "harness_cache_dir", None))


def config_overrides(args: argparse.Namespace) -> list[str]:
    """A train command's ``--harness-opt`` and ``--harness-cache-dir`` as config overrides (``--set`` items):
    ``harness_options.*.KEY=VALUE`` (every harness of the run; the value re-encoded as JSON, which the YAML
    reader of ``--set`` reads back unchanged) and ``harness_cache_dir=PATH``."""
    out = [f"harness_options.*.{key}={json.dumps(value)}"
           for key, value in parse_harness_opts(getattr(args, "harness_opts", None) or []).items()]
    cache = getattr(args, "harness_cache_dir", None)
    if cache:
        out.append(f"harness_cache_dir={json.dumps(str(cache))}")
    return out
