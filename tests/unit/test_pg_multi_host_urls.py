"""Issue 22: a replicated PostgreSQL is reached through several hosts, in either of libpq's
spellings (``@db1:5432,db2:5432/amq`` and ``?host=db1,db2&port=5432,5432``), for the store
and the locker alike, with ``target_session_attrs`` honoured (read-write when several hosts
name none). A URL that cannot be used is one line and exit 2 at start, never a password."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from amqlite.registry import display_url
from amqlite.settings import SettingsError, load_settings
from cli.main import EXIT_USAGE, cli
from lockers import LockerError, open_locker
from lockers.connections.pg_url import MULTI_HOST_TARGET, PgUrlError, parse_pg_url
from store import StoreError, parse_store_url

COMMA = "postgresql://amq:s3cret@db1:5432,db2:5433/amq?target_session_attrs=read-write"
QUERY = "postgresql://amq:s3cret@/amq?host=db1,db2&port=5432,5433&target_session_attrs=read-write"
#: SQLAlchemy's own spelling of several hosts, which worked before and still does.
SQLALCHEMY = ("postgresql+psycopg://amq:s3cret@/amq?host=db1:5432&host=db2:5433"
              "&target_session_attrs=read-write")
SHOWN = "postgresql+psycopg://amq:***@db1:5432,db2:5433/amq?target_session_attrs=read-write"


@pytest.fixture(autouse=True)
def no_amqlite_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("AMQLITE_")]:
        monkeypatch.delenv(name)


def connect_args(raw: str) -> dict[str, object]:
    """What SQLAlchemy hands psycopg for the store URL ``raw``."""
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    return PGDialect_psycopg().create_connect_args(parse_store_url(raw).url)[1]


@pytest.mark.parametrize("raw", [COMMA, QUERY, SQLALCHEMY], ids=["comma", "query", "sqlalchemy"])
def test_every_spelling_reaches_psycopg_as_libpq_host_and_port_lists(raw: str) -> None:
    args = connect_args(raw)
    assert args["host"] == "db1,db2" and args["port"] == "5432,5433"
    assert args["target_session_attrs"] == "read-write"
    assert (args["user"], args["password"], args["dbname"]) == ("amq", "s3cret", "amq")
    parsed = parse_store_url(raw)
    assert parsed.dialect == "postgresql"
    assert parsed.description == SHOWN  # one spelling in logs, password masked


def test_two_spellings_of_one_store_are_one_registry() -> None:
    assert display_url(COMMA) == display_url(QUERY) == display_url(SQLALCHEMY)
    assert "s3cret" not in display_url(COMMA)


def test_several_hosts_without_target_session_attrs_ask_for_read_write() -> None:
    for raw in ("postgresql://amq@db1,db2/amq", "postgresql://amq@/amq?host=db1,db2"):
        assert connect_args(raw)["target_session_attrs"] == MULTI_HOST_TARGET == "read-write"
    assert connect_args("postgresql://amq@db1,db2/amq?target_session_attrs=primary")[
        "target_session_attrs"] == "primary"  # what the URL says wins


def test_one_port_serves_every_host_and_ipv6_is_bracketed() -> None:
    args = connect_args("postgresql://amq@db1,db2:6000/amq?port=6000")
    assert args["host"] == "db1,db2" and args["port"] == "6000,6000"
    parsed = parse_store_url("postgresql://amq@[::1]:5432,db2/amq")
    assert parsed.description == ("postgresql+psycopg://amq@[::1]:5432,db2/amq"
                                  "?target_session_attrs=read-write")
    assert connect_args("postgresql://amq@[::1]:5432,db2/amq")["host"] == "::1,db2"


def test_a_single_host_url_is_read_as_before() -> None:
    parsed = parse_store_url("postgresql://amq:pw@db:5432/amq")
    assert parsed.description == "postgresql+psycopg://amq:***@db:5432/amq"
    assert (parsed.url.host, parsed.url.port) == ("db", 5432)
    assert "target_session_attrs" not in connect_args("postgresql://amq:pw@db:5432/amq")


@pytest.mark.parametrize(("raw", "why"), [
    ("postgresql://amq:s3cret@db1:5432,db2:54x2/amq", "port '54x2' is not a number"),
    ("postgresql://amq:s3cret@db1,db2,db3/amq?port=1,2", "3 host(s) but 2 ports"),
    ("postgresql://amq:s3cret@db1,db2/amq?target_session_attrs=master",
     "target_session_attrs 'master' is not one of"),
    ("postgresql://amq:s3cret@db1,db2/amq?bogus=1", 'invalid URI query parameter: "bogus"'),
    ("postgresql://amq:s3cret@db1:5432,db2:70000/amq", "port '70000'"),
])
def test_a_bad_multi_host_url_is_one_line_without_the_password(raw: str, why: str) -> None:
    with pytest.raises(StoreError) as store_error:
        parse_store_url(raw)
    with pytest.raises(LockerError) as locker_error:
        open_locker(raw, "g", node="n")
    for error in (store_error.value, locker_error.value):
        text = str(error)
        assert why in text and "\n" not in text and "s3cret" not in text, text
    with pytest.raises(PgUrlError):
        parse_pg_url(raw)


def test_a_url_nobody_can_parse_is_still_refused() -> None:
    with pytest.raises(StoreError, match=r"^store URL postgresql\+psycopg://amq:\*\*\*@db1:"
                                         "5432,db2:5432.* names no database"):
        parse_store_url("postgresql://amq:s3cret@db1:5432,db2:5432")
    with pytest.raises(StoreError, match="cannot parse store URL"):
        parse_store_url("nonsense")


@pytest.mark.parametrize("raw", [COMMA, QUERY])
def test_the_locker_takes_both_spellings(raw: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    locker = open_locker(raw, "g", node="n")
    params = conninfo_to_dict(locker._conninfo)  # type: ignore[attr-defined]
    assert params["host"] == "db1,db2" and params["port"] == "5432,5433"
    assert params["target_session_attrs"] == "read-write"
    assert params["application_name"] == "amqlite-lock:g:n"
    assert locker.description == "postgres advisory lock 'g' on amq@db1:5432,db2:5433/amq"
    default = open_locker("postgresql://amq@db1,db2/amq", "g", node="n")
    assert conninfo_to_dict(default._conninfo)[  # type: ignore[attr-defined]
        "target_session_attrs"] == "read-write"


def test_settings_accept_both_spellings_and_refuse_a_bad_one() -> None:
    s = load_settings({"store": COMMA, "locker": QUERY}, environ={})
    assert (s.store, s.locker) == (COMMA, QUERY)
    with pytest.raises(SettingsError, match=r"^store: cannot parse store URL: 3 host"):
        load_settings({"store": "postgresql://a@h1,h2,h3/amq?port=1,2"}, environ={})
    with pytest.raises(SettingsError, match=r"^locker: bad PostgreSQL URL: 3 host"):
        load_settings({"locker": "postgresql://a@h1,h2,h3/amq?port=1,2"}, environ={})


@pytest.mark.parametrize("option", ["--store", "--locker"])
def test_start_with_a_bad_url_exits_2_with_one_line(option: str, tmp_path: object) -> None:
    bad = "postgresql://amq:s3cret@db1:5432,db2:5432/amq?target_session_attrs=sometimes"
    result = CliRunner().invoke(cli, ["start", "--data-dir", str(tmp_path), option, bad])
    assert result.exit_code == EXIT_USAGE == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "target_session_attrs 'sometimes'" in lines[0], lines
    assert "s3cret" not in result.output
