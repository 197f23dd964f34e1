"""The store schema is written once (store/schema.py); the Spark audit's copy agrees.

The Spark audit (spark/audit/) imports only the standard library and pyspark, so
it restates the tables and columns it reads, with the Spark SQL type it reads each
as (``STORE_COLUMNS``, in spark/audit/limits.py). The job is read here without
importing it (it imports pyspark), as tests/unit/test_wire.py reads its copy of
the identity headers.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
)

from store import schema
from store.housekeeping import DEDUP_PRUNED_PREFIX, dedup_pruned_key

ROOT = Path(__file__).resolve().parents[2]
#: Where the audit's limits and store columns are declared.
SPARK_JOB = ROOT / "spark" / "audit" / "limits.py"
#: Every module of the audit, whose SQL names the tables it reads.
SPARK_MODULES = sorted((ROOT / "spark" / "audit").glob("*.py"))

#: The Spark SQL type a column of each SQLAlchemy type is read as.
SPARK_TYPES: dict[type, str] = {
    BigInteger: "bigint",
    Integer: "int",
    SmallInteger: "smallint",
    String: "string",
    Text: "string",
    LargeBinary: "binary",
    Boolean: "boolean",
}


def _job_tree() -> ast.Module:
    return ast.parse(SPARK_JOB.read_text(encoding="utf-8"))


def _module_constant(tree: ast.Module, name: str) -> object:
    """A module-level literal (``NAME = ...`` or ``NAME: T = ...``), read without importing."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} is not a module-level literal in {SPARK_JOB}")


def _job_columns() -> dict[str, dict[str, str]]:
    columns = _module_constant(_job_tree(), "STORE_COLUMNS")
    assert isinstance(columns, dict) and columns
    return columns


def _spark_type(column) -> str:
    kind = type(column.type)
    assert kind in SPARK_TYPES, f"{column}: no Spark type known for {kind.__name__}"
    return SPARK_TYPES[kind]


def test_every_store_column_type_has_a_spark_type() -> None:
    for table in schema.metadata.tables.values():
        for column in table.columns:
            _spark_type(column)


@pytest.mark.parametrize("table", sorted(_job_columns()))
def test_audit_job_columns_agree_with_the_store_schema(table: str) -> None:
    assert table in schema.metadata.tables, f"the audit reads {table}, which the store lacks"
    declared = schema.metadata.tables[table].columns
    job = _job_columns()[table]
    assert job, f"the audit declares no columns of {table}"
    missing = sorted(set(job) - set(declared.keys()))
    assert missing == [], f"the audit reads {table} columns the store lacks: {missing}"
    assert job == {name: _spark_type(declared[name]) for name in job}


def test_audit_job_reads_the_prune_records_the_store_writes() -> None:
    """The job finds a group's last dedup prune under the key prefix the store writes."""
    assert _module_constant(_job_tree(), "DEDUP_PRUNED_PREFIX") == DEDUP_PRUNED_PREFIX
    assert dedup_pruned_key("g" * schema.NAME_LENGTH).startswith(DEDUP_PRUNED_PREFIX)
    assert len(dedup_pruned_key("g" * schema.NAME_LENGTH)) <= schema.meta.c.key.type.length


def test_audit_job_names_only_tables_it_declares() -> None:
    """Every table the job's SQL reads from, or names as a read, is in STORE_COLUMNS."""
    sources = [path.read_text(encoding="utf-8") for path in SPARK_MODULES]
    named = {table for source in sources for table in re.findall(r"\bFROM (amq_\w+)", source)}
    named |= {
        node.value
        for source in sources
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"amq_\w+", node.value)
    }
    assert named, "found no table names in the job: has the pattern changed?"
    assert sorted(named - set(_job_columns())) == []
