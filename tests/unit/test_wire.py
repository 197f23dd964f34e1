"""The wire vocabulary is written once (amqlite/wire.py); the Spark audit's copy agrees."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from amqlite import wire

ROOT = Path(__file__).resolve().parents[2]
#: The one file allowed its own copy: the Spark audit imports only the standard
#: library and pyspark (spark/audit/, its limits in one room).
SPARK_JOB = ROOT / "spark" / "audit" / "limits.py"
#: Where the broker, client, CLI and bench live: they must import the names.
CODE_DIRS = ("amqlite", "cli", "bench")


def _module_constant(path: Path, name: str) -> object:
    """A module-level literal, read without importing (the job needs pyspark)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} is not a module-level literal in {path}")


def test_spark_audit_identity_headers_agree_with_the_vocabulary() -> None:
    assert _module_constant(SPARK_JOB, "IDENTITY_HEADERS") == (
        wire.PRODUCER_ID_HEADER, wire.PRODUCER_SEQ_HEADER)


def test_amqlite_header_names_are_spelled_only_in_the_vocabulary() -> None:
    names = [value for key, value in vars(wire).items()
             if key.endswith(("_HEADER", "_RECEIPT"))]
    stomp_names = [n for n in names if n != wire.CSRF_HEADER]  # the one HTTP header
    assert stomp_names and all(n.startswith("amqlite.") for n in stomp_names)
    quoted = re.compile("|".join(re.escape(f'"{n}"') for n in names))
    spelled = [
        f"{path.relative_to(ROOT)}:{lineno}"
        for folder in CODE_DIRS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "amqlite" / "wire.py"
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if quoted.search(line)
    ]
    assert spelled == []


def test_versions_and_ack_modes_are_the_ones_the_layers_use() -> None:
    from amqlite import codec, settings
    from amqlite.client import connection, uri

    assert codec.SUPPORTED_VERSIONS is wire.SUPPORTED_VERSIONS
    assert set(connection.OFFERED_VERSIONS) <= set(wire.SUPPORTED_VERSIONS)
    assert uri.DEFAULT_STOMP_PORT == wire.DEFAULT_STOMP_PORT
    assert settings.DEFAULT_BIND.endswith(f":{wire.DEFAULT_STOMP_PORT}")
