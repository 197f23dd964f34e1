"""ActiveMQ scheduled delivery, the pure part: SEND headers in, due times out.

A SEND may carry ActiveMQ's ``AMQ_SCHEDULED_*`` headers (``org.apache.activemq.
ScheduledMessage``). ``parse_schedule`` reads them into a ``Schedule`` or refuses them
with a ``ScheduleError`` naming the header and why (the broker answers with an ERROR);
``Schedule.first_due`` and ``Schedule.next_due`` say when each copy is due. Nothing here
reads a clock, stores or delivers: the broker does that.

What ActiveMQ does, and so amqlite (ActiveMQ 5.x/6.x sources: ``SchedulerBroker.send``,
``doSchedule``; kahadb ``JobSchedulerImpl.doSchedule``, ``mainLoop``; AMQ-7458):

- A message is scheduled when it has ``AMQ_SCHEDULED_DELAY``, ``AMQ_SCHEDULED_PERIOD`` or
  a non-empty ``AMQ_SCHEDULED_CRON``; ``AMQ_SCHEDULED_REPEAT`` alone schedules nothing
  (it is ignored), and a message that already has ``scheduledJobId`` (the scheduler put
  it on a copy it delivered: a consumer is forwarding it) is sent at once, unscheduled.
- Without a cron: the first copy is due ``DELAY`` after the SEND, or ``PERIOD`` after it
  when there is no positive delay (``time += delay > 0 ? delay : period``); then
  ``REPEAT`` more copies follow, ``PERIOD`` apart. So DELAY=30 s, PERIOD=10 s, REPEAT=9
  is ten copies, at 30 s, 40 s, ... 120 s (the example of ActiveMQ's documentation).
- With a cron: each time the cron fires, the same sequence starts from that minute (in
  ActiveMQ a firing with a repeat starts a new job with the message's delay, period and
  repeat); without a repeat, one copy per firing.
- Negative values are refused, as ActiveMQ does since AMQ-7458 (2020,
  ``ActiveMQMessage.convertScheduled``: "must not be a negative value"); before that a
  negative repeat happened to repeat forever (the scheduler rescheduled while
  ``repeat != 0`` and counted down only a positive one). ``REPEAT`` is at most
  ``MAX_REPEAT``, ActiveMQ's default ``maxRepeatAllowed``. A cron that does not parse
  is refused at SEND time, as ActiveMQ's ``CronParser.validate`` does.

Where amqlite differs, deliberately:

- ``AMQ_SCHEDULED_PERIOD`` must be positive when given (ActiveMQ takes 0: copies
  without a pause).
- Due times are exact: the next copy is due ``PERIOD`` after the previous *due* time
  (ActiveMQ: after the moment it fired, so late firings drift), and the SEND time is
  not rounded up to the next half second as ActiveMQ's store does to batch jobs.
- With a cron, every firing starts the same sequence. ActiveMQ applies the
  delay-or-period offset to its first firing twice when there is a repeat (its first
  cron job is already offset, then starts an offset job) and, without a repeat, only
  to the first firing.
- One message is one sequence: a cron firing that comes before the previous firing's
  copies are all due is skipped (ActiveMQ runs the two jobs side by side).
- The cron syntax is standard (Vixie) cron, a superset of ActiveMQ's ``CronParser``:
  month and weekday names, 7 for Sunday, and steps counted from the start of their
  range (``1-10/3`` is 1,4,7,10; ActiveMQ keeps the multiples of 3 in 1-10: 3,6,9; both
  agree on ``*/N`` for minutes and hours). Day-of-month and day-of-week follow cron's
  rule: when both are restricted (neither starts with ``*``) a day matching either
  fires; otherwise both must match. Cron times are UTC (ActiveMQ: the broker's zone).
"""

from __future__ import annotations

import calendar
import json
import re
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import MAXYEAR, datetime, timedelta

