"""``store.statements.encode_headers`` (the C encoder made once) writes exactly what
``json.dumps(headers, ensure_ascii=False, separators=(",", ":"))`` writes: the stored
headers column is read back with ``json.loads`` by every version of the broker."""

from __future__ import annotations

import json

import pytest

from store.statements import encode_headers

CASES = [
    {},
    {"destination": "/queue/a", "persistent": "true", "amqlite.producerSeq": "12"},
    {"é": "ü ✓ 𝄞", "emoji": "\U0001f600"},
    {"q": 'a "quoted" \\ back\\slash', "ctl": "\n\r\t\x01\x1f\x7f", "nul": "a\x00b"},
    {"surrogate": "\ud800", "colon:name": "ID:g:42"},
    {"": "empty name", "empty": ""},
]


@pytest.mark.parametrize("headers", CASES)
def test_same_text_as_json_dumps(headers: dict[str, str]) -> None:
    expected = json.dumps(headers, ensure_ascii=False, separators=(",", ":"))
    assert encode_headers(headers) == expected
    if "\ud800" not in expected:
        assert json.loads(encode_headers(headers)) == headers


def test_insertion_order_kept() -> None:
    headers = {"z": "1", "a": "2", "m": "3"}
    assert encode_headers(headers) == '{"z":"1","a":"2","m":"3"}'
