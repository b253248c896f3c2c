"""JSON as the engines must be sent it (RFC 8259's interoperable subset, I-JSON, RFC 7493):
UTF-8 without a byte order mark, no NaN or Infinity, no lone surrogate escapes.

Python's `json.loads` takes all of these (bytes in UTF-16 or UTF-32, a BOM, `NaN`, `"\\ud800"`),
and the gateway forwards the client's bytes: an engine whose parser refuses them answers a
500 or drops the connection, which the canary would count against the version. So they are
refused here, with a 400 that says which. One home, for the gateways and the router alike.
"""

from __future__ import annotations

import json
import math
from typing import Any

BOM = b"\xef\xbb\xbf"


class NotInteroperable(ValueError):
    """JSON Python takes and an engine may not; `param` names where (`temperature`,
    `messages[0].content`), None for the body as a whole."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param


def loads(body: bytes) -> Any:
    """The JSON value of `body`; ValueError when it is not JSON at all (json.loads's), or
    NotInteroperable saying what and where."""
    if body.startswith(BOM):
        raise NotInteroperable("a byte order mark before the JSON text: send UTF-8 without one")
    if b"\x00" in body:  # never in JSON text (a control character), always in UTF-16/32
        raise NotInteroperable("NUL bytes in the body (UTF-16 or UTF-32?): send UTF-8")
    text = body.decode("utf-8")  # strict: bad bytes are refused
    constants: list[str] = []

    def constant(name: str) -> float:  # NaN, Infinity, -Infinity: found by the walk below
        constants.append(name)
        return math.nan

    value = json.loads(text, parse_constant=constant)
    # Only an escape makes a surrogate (decoded UTF-8 has none), and only these names a
    # non-finite number: the walk runs only when one of them is there.
    if constants or "\\ud" in text or "\\uD" in text:
        _check(value)
    return value


def _check(value: Any) -> None:
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise NotInteroperable(
                    "a lone surrogate escape (\\ud800-\\udfff without its pair): escape a "
                    "character outside the BMP as a surrogate pair, or send it as UTF-8",
                    path or None) from None
        elif isinstance(item, float) and not math.isfinite(item):
            raise NotInteroperable("NaN and Infinity are not JSON (RFC 8259): send a number "
                                   "or null", path or None)
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, path))  # a key with a lone surrogate: its object
                stack.append((child, f"{path}.{key}" if path else str(key)))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