__all__ = [
    "CRON_HEADER",
    "DELAY_HEADER",
    "JOB_ID_HEADER",
    "MAX_INTERVAL_MS",
    "MAX_LOOKAHEAD_YEARS",
    "MAX_REPEAT",
    "PERIOD_HEADER",
    "REPEAT_HEADER",
    "SCHEDULE_HEADERS",
    "CronExpression",
    "Plan",
    "Schedule",
    "ScheduleError",
    "next_occurrence",
    "parse_cron",
    "parse_schedule",
]

#: ActiveMQ's header names (``org.apache.activemq.ScheduledMessage``).
DELAY_HEADER = "AMQ_SCHEDULED_DELAY"
PERIOD_HEADER = "AMQ_SCHEDULED_PERIOD"
REPEAT_HEADER = "AMQ_SCHEDULED_REPEAT"
CRON_HEADER = "AMQ_SCHEDULED_CRON"
#: ``ScheduledMessage.AMQ_SCHEDULED_ID``: set on every copy the scheduler delivers; a
#: SEND that carries it is not scheduled again.
JOB_ID_HEADER = "scheduledJobId"
#: What ActiveMQ removes from the copies it delivers, so that forwarding one does not
#: schedule it again (``SchedulerBroker.scheduledJob``).
SCHEDULE_HEADERS = (DELAY_HEADER, PERIOD_HEADER, REPEAT_HEADER, CRON_HEADER)

#: ActiveMQ's ``SchedulerBroker.MAX_REPEAT_ALLOWED`` (AMQ-7458: "to prevent clients
#: from causing DoS issues with huge repeat counts").
MAX_REPEAT = 1000
#: Longest delay or period: a century. ActiveMQ bounds them only by Java's long; a
#: century keeps every due time, even MAX_REPEAT periods on (about 3e15 ms), far
#: inside the store's BIGINT (9.2e18).
MAX_INTERVAL_MS = 100 * 365 * 24 * 3600 * 1000
#: How far ahead the next cron firing is looked for: 8 years, the longest gap between
#: two February 29ths (2096 to 2104, as 2100 is not a leap year), so that any
#: expression that can fire on a day of its month, or on a weekday, is found. What
#: does not fire within it is refused (or, for a running schedule, ends it): only
#: expressions that need a date to fall on a given weekday can be that rare.
MAX_LOOKAHEAD_YEARS = 8
#: An ERROR quotes at most this many characters of a bad value (a header may be
#: kilobytes long).
MAX_SHOWN = 64
#: Digits of Java's Long.MAX_VALUE: ActiveMQ reads delay and period as a long, repeat
#: as an int; a longer number (there, or in a cron field) is out of range whatever its
#: value, and is not converted.
MAX_DIGITS = 19

_MS_PER_MINUTE = 60_000
_EPOCH = datetime(1970, 1, 1)  # naive, read as UTC
#: The instants a cron firing can be looked for after: Python's datetime spans years
#: 1 to 9999 (a due time past it, MAX_REPEAT centuries on, has no next firing).
_FIRST_MS = (datetime(1, 1, 1) - _EPOCH) // timedelta(milliseconds=1)
_LAST_MS = (datetime(MAXYEAR, 12, 31, 23, 58) - _EPOCH) // timedelta(milliseconds=1)
_INTEGER = re.compile(r"[+-]?[0-9]+")
_MONTHS = {name.upper(): i for i, name in enumerate(calendar.month_abbr) if name}
_WEEKDAYS = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}
#: Days a month can have, February counted in a leap year.
_MONTH_DAYS = {m: calendar.monthrange(2000, m)[1] for m in range(1, 13)}


class ScheduleError(ValueError):
    """A scheduling header the broker refuses; the message names it and says why."""


def _shown(value: str) -> str:
    return repr(value if len(value) <= MAX_SHOWN else value[:MAX_SHOWN] + "...")


# -- cron ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: Mapping[str, int]


_FIELDS = (
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day of month", 1, 31, {}),
    _Field("month", 1, 12, _MONTHS),
    _Field("day of week", 0, 7, _WEEKDAYS),  # 0 and 7 are Sunday, as in Vixie cron
)


