"""PostgreSQL URLs read as libpq reads them, for the store (``store.url``) and the lock
(``lockers.postgres``), so both take the same URLs and refuse the same ones.

A replicated PostgreSQL is reached through several hosts; libpq tries them in order and
keeps the first that answers and has the session attributes asked for
(``target_session_attrs``). It takes two spellings, and so does amqlite::

    postgresql://amq@db1:5432,db2:5432/amq?target_session_attrs=read-write
    postgresql://amq@/amq?host=db1,db2&port=5432,5432&target_session_attrs=read-write

SQLAlchemy's ``make_url`` reads only the second (the first fails on ``int('5432,db2')``),
so the URL is parsed here by libpq itself (``conninfo_to_dict``) and checked where libpq
checks only when it connects: the ports, their count, ``target_session_attrs``. A bad
URL is then a one-line settings error at start, not a connection error retried for ever.
"""

from __future__ import annotations

from dataclasses import dataclass

#: libpq's ``target_session_attrs`` values (PostgreSQL 14 added the last four).
TARGET_SESSION_ATTRS = ("any", "read-write", "read-only", "primary", "standby",
                        "prefer-standby")

#: What amqlite asks for when a URL names several hosts and no ``target_session_attrs``:
#: a session that can write. libpq's own default, ``any``, would keep the first host that
#: answers, a standby as readily as the primary; the store cannot write there and an
#: advisory lock taken there would elect nobody (a standby refuses it).
MULTI_HOST_TARGET = "read-write"

#: How libpq's message about a query parameter it does not know starts.
UNKNOWN_PARAMETER = "invalid URI query parameter"

#: The highest TCP port.
MAX_PORT = 65535


class PgUrlError(ValueError):
    """A PostgreSQL URL that cannot be used; the message never quotes the URL (it may
    hold a password) and has no caller's prefix."""


@dataclass(frozen=True)
class PgTarget:
    """What a PostgreSQL URL says, as libpq keywords (``params``: password included,
    ``target_session_attrs`` defaulted for several hosts) and its hosts in order
    (``(host, port)``, port ``""`` when the URL names none: libpq's default)."""

    params: dict[str, str]
    hosts: tuple[tuple[str, str], ...]

    @property
    def several_hosts(self) -> bool:
        return len(self.hosts) > 1

    @property
    def hosts_text(self) -> str:
        """``db1:5432,db2:5432`` as a log or a URL shows them (IPv6 in brackets)."""
        return hosts_text(self.hosts)


def hosts_text(hosts: tuple[tuple[str, str], ...]) -> str:
    """``((host, port), ...)`` as libpq's URL writes them: ``db1:5432,[::1]:5433,db3``."""
    shown = []
    for host, port in hosts:
        name = f"[{host}]" if ":" in host and not host.startswith("/") else host
        shown.append(f"{name}:{port}" if port else name)
    return ",".join(shown)


def split_hosts(host: str, port: str) -> tuple[tuple[str, str], ...]:
    """libpq's ``host`` and ``port`` keywords (comma-separated lists) as pairs, checked as
    libpq checks them when it connects: one port for all hosts or one per host, each a
    number in 1..65535 or empty (the default). Raises ``PgUrlError``."""
    names = host.split(",") if host else [""]
    ports = port.split(",") if port else [""]
    if len(ports) == 1:
        ports *= len(names)
    if len(ports) != len(names):
        raise PgUrlError(f"{len(names)} host(s) but {len(ports)} ports: give one port for "
                         "all hosts or one per host")
    for p in ports:
        if p and not (p.isdigit() and 0 < int(p) <= MAX_PORT):
            raise PgUrlError(f"port {p!r} is not a number in 1..{MAX_PORT}")
    if len(names) > 1 and not all(names):
        raise PgUrlError("an empty host in a list of several")
    return tuple(zip(names, ports, strict=True))


def libpq_url(url: str) -> str:
    """``postgresql+psycopg://`` (SQLAlchemy's driver spelling) -> ``postgresql://``."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower().startswith("postgresql+"):
        return "postgresql://" + rest
    return url


def parse_pg_url(url: str) -> PgTarget:
    """libpq's reading of ``url`` (a ``postgresql://`` URL, one host or several, or a
    ``key=value`` conninfo string), checked; raises ``PgUrlError``."""
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    try:
        raw = conninfo_to_dict(libpq_url(url))
    except Error as e:
        # libpq's message quotes the offending token, which may be the password; a
        # parameter's name is no secret, and the one mistake worth naming.
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        unknown = first if first.startswith(UNKNOWN_PARAMETER) else ""
        raise PgUrlError(f"libpq cannot parse it{': ' + unknown if unknown else ''}") from None
    params = {k: str(v) for k, v in raw.items() if v is not None}
    hosts = split_hosts(params.get("host", ""), params.get("port", ""))
    target = params.get("target_session_attrs")
    if target is not None and target not in TARGET_SESSION_ATTRS:
        raise PgUrlError(f"target_session_attrs {target!r} is not one of "
                         f"{', '.join(TARGET_SESSION_ATTRS)}")
    if len(hosts) > 1 and target is None:
        params["target_session_attrs"] = MULTI_HOST_TARGET
    return PgTarget(params, hosts)
