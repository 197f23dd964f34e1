"""The values each setting may take (``Domain``), apart from ``amqlite.settings`` so that
module keeps to the fields themselves and how they are read.

A field names its domain in its metadata (``amqlite.settings.doc(domain=...)``) and
``Settings.resolved`` checks every value against it, whatever its source. Domains that
depend on a backend's own limit import it when checked, so loading the settings never
imports psycopg or the store's schema.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple


class Domain(NamedTuple):
    """The values a setting may take: ``accepts`` tests one, ``must_be`` says which."""

    accepts: Callable[[Any], bool]
    must_be: Callable[[], str]  # called for the message only (it may import a backend)


def described(must_be: str, accepts: Callable[[Any], bool]) -> Domain:
    """A domain whose description is a fixed text."""
    return Domain(accepts, lambda: must_be)


def _min_lease() -> float:
    from lockers.pg_lease import PG_MIN_LEASE  # psycopg: imported when checked

    return PG_MIN_LEASE


def _max_prefetch() -> int:
    from amqlite.validation import MAX_PREFETCH  # the store's schema: imported when checked

    return MAX_PREFETCH


#: Log levels ``log_level`` takes (any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SECONDS = described("a number of seconds > 0", lambda v: math.isfinite(v) and v > 0)
SECONDS_OR_ZERO = described("a number of seconds >= 0", lambda v: math.isfinite(v) and v >= 0)
COUNT = described("an integer > 0", lambda v: v > 0)
COUNT_OR_ZERO = described("an integer >= 0", lambda v: v >= 0)
BYTES = described("a number of bytes > 0", lambda v: v > 0)
NAME = described("a name without '/' or control characters",
                 lambda v: bool(v.strip()) and "/" not in v and v.isprintable())
LEVEL = described(f"one of {', '.join(LOG_LEVELS)}", lambda v: v.upper() in LOG_LEVELS)
#: 0 (no lease) or at least what the PostgreSQL locker accepts, whatever the locker:
#: a value the one locker that reads it would refuse is refused for all.
LEASE = Domain(
    lambda v: v == 0 or _min_lease() <= v < math.inf,
    lambda: f"0 (no lease) or at least {_min_lease():g} s, the PostgreSQL locker's "
            "minimum (PG_MIN_LEASE, lockers/pg_lease.py)")
PREFETCH = Domain(
    lambda v: 0 < v <= _max_prefetch(),
    lambda: f"an integer from 1 to {_max_prefetch()}, the most a SUBSCRIBE may ask "
            "(MAX_PREFETCH, amqlite/validation.py)")