@dataclass(frozen=True, slots=True)
class CronExpression:
    """A parsed 5-field cron expression (``parse_cron``); times are UTC minutes."""

    text: str
    minutes: tuple[int, ...]  # sorted
    hours: tuple[int, ...]  # sorted
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 is Sunday
    #: The day-of-month / day-of-week field starts with '*' (Vixie's DOM_STAR and
    #: DOW_STAR): then both must match a day, otherwise either.
    days_star: bool
    weekdays_star: bool

    def next_after(self, ms: int) -> int | None:
        """The first firing strictly after ``ms`` (epoch milliseconds), or None when
        there is none within MAX_LOOKAHEAD_YEARS. Walks months, then days of a month
        the expression allows, then takes the first hour and minute at once: at most
        ~100 months of ~31 days, never minute by minute."""
        if not _FIRST_MS <= ms < _LAST_MS:
            return None
        start = _EPOCH + timedelta(minutes=ms // _MS_PER_MINUTE + 1)
        year, month = start.year, start.month
        for _ in range(MAX_LOOKAHEAD_YEARS * 12 + 1):
            if month in self.months:
                first = (year, month) == (start.year, start.month)
                found = self._in_month(year, month, start if first else None)
                if found is not None:
                    return found
            year, month = (year, month + 1) if month < 12 else (year + 1, 1)
            if year > MAXYEAR:
                return None
        return None

    def day_matches(self, day: int, weekday: int) -> bool:
        """Cron's rule for a day of the month and its weekday (0 is Sunday)."""
        if self.days_star or self.weekdays_star:
            return day in self.days and weekday in self.weekdays
        return day in self.days or weekday in self.weekdays

    def _in_month(self, year: int, month: int, start: datetime | None) -> int | None:
        monday_based, size = calendar.monthrange(year, month)  # weekday of the 1st
        for day in range(start.day if start is not None else 1, size + 1):
            # day 1 is monday_based (Monday 0); cron counts from Sunday 0
            if not self.day_matches(day, (monday_based + day) % 7):
                continue
            at = self._time_from(start.hour, start.minute) \
                if start is not None and day == start.day else (self.hours[0], self.minutes[0])
            if at is not None:
                moment = datetime(year, month, day, at[0], at[1])
                return (moment - _EPOCH) // timedelta(milliseconds=1)
        return None

    def _time_from(self, hour: int, minute: int) -> tuple[int, int] | None:
        """The first (hour, minute) of the expression at or after the given one."""
        i = bisect_left(self.hours, hour)
        if i < len(self.hours) and self.hours[i] == hour:
            j = bisect_left(self.minutes, minute)
            if j < len(self.minutes):
                return hour, self.minutes[j]
            i += 1
        return (self.hours[i], self.minutes[0]) if i < len(self.hours) else None


def _cron_error(text: str, why: str) -> ScheduleError:
    return ScheduleError(f"{CRON_HEADER} {_shown(text)}: {why}")


def _value(text: str, spec: _Field, token: str) -> int:
    """One number or name of a field, checked against its range."""
    if token.isascii() and token.isdigit():
        number = int(token) if len(token) <= MAX_DIGITS else spec.high + 1  # too long for any field
    elif token.upper() in spec.names:
        return spec.names[token.upper()]
    else:
        names = f" or a name like {next(iter(spec.names))}" if spec.names else ""
        raise _cron_error(text, f"{spec.name} {_shown(token)} is not a number{names}")
    if not spec.low <= number <= spec.high:
        raise _cron_error(text, f"{spec.name} {_shown(token)} is out of range "
                                f"{spec.low}-{spec.high}")
    return number


def _parse_field(text: str, spec: _Field, field_text: str) -> set[int]:
    """``*``, ``N``, ``N-M``, ``*/S``, ``N-M/S`` and lists of them (Vixie cron)."""
    values: set[int] = set()
    for element in field_text.split(","):
        if not element:
            raise _cron_error(text, f"{spec.name} {_shown(field_text)} has an empty "
                                    f"list element")
        span, slash, step_text = element.partition("/")
        if span == "*":
            low, high = spec.low, spec.high
        elif "-" in span:
            first, _, last = span.partition("-")
            low, high = _value(text, spec, first), _value(text, spec, last)
            if low > high:
                raise _cron_error(text, f"{spec.name} range {_shown(span)} runs backwards")
        elif slash:
            raise _cron_error(text, f"{spec.name} {_shown(element)}: a step needs '*' or "
                                    f"a range before it")
        else:
            low = high = _value(text, spec, span)
        step = 1
        if slash:
            digits = step_text.isascii() and step_text.isdigit()
            step = int(step_text) if digits and len(step_text) <= MAX_DIGITS else 0
            if not 1 <= step <= high - low + 1:
                raise _cron_error(text, f"{spec.name} step {_shown(step_text)} must be a "
                                        f"number from 1 to {high - low + 1}")
        values.update(range(low, high + 1, step))
    return values


def parse_cron(text: str) -> CronExpression:
    """A standard 5-field cron expression (minute hour day-of-month month day-of-week)
    or ScheduleError, including for one that can never fire (``0 0 30 2 *``)."""
    fields = text.split()
    if len(fields) != len(_FIELDS):
        raise _cron_error(text, f"expected 5 fields (minute hour day-of-month month "
                                f"day-of-week), got {len(fields)}")
    minutes, hours, days, months, weekdays = (
        _parse_field(text, spec, f) for spec, f in zip(_FIELDS, fields, strict=True))
    if 7 in weekdays:  # Sunday's second number
        weekdays = (weekdays - {7}) | {0}
    cron = CronExpression(
        text, tuple(sorted(minutes)), tuple(sorted(hours)), frozenset(days),
        frozenset(months), frozenset(weekdays), fields[2].startswith("*"),
        fields[4].startswith("*"))
    either = not (cron.days_star or cron.weekdays_star)  # a weekday alone can match
    if not either and not any(d <= _MONTH_DAYS[m] for m in months for d in days):
        raise _cron_error(text, "never fires: none of its months has such a day")
    return cron


# -- the schedule ----------------------------------------------------------------------


def _integer(headers: Mapping[str, str], name: str, low: int, high: int,
             why_low: str) -> int | None:
    """The header as an integer in low..high; None when absent; ScheduleError else."""
    raw = headers.get(name)
    if raw is None:
        return None
    if not _INTEGER.fullmatch(raw):
        raise ScheduleError(f"{name} {_shown(raw)} is not an integer")
    digits = raw.lstrip("+-").lstrip("0") or "0"
    magnitude = int(digits) if len(digits) <= MAX_DIGITS else high + 1  # out of range
    value = -magnitude if raw.startswith("-") else magnitude
    if value < low:
        raise ScheduleError(f"{name} {_shown(raw)} {why_low}")
    if value > high:
        raise ScheduleError(f"{name} {_shown(raw)} is more than {high}")
    return value


@dataclass(frozen=True, slots=True)
class Schedule:
    """When the copies of one scheduled message are due (module docstring for the
    rules). ``repeat`` copies follow the first, ``period_ms`` apart; with ``cron``,
    that sequence starts again at every firing."""

    delay_ms: int = 0
    period_ms: int = 0
    repeat: int = 0
    cron: CronExpression | None = None

    @property
    def offset_ms(self) -> int:
        """From the start (the SEND, or a cron firing) to the first copy: ActiveMQ's
        ``delay > 0 ? delay : period``."""
        return self.delay_ms if self.delay_ms > 0 else self.period_ms

    def first_due(self, now_ms: int) -> int:
        """When the first copy of a message sent at ``now_ms`` is due. ScheduleError
        when the cron does not fire within MAX_LOOKAHEAD_YEARS (the broker calls this
        at SEND time, so it becomes the SEND's ERROR like a parse error)."""
        if self.cron is None:
            return now_ms + self.offset_ms
        fire = self.cron.next_after(now_ms)
        if fire is None:
            raise ScheduleError(f"{CRON_HEADER} {_shown(self.cron.text)} does not fire "
                                f"within {MAX_LOOKAHEAD_YEARS} years")
        return fire + self.offset_ms

    def next_due(self, previous_due_ms: int, delivered_count: int) -> int | None:
        """When the copy after the one due at ``previous_due_ms`` is due, or None when
        that was the last. ``delivered_count`` counts the copies so far, that one
        included (1 after the first)."""
        if delivered_count < 1:
            raise ValueError(f"delivered_count {delivered_count} must be at least 1")
        per_round = self.repeat + 1
        if self.cron is None:
            return previous_due_ms + self.period_ms if delivered_count < per_round else None
        if delivered_count % per_round:  # this firing's sequence goes on
            return previous_due_ms + self.period_ms
        # The next firing whose first copy comes after the previous copy: one that
        # would start before this sequence is over is skipped (module docstring).
        fire = self.cron.next_after(previous_due_ms - self.offset_ms)
        return None if fire is None else fire + self.offset_ms


def parse_schedule(headers: Mapping[str, str]) -> Schedule | None:
    """The SEND's schedule, None when it is not scheduled (no DELAY, PERIOD or
    non-empty CRON header, or it carries JOB_ID_HEADER); ScheduleError naming the
    header and why for a value the broker refuses."""
    cron_text = headers.get(CRON_HEADER, "")
    if JOB_ID_HEADER in headers or not (
            cron_text or DELAY_HEADER in headers or PERIOD_HEADER in headers):
        return None
    delay = _integer(headers, DELAY_HEADER, 0, MAX_INTERVAL_MS, "must not be negative")
    period = _integer(headers, PERIOD_HEADER, 1, MAX_INTERVAL_MS,
                      "must be positive (milliseconds between copies)")
    repeat = _integer(headers, REPEAT_HEADER, 0, MAX_REPEAT,
                      "must not be negative (ActiveMQ refuses it too since AMQ-7458)")
    return Schedule(delay or 0, period or 0, repeat or 0,
                    parse_cron(cron_text) if cron_text else None)


def next_occurrence(schedule: Schedule, previous_due_ms: int, delivered_count: int,
                    now_ms: int) -> int | None:
    """``Schedule.next_due`` as a broker applies it at ``now_ms``: a cron firing whose
    sequence would already have started before ``now_ms`` (nobody was master then: an
    outage longer than the cron's interval) is not made up; the schedule resumes at the
    next firing instead, as cron itself does after downtime. The occurrence that was
    due is still delivered, once, late; copies within a sequence (the REPEATs) are all
    delivered, late ones at once."""
    due = schedule.next_due(previous_due_ms, delivered_count)
    cron = schedule.cron
    if (due is None or cron is None or due >= now_ms
            or delivered_count % (schedule.repeat + 1)):
        return due
    fire = cron.next_after(now_ms - schedule.offset_ms - 1)
    return None if fire is None else fire + schedule.offset_ms


@dataclass(frozen=True, slots=True)
class Plan:
    """What the store keeps of a scheduled message besides the message itself (JSON in
    ``amq_messages.schedule``): its schedule, the copies delivered so far, and the time
    to live each copy gets. ActiveMQ keeps a scheduled message's expiration relative
    (``SchedulerBroker.scheduledJob``): a copy lives as long after it is delivered as the
    message had left when it was sent; 0 = never expires."""

    schedule: Schedule
    fired: int = 0
    ttl_ms: int = 0

    def to_json(self) -> str:
        s = self.schedule
        return json.dumps({"delay": s.delay_ms, "period": s.period_ms, "repeat": s.repeat,
                           "cron": s.cron.text if s.cron is not None else None,
                           "fired": self.fired, "ttl": self.ttl_ms},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> Plan:
        """The plan a ``to_json`` wrote; ScheduleError when it cannot be read back."""
        try:
            d = json.loads(text or "")
            cron = d.get("cron")
            schedule = Schedule(int(d["delay"]), int(d["period"]), int(d["repeat"]),
                                parse_cron(cron) if cron else None)
            return cls(schedule, int(d["fired"]), int(d["ttl"]))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ScheduleError(f"unreadable schedule {_shown(str(text))}: {e}") from None
