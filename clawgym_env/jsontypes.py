"""The one name for untyped JSON in the library.

:data:`JSONObject` is a JSON object as parsed from, or about to be sent on, a wire or a file (a request/response
body, an SSE event, a tool call's arguments, a record's JSON form); its values are unchecked until validated. It is
not for data passed between our own functions: that gets a dataclass, a TypedDict or a pydantic model.

:data:`JSONValue` is any JSON value (object, array, string, number, boolean or null), with the same rule.

The aliases are plain ``dict[str, Any]`` / ``Any`` at run time, so pydantic fields and ``isinstance`` checks on
the values behave exactly as before; the name marks the boundary.
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: A JSON object from or for a wire or a file: a request/response body, an SSE event, a tool call's arguments,
#: a record's JSON form. Values are unchecked until validated. Not for data passed between our own functions.
JSONObject: TypeAlias = dict[str, Any]

#: Any JSON value (object, array, string, number, boolean, null) from or for a wire or a file; unchecked.
JSONValue: TypeAlias = Any

__all__ = ["JSONObject", "JSONValue"]
