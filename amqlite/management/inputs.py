"""Parsing of what a management API request carries: numbers in paths and query strings,
and JSON bodies. The same strict parser as STOMP headers (``codec.parse_uint``, ids
within the store's BIGINT), a JSON body bounded in size and nesting before it is decoded:
every bad input is an ``ActionError`` 400 with one line, never an exception from
``int()``, the store or the JSON decoder (issue 23, item 5).
"""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from amqlite.codec import parse_uint
from amqlite.management.actions import ActionError
from store.schema import BIGINT_MAX

#: Largest JSON body an action accepts: a list of ids to move (~10 bytes each), 1 MiB is
#: about 100,000 of them.
MAX_BODY_BYTES = 1024 * 1024
#: Deepest nesting of arrays and objects in a JSON body: an action's body is an object
#: holding a list of ids (2); the C decoder recurses per level, and 200,000 ``[`` are a
#: RecursionError.
MAX_JSON_DEPTH = 8
#: Strings (skipped: a bracket inside one does not nest) and the brackets themselves.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
#: A message id, ``after`` and ``limit``: what a BIGINT column holds.
MAX_ID = BIGINT_MAX


def uint(text: str, what: str, max_value: int = MAX_ID) -> int:
    """``text`` as an integer 0..``max_value`` (``codec.parse_uint``), else 400."""
    value = parse_uint(text, max_value)
    if value is None:
        raise ActionError(400, f"{what} must be an integer from 0 to {max_value}, "
                               f"got {_shown(text)}")
    return value


def message_id(request: web.Request) -> int:
    return uint(request.match_info["id"], "a message id (the 'id' of browse)")


def query_uint(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    """Query parameter ``name`` (``default`` when absent) within ``low..high``."""
    text = request.query.get(name)
    if text is None:
        return default
    value = uint(text, name, MAX_ID)
    if not low <= value <= high:
        raise ActionError(400, f"{name} must be {low}..{high}, got {value}")
    return value


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (strings skipped); stops
    counting past ``MAX_JSON_DEPTH``."""
    depth = deepest = 0
    for m in _JSON_TOKENS.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    break
        elif c in "]}":
            depth -= 1
    return deepest


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object ({} without a body); 400 when it is not one, nests
    deeper than ``MAX_JSON_DEPTH`` or is not UTF-8, 413 past the app's body size."""
    if not request.can_read_body:
        return {}
    raw = await request.read()  # aiohttp answers 413 past client_max_size
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ActionError(400, "the body is not UTF-8") from None
    if json_depth(text) > MAX_JSON_DEPTH:
        raise ActionError(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        raise ActionError(400, "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ActionError(400, "the body must be a JSON object")
    return data


def ids(body: dict[str, Any]) -> list[int] | None:
    """``"ids"`` of an action's body: message ids within a BIGINT (None: all)."""
    value = body.get("ids")
    if value is None:
        return None
    if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_ID
            for i in value):
        raise ActionError(400, f'"ids" must be a list of message ids (integers 0..{MAX_ID})')
    return value


def _shown(text: str, limit: int = 40) -> str:
    """``text`` for a one-line reason: cut, and repr'd (no newline gets through)."""
    return repr(text[:limit] + ("..." if len(text) > limit else ""))
