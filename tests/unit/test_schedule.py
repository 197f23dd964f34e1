"""ActiveMQ scheduled-delivery headers (amqlite.broker.schedule), without a broker."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from itertools import pairwise

import pytest

from amqlite.broker.schedule import (
    CRON_HEADER,
    DELAY_HEADER,
    JOB_ID_HEADER,
    MAX_INTERVAL_MS,
    MAX_REPEAT,
    PERIOD_HEADER,
    REPEAT_HEADER,
    CronExpression,
    Schedule,
    ScheduleError,
    parse_cron,
    parse_schedule,
)

SECOND = 1000


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0,
       second: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()
               * 1000)


def firings(cron: str, after: int, count: int) -> list[int | None]:
    expression = parse_cron(cron)
    out: list[int | None] = []
    t: int | None = after
    for _ in range(count):
        assert t is not None
        t = expression.next_after(t)
        out.append(t)
        if t is None:
            break
    return out


def sequence(schedule: Schedule, now: int, limit: int = 50) -> list[int]:
    """Every due time, first to last (at most ``limit``)."""
    due: int | None = schedule.first_due(now)
    out: list[int] = []
    while due is not None and len(out) < limit:
        out.append(due)
        due = schedule.next_due(due, len(out))
    return out


# -- cron syntax ------------------------------------------------------------------------


def test_fields_lists_ranges_steps_and_names() -> None:
    c = parse_cron("*/15 9-17 1,15 JAN-MAR,dec Mon-FRI")
    assert c.minutes == (0, 15, 30, 45)
    assert c.hours == tuple(range(9, 18))
    assert c.days == {1, 15}
    assert c.months == {1, 2, 3, 12}
    assert c.weekdays == {1, 2, 3, 4, 5}
    assert not c.days_star and not c.weekdays_star


@pytest.mark.parametrize("field, minutes", [
    ("1-10/3", (1, 4, 7, 10)),       # counted from the range's start (ActiveMQ: 3,6,9)
    ("*/20", (0, 20, 40)),
    ("5,*/30", (0, 5, 30)),
    ("59", (59,)),
    ("07", (7,)),
    ("0-59/60", (0,)),
])
def test_minute_field(field: str, minutes: tuple[int, ...]) -> None:
    assert parse_cron(f"{field} * * * *").minutes == minutes


@pytest.mark.parametrize("field, weekdays", [
    ("7", {0}), ("0", {0}), ("SUN", {0}), ("sat", {6}), ("5-7", {5, 6, 0}),
    ("*", set(range(7))), ("*/2", {0, 2, 4, 6}), ("MON,WED-FRI", {1, 3, 4, 5}),
])
def test_weekday_field_sunday_is_0_and_7(field: str, weekdays: set[int]) -> None:
    assert parse_cron(f"0 0 * * {field}").weekdays == weekdays


@pytest.mark.parametrize("cron, words", [
    ("* * * *", "expected 5 fields"),
    ("* * * * * *", "expected 5 fields"),
    ("", "expected 5 fields"),
    ("@hourly", "expected 5 fields"),
    ("60 * * * *", "minute '60' is out of range 0-59"),
    ("* 24 * * *", "hour '24' is out of range 0-23"),
    ("* * 0 * *", "day of month '0' is out of range 1-31"),
    ("* * 32 * *", "out of range 1-31"),
    ("* * * 13 *", "month '13' is out of range 1-12"),
    ("* * * * 8", "day of week '8' is out of range 0-7"),
    ("-1 * * * *", "is not a number"),        # ActiveMQ's ScheduledValuesTest case
    ("* * * FOO *", "month 'FOO' is not a number or a name like JAN"),
    ("* * * * MONDAY", "is not a number or a name like SUN"),
    ("* * * JAN/2 *", "a step needs '*' or a range"),
    ("5/10 * * * *", "a step needs '*' or a range"),
    ("*/0 * * * *", "step '0' must be a number from 1 to 60"),
    ("*/61 * * * *", "from 1 to 60"),
    ("1-5/x * * * *", "step 'x'"),
    ("10-5 * * * *", "runs backwards"),
    ("FRI-MON * * * *", "is not a number"),   # names belong to their own field
    ("1,,2 * * * *", "empty list element"),
    ("1, * * * *", "empty list element"),
    ("\u0661 * * * *", "is not a number"),     # ARABIC-INDIC DIGIT ONE
    ("0 0 30 2 *", "never fires"),
    ("0 0 31 4,6,9,11 *", "never fires"),
    ("0 0 31 2 */2", "never fires"),          # '*' weekdays: both must match
])
def test_refused_cron_says_why(cron: str, words: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(words)) as e:
        parse_cron(cron)
    assert str(e.value).startswith(f"{CRON_HEADER} ")


def test_a_day_some_month_has_or_a_weekday_is_not_never() -> None:
    parse_cron("0 0 29 2 *")           # leap years
    parse_cron("0 0 30 2 1")           # both restricted: Mondays of February fire
    parse_cron("0 0 31 1-12/2 *")


# -- cron firing times (UTC) ------------------------------------------------------------


def test_next_firing_is_strictly_after_and_on_the_minute() -> None:
    assert firings("*/15 * * * *", ms(2024, 1, 1, 10, 7, 30), 3) == [
        ms(2024, 1, 1, 10, 15), ms(2024, 1, 1, 10, 30), ms(2024, 1, 1, 10, 45)]
    assert firings("* * * * *", ms(2024, 1, 1, 10, 0), 1) == [ms(2024, 1, 1, 10, 1)]
    assert firings("0 * * * *", ms(2024, 1, 1, 10, 0) - 1, 1) == [ms(2024, 1, 1, 10, 0)]


def test_rollovers_hour_day_month_year() -> None:
    assert firings("5 3 * * *", ms(2024, 1, 1, 3, 6), 1) == [ms(2024, 1, 2, 3, 5)]
    assert firings("0 0 1 * *", ms(2024, 1, 31, 12), 1) == [ms(2024, 2, 1)]
    assert firings("59 23 31 12 *", ms(2024, 12, 31, 23, 59), 1) == [
        ms(2025, 12, 31, 23, 59)]
    assert firings("0 0 1 1 *", ms(2024, 12, 31, 23, 59, 59), 1) == [ms(2025, 1, 1)]
    assert firings("30 10-11 * * *", ms(2024, 5, 5, 10, 45), 2) == [
        ms(2024, 5, 5, 11, 30), ms(2024, 5, 6, 10, 30)]


def test_february_29() -> None:
    assert firings("0 12 29 2 *", ms(2023, 3, 1), 2) == [
        ms(2024, 2, 29, 12), ms(2028, 2, 29, 12)]
    # 2100 is not a leap year: the longest gap, 8 years, is inside the look-ahead
    assert firings("0 12 29 2 *", ms(2096, 3, 1), 1) == [ms(2104, 2, 29, 12)]
    assert firings("0 0 * 2 *", ms(2023, 2, 28, 1), 1) == [ms(2024, 2, 1)]
    assert firings("0 0 * 2 *", ms(2024, 2, 28, 1), 1) == [ms(2024, 2, 29)]


def test_day_of_month_or_day_of_week_when_both_are_restricted() -> None:
    # Fridays and the 13th (cron's rule; Saturday 2024-01-13 fires for its date)
    assert firings("0 0 13 * 5", ms(2024, 1, 1), 4) == [
        ms(2024, 1, 5), ms(2024, 1, 12), ms(2024, 1, 13), ms(2024, 1, 19)]
    assert firings("30 4 1,15 * MON", ms(2024, 4, 1, 5), 3) == [
        ms(2024, 4, 8, 4, 30), ms(2024, 4, 15, 4, 30), ms(2024, 4, 22, 4, 30)]


def test_both_must_match_when_one_starts_with_a_star() -> None:
    # odd days of the month that are Fridays (Vixie: '*/2' is a star field)
    assert firings("0 0 */2 * FRI", ms(2024, 1, 1), 3) == [
        ms(2024, 1, 5), ms(2024, 1, 19), ms(2024, 2, 9)]
    assert firings("0 0 13 * */7", ms(2024, 1, 1), 1) == [ms(2024, 10, 13)]  # a Sunday
    assert firings("0 0 13 * *", ms(2024, 1, 1), 2) == [ms(2024, 1, 13), ms(2024, 2, 13)]
    assert firings("0 9 * * MON-FRI", ms(2024, 6, 7, 9), 2) == [
        ms(2024, 6, 10, 9), ms(2024, 6, 11, 9)]


def test_what_does_not_fire_within_the_look_ahead_ends() -> None:
    # February 29th on a Sunday: 2032, then 2060 (beyond MAX_LOOKAHEAD_YEARS)
    assert firings("0 0 29 2 */7", ms(2024, 3, 1), 2) == [ms(2032, 2, 29), None]
    with pytest.raises(ScheduleError, match="does not fire within 8 years"):
        Schedule(cron=parse_cron("0 0 29 2 */7")).first_due(ms(2032, 3, 1))
    assert Schedule(cron=parse_cron("0 0 29 2 */7")).next_due(ms(2032, 2, 29), 1) is None
    # and past what a datetime can hold: no firing rather than an OverflowError
    assert parse_cron("* * * * *").next_after(10**17) is None


# -- parsing the headers ----------------------------------------------------------------


@pytest.mark.parametrize("headers", [
    {},
    {"persistent": "true"},
    {REPEAT_HEADER: "5"},                       # REPEAT alone schedules nothing
    {REPEAT_HEADER: "not even a number"},       # ...and is not looked at
    {CRON_HEADER: ""},                          # an empty cron is no cron
    {JOB_ID_HEADER: "ID:x-1", DELAY_HEADER: "1000"},  # a delivered copy, forwarded
])
def test_not_scheduled(headers: dict[str, str]) -> None:
    assert parse_schedule(headers) is None


def test_parsed_values() -> None:
    assert parse_schedule({DELAY_HEADER: "60000"}) == Schedule(delay_ms=60_000)
    assert parse_schedule({DELAY_HEADER: "+0030", PERIOD_HEADER: "10000",
                           REPEAT_HEADER: "9"}) == Schedule(30, 10_000, 9)
    s = parse_schedule({CRON_HEADER: "0 * * * *", REPEAT_HEADER: "2",
                        PERIOD_HEADER: "1000"})
    assert s is not None and isinstance(s.cron, CronExpression)
    assert (s.delay_ms, s.period_ms, s.repeat, s.cron.text) == (0, 1000, 2, "0 * * * *")
    assert parse_schedule({DELAY_HEADER: str(MAX_INTERVAL_MS),
                           REPEAT_HEADER: str(MAX_REPEAT)}) is not None
    assert hash(s) == hash(parse_schedule({CRON_HEADER: "0 * * * *", REPEAT_HEADER: "2",
                                           PERIOD_HEADER: "1000"}))


@pytest.mark.parametrize("headers, words", [
    ({DELAY_HEADER: "-1"}, "AMQ_SCHEDULED_DELAY '-1' must not be negative"),
    ({DELAY_HEADER: "1.5"}, "AMQ_SCHEDULED_DELAY '1.5' is not an integer"),
    ({DELAY_HEADER: ""}, "AMQ_SCHEDULED_DELAY '' is not an integer"),
    ({DELAY_HEADER: " 5"}, "is not an integer"),
    ({DELAY_HEADER: "0x10"}, "is not an integer"),
    ({DELAY_HEADER: "\u0665"}, "is not an integer"),  # ARABIC-INDIC DIGIT FIVE
    ({DELAY_HEADER: str(MAX_INTERVAL_MS + 1)}, f"is more than {MAX_INTERVAL_MS}"),
    ({DELAY_HEADER: "9" * 5000}, "is more than"),
    ({DELAY_HEADER: "-" + "9" * 5000}, "must not be negative"),
    ({PERIOD_HEADER: "0"}, "AMQ_SCHEDULED_PERIOD '0' must be positive"),
    ({PERIOD_HEADER: "-1000"}, "AMQ_SCHEDULED_PERIOD '-1000' must be positive"),
    ({DELAY_HEADER: "1", REPEAT_HEADER: "-1"},
     "AMQ_SCHEDULED_REPEAT '-1' must not be negative"),
    ({DELAY_HEADER: "1", REPEAT_HEADER: "1001"}, "AMQ_SCHEDULED_REPEAT '1001' is more "
                                                 "than 1000"),
    ({DELAY_HEADER: "1", REPEAT_HEADER: "x"}, "AMQ_SCHEDULED_REPEAT 'x' is not an integer"),
    ({CRON_HEADER: "0 0 30 2 *"}, "never fires"),
    ({CRON_HEADER: "every hour"}, "AMQ_SCHEDULED_CRON 'every hour': expected 5 fields"),
    ({CRON_HEADER: "   ", DELAY_HEADER: "5"}, "expected 5 fields"),
])
def test_refused_headers_name_the_header_and_why(headers: dict[str, str],
                                                 words: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(words)) as e:
        parse_schedule(headers)
    assert isinstance(e.value, ValueError)


def test_a_long_bad_value_is_quoted_short() -> None:
    with pytest.raises(ScheduleError) as e:
        parse_schedule({DELAY_HEADER: "x" * 10_000})
    assert len(str(e.value)) < 120 and "..." in str(e.value)


# -- due times ----------------------------------------------------------------------------

NOW = ms(2024, 5, 1, 12, 0, 20)


def test_delay_alone_is_one_copy() -> None:
    assert sequence(Schedule(delay_ms=60 * SECOND), NOW) == [NOW + 60 * SECOND]
    assert sequence(Schedule(), NOW) == [NOW]


def test_activemq_documentation_example_delay_period_repeat() -> None:
    """Wait 30 s, then ten copies 10 s apart (ActiveMQ's docs: repeat = 9)."""
    schedule = parse_schedule({DELAY_HEADER: "30000", PERIOD_HEADER: "10000",
                               REPEAT_HEADER: "9"})
    assert schedule is not None
    assert sequence(schedule, NOW) == [NOW + (30 + 10 * i) * SECOND for i in range(10)]


def test_without_a_delay_the_first_copy_waits_a_period() -> None:
    """ActiveMQ's JobSchedulerImpl: time += delay > 0 ? delay : period."""
    expected = [NOW + 5 * SECOND * i for i in (1, 2, 3)]
    assert sequence(Schedule(period_ms=5 * SECOND, repeat=2), NOW) == expected
    assert sequence(Schedule(delay_ms=0, period_ms=5 * SECOND, repeat=2), NOW) == expected
    assert sequence(Schedule(period_ms=5 * SECOND), NOW) == [NOW + 5 * SECOND]


def test_repeat_without_a_period_delivers_together() -> None:
    assert sequence(Schedule(delay_ms=SECOND, repeat=3), NOW) == [NOW + SECOND] * 4


def test_next_due_counts_and_stops() -> None:
    s = Schedule(period_ms=SECOND, repeat=1)
    assert s.next_due(NOW, 1) == NOW + SECOND
    assert s.next_due(NOW, 2) is None
    assert s.next_due(NOW, 7) is None
    with pytest.raises(ValueError):
        s.next_due(NOW, 0)


def test_cron_alone_is_one_copy_per_firing() -> None:
    s = parse_schedule({CRON_HEADER: "0 * * * *"})
    assert s is not None
    assert sequence(s, NOW, limit=3) == [ms(2024, 5, 1, 13), ms(2024, 5, 1, 14),
                                         ms(2024, 5, 1, 15)]


def test_cron_with_delay_period_repeat_runs_the_sequence_at_every_firing() -> None:
    """ActiveMQ's docs: ten copies a second apart, every hour."""
    s = parse_schedule({CRON_HEADER: "0 * * * *", DELAY_HEADER: "1000",
                        PERIOD_HEADER: "1000", REPEAT_HEADER: "9"})
    assert s is not None
    got = sequence(s, NOW, limit=20)
    assert got == ([ms(2024, 5, 1, 13) + i * SECOND for i in range(1, 11)]
                   + [ms(2024, 5, 1, 14) + i * SECOND for i in range(1, 11)])


def test_cron_sequence_without_delay_starts_a_period_after_the_firing() -> None:
    s = Schedule(period_ms=10 * SECOND, repeat=1, cron=parse_cron("30 12 * * *"))
    assert sequence(s, NOW, limit=4) == [
        ms(2024, 5, 1, 12, 30, 10), ms(2024, 5, 1, 12, 30, 20),
        ms(2024, 5, 2, 12, 30, 10), ms(2024, 5, 2, 12, 30, 20)]


def test_a_firing_before_the_sequence_is_over_is_skipped() -> None:
    """Every minute, four copies 30 s apart (90 s of copies): one sequence per message,
    so the firing a minute in is skipped, the one two minutes in starts the next."""
    s = Schedule(period_ms=30 * SECOND, repeat=3, cron=parse_cron("* * * * *"))
    start = ms(2024, 5, 1, 12, 1)
    assert sequence(s, NOW, limit=8) == [
        start + 30 * SECOND, start + 60 * SECOND, start + 90 * SECOND,
        start + 120 * SECOND,
        start + 150 * SECOND, start + 180 * SECOND, start + 210 * SECOND,
        start + 240 * SECOND]
    got = sequence(s, NOW, limit=40)
    assert all(b > a for a, b in pairwise(got))


def test_the_longest_schedule_stays_inside_a_bigint() -> None:
    s = Schedule(delay_ms=MAX_INTERVAL_MS, period_ms=MAX_INTERVAL_MS, repeat=MAX_REPEAT,
                 cron=parse_cron("0 0 1 1 *"))
    due = sequence(s, NOW, limit=MAX_REPEAT + 5)
    assert len(due) == MAX_REPEAT + 1  # no second firing: past year 9999
    assert due[-1] < 2**63 - 1
