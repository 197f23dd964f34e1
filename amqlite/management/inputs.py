"""Parsing of what a management API request carries: numbers in paths and query strings,
and JSON bodies. The same strict parser as STOMP headers (``codec.parse_uint``, ids
within the store's BIGINT), a JSON body bounded in size and nesting before it is decoded:
every bad input is an ``ActionError`` 400 with one line, never an exception from
``int()``, the store or the JSON decoder (issue 23, item 5).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from amqlite.codec import parse_uint
from amqlite.management.actions import ActionError
from store.limits import BIGINT_MAX

#: Largest JSON body an action accepts: a list of ids to move (~10 bytes each), 1 MiB is
#: about 100,000 of them.
MAX_BODY_BYTES = 1024 * 1024
#: Seconds for a body to arrive once its handler reads it: 1 MiB takes well under a
#: second on any link an operator uses; a body trickled in byte by byte would otherwise
#: keep its connection busy (never closed to make room) for as long as the sender likes.
BODY_TIMEOUT = 10.0
#: Deepest nesting of arrays and objects in a JSON body: an action's body is an object
#: holding a list of ids (2); the C decoder recurses per level, and 200,000 ``[`` are a
#: RecursionError.
MAX_JSON_DEPTH = 8
#: Strings (skipped: a bracket inside one does not nest) and the brackets themselves.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
#: A message id, ``after`` and ``limit``: what a BIGINT column holds.
MAX_ID = BIGINT_MAX
#: Largest float every integer up to which a double holds exactly (2^53, IEEE 754).
MAX_EXACT_FLOAT = 2.0**53


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
    deeper than ``MAX_JSON_DEPTH`` or is not UTF-8, 413 past the app's body size, 408
    when it takes longer than ``BODY_TIMEOUT`` to arrive."""
    if not request.can_read_body:
        return {}
    try:
        async with asyncio.timeout(BODY_TIMEOUT):
            raw = await request.read()  # aiohttp answers 413 past client_max_size
    except TimeoutError:
        raise ActionError(408, f"the body did not arrive within {BODY_TIMEOUT:g} s") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ActionError(400, "the body is not UTF-8") from None
    if json_depth(text) > MAX_JSON_DEPTH:
        raise ActionError(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(text) if text else {}  # whitespace alone is no JSON text
    except (ValueError, RecursionError):
        raise ActionError(400, "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ActionError(400, "the body must be a JSON object")
    if "\\u" in text and not _unicode(data):
        raise ActionError(400, "the body holds a lone surrogate (a \\ud800-\\udfff escape "
                               "without its pair): not Unicode text")
    return data


def _unicode(data: Any) -> bool:
    """False when a string anywhere in ``data`` holds a lone surrogate: JSON's escapes
    allow ``"\\udb55"``, which no UTF-8 (a message body, a header, a store column) can
    hold. One encode of the whole body, at most 1 MiB."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def ids(body: dict[str, Any]) -> list[int] | None:
    """``"ids"`` of an action's body: message ids within a BIGINT (None: all). JSON has
    one number type, so ``5.0`` is id 5 (as JSON Schema's ``integer`` says), but only up
    to ``MAX_EXACT_FLOAT``: a larger float may not be the id its sender meant."""
    value = body.get("ids")
    if value is None:
        return None
    bad = ActionError(400, f'"ids" must be a list of message ids (integers 0..{MAX_ID})')
    if not isinstance(value, list):
        raise bad
    out = []
    for item in value:
        if (i := _id(item)) is None:
            raise bad
        out.append(i)
    return out


def _id(value: Any) -> int | None:
    if isinstance(value, float) and value.is_integer() and 0 <= value <= MAX_EXACT_FLOAT:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID:
        return value
    return None


#: Headers a message sent from the API may not carry: the path names the destination,
#: the API asks for the receipt, and the broker numbers the message itself.
RESERVED_HEADERS = frozenset({"destination", "receipt", "transaction", "content-length",
                              "message-id", "persistent"})


def message(body: dict[str, Any]) -> tuple[str, dict[str, str], bool]:
    """``"body"`` (text), ``"headers"`` (an object of strings) and ``"persistent"``
    (true unless false) of a send."""
    text = body.get("body", "")
    if not isinstance(text, str):
        raise ActionError(400, '"body" must be a string (the message text)')
    headers = body.get("headers")
    headers = {} if headers is None else headers
    if not isinstance(headers, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in headers.items()):
        raise ActionError(400, '"headers" must be an object of non-empty names to strings')
    reserved = sorted(RESERVED_HEADERS & {k.lower() for k in headers})
    if reserved:
        raise ActionError(400, f"header {reserved[0]!r} may not be set here")
    bad = next((k for k, v in headers.items() if any(c in k + v for c in "\r\n\0")
                or ":" in k), None)
    if bad is not None:
        raise ActionError(400, f"header {_shown(bad)}: no ':' in a name, no line break or "
                               "NUL in a name or value")
    persistent = body.get("persistent", True)
    if not isinstance(persistent, bool):
        raise ActionError(400, '"persistent" must be true or false')
    return text, headers, persistent


def _shown(text: str, limit: int = 40) -> str:
    """``text`` for a one-line reason: cut, and repr'd (no newline gets through)."""
    return repr(text[:limit] + ("..." if len(text) > limit else ""))
