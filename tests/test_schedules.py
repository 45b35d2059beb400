"""Schedules: each due time queued once across processes, no drift, one catch-up, no
stacking, archiving, and the arithmetic behind them as properties."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import uuid4
from zoneinfo import ZoneInfo

import psycopg
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from axa_queue import JobState, NewJob, Queue, Schedule, ScheduleError, sql
from axa_queue.handlers.retries import MAX_BACKOFF, MAX_ERROR_BYTES, backoff, cut_error
from axa_queue.schedules.cron import next_after
from axa_queue.schedules.schedule import Due, next_due, tick_one
from conftest import eventually, later, running

SECOND = timedelta(seconds=1)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def schedule_row(conn: psycopg.Connection[Any], name: str) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT due_at, last_job, archived_at FROM axa_schedule WHERE name = %s", (name,)
    ).fetchone()
    assert row is not None, f"no schedule {name}"
    return row


def jobs_of(conn: psycopg.Connection[Any], name: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, created_at, status FROM axa_queue WHERE name = %s ORDER BY created_at",
        (name,),
    ).fetchall()


def assert_once_per_due_time(
    jobs: list[tuple[Any, ...]], first: datetime, due_at: datetime, interval: timedelta
) -> int:
    """Each job's due time is the one its creation falls after: never two for one."""
    assert (due_at - first) % interval == timedelta(0), "due_at moved by whole intervals"
    windows = [(created - first) // interval for _, created, _ in jobs]
    assert all(w >= 0 for w in windows), "no job before the first due time"
    assert len(set(windows)) == len(windows), f"two jobs for one due time: {windows}"
    return (due_at - first) // interval


async def test_each_due_time_is_queued_once_by_two_queues_ticking_together(
    make_queue, admin
) -> None:
    first = datetime(2030, 1, 1, tzinfo=timezone.utc)
    queues = [await make_queue(), await make_queue()]
    for queue in queues:
        queue.schedule(Schedule.every("tick", 1, NewJob("Tick"), first_at=first))
    for passed in range(6):  # the test clock: a quarter of a second past each due time
        now = first + passed * SECOND + SECOND / 4
        ticks = (q.tick_schedules(now=now) for q in queues for _ in range(2))
        assert sum(await asyncio.gather(*ticks)) == 1, f"due time {passed} queued once"
        assert schedule_row(admin, "tick")[0] == first + (passed + 1) * SECOND
        # Finish whatever was queued, as a worker would, so no due time is skipped.
        admin.execute("UPDATE axa_queue SET status = 'completed' WHERE status = 'queued'")
    assert len(jobs_of(admin, "Tick")) == 6


WORKER = """
import asyncio, sys
from datetime import datetime
from axa_queue import NewJob, Queue, QueueOptions, Schedule

async def main():
    dsn, first, seconds = sys.argv[1], datetime.fromisoformat(sys.argv[2]), float(sys.argv[3])
    queue = Queue(dsn, QueueOptions(poll_interval=0.05, heartbeat_interval=0.1, stale_after=5))
    queue.handle("Tick", lambda args: None)
    queue.schedule(Schedule.every("tick", 1, NewJob("Tick"), first_at=first))
    await queue.open()
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    await queue.run(stop)
    await queue.close()

asyncio.run(main())
"""


def test_each_due_time_is_queued_once_by_two_worker_processes(dsn, admin) -> None:
    first = utcnow() + timedelta(seconds=0.8)
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER, dsn, first.isoformat(), "4"])
        for _ in range(2)
    ]
    assert [worker.wait(60) for worker in workers] == [0, 0]
    jobs = jobs_of(admin, "Tick")
    due_times = assert_once_per_due_time(jobs, first, schedule_row(admin, "tick")[0], SECOND)
    assert due_times >= 2
    # Never two jobs for one due time; a due time is skipped while the last job is
    # unfinished (no stacking), which how loaded the machine is decides: not counted.
    assert 2 <= len(jobs) <= due_times
    # Every job ran, but the newest may have been queued by the last process's tick as
    # it stopped (its loops no longer claim; in a deployment another process runs it).
    assert {status for _, _, status in jobs[:-1]} == {"completed"}
    assert jobs[-1][2] in ("completed", "queued")


async def test_the_next_due_time_counts_from_the_last_due_time_not_from_the_tick(
    make_queue, admin
) -> None:
    queue = await make_queue()
    first = utcnow() - timedelta(seconds=3.3)
    queue.schedule(Schedule.every("s", 10, NewJob("J"), first_at=first))
    assert await queue.tick_schedules() == 1
    assert schedule_row(admin, "s")[0] == first + timedelta(seconds=10)


async def test_missed_due_times_are_queued_once_and_the_schedule_keeps_its_place(
    make_queue, admin
) -> None:
    queue = await make_queue()
    first = utcnow() + timedelta(seconds=30)
    queue.schedule(Schedule.every("s", 60, NewJob("J"), first_at=first))
    assert await queue.tick_schedules() == 0, "not due yet"
    admin.execute("UPDATE axa_schedule SET due_at = due_at - interval '100 days'")

    assert await queue.tick_schedules() == 1
    due_at = schedule_row(admin, "s")[0]
    assert due_at == first, "the next whole interval after now, on the first one's grid"
    assert utcnow() < due_at <= utcnow() + timedelta(seconds=60)
    assert await queue.tick_schedules() == 0
    assert len(jobs_of(admin, "J")) == 1


async def test_a_schedule_ticks_on_the_clock_it_is_given_when_a_test_moves_it(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.every("s", 60, NewJob("J")))
    assert await queue.tick_schedules() == 1
    assert await queue.tick_schedules() == 0, "not due again yet"
    admin.execute("UPDATE axa_queue SET status = 'completed' WHERE name = 'J'")
    assert await queue.tick_schedules(now=later(admin, 59)) == 0
    assert await queue.tick_schedules(now=later(admin, 61)) == 1
    assert len(jobs_of(admin, "J")) == 2
    due_at = schedule_row(admin, "s")[0]
    assert utcnow() + timedelta(seconds=61) < due_at <= utcnow() + timedelta(seconds=121)


async def test_a_due_time_is_skipped_while_the_last_job_is_queued_or_running(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.every("s", 60, NewJob("J"), first_at=utcnow() - SECOND))
    assert await queue.tick_schedules() == 1
    ((last, _, _),) = jobs_of(admin, "J")

    def due_again() -> None:
        admin.execute("UPDATE axa_schedule SET due_at = now() - interval '1 second'")

    due_again()
    assert await queue.tick_schedules() == 0, "skipped: the last job is queued"
    due_at, last_job, _ = schedule_row(admin, "s")
    assert last_job == last and due_at > utcnow(), "the skipped time is passed over"

    admin.execute(
        "UPDATE axa_queue SET status = 'running', started_at = now(), attempts = 1 WHERE id = %s",
        (last,),
    )
    due_again()
    assert await queue.tick_schedules() == 0, "skipped: the last job is running"

    admin.execute("UPDATE axa_queue SET status = 'completed' WHERE id = %s", (last,))
    due_again()
    assert await queue.tick_schedules() == 1
    assert schedule_row(admin, "s")[1] != last
    assert len(jobs_of(admin, "J")) == 2


@pytest.mark.parametrize(
    ("name", "interval"),
    [
        ("", 60),
        ("x" * 201, 60),
        ("ok", 0.999),
        ("ok", timedelta(milliseconds=500)),
        ("ok", 0),
        ("ok", -5),
        ("ok", "1 hour"),
    ],
)
def test_a_bad_schedule_name_or_interval_is_refused_when_made(name, interval) -> None:
    with pytest.raises(ScheduleError):
        Schedule.every(name, interval, NewJob("J"))


def test_a_schedule_of_200_characters_and_one_second_is_accepted_and_ignores_a_delay() -> None:
    schedule = Schedule.every("x" * 200, 1, NewJob("J", run_in=60))
    assert schedule.interval == SECOND and schedule.job.run_in is None


def test_a_schedule_with_a_naive_first_time_is_refused() -> None:
    with pytest.raises(ScheduleError, match="first_at"):
        Schedule.every("s", 60, NewJob("J"), first_at=datetime(2030, 1, 1, 2, 0))


def test_the_same_schedule_name_twice_is_refused_by_the_queue() -> None:
    queue = Queue()
    queue.schedule(Schedule.every("nightly", 60, NewJob("J")))
    with pytest.raises(ScheduleError, match="nightly"):
        queue.schedule(Schedule.every("nightly", 3600, NewJob("Other")))


async def test_a_schedule_no_live_process_has_is_archived_and_restored_by_one_that_has(
    make_queue, admin
) -> None:
    later = utcnow() + timedelta(hours=1)
    old = await make_queue()
    old.schedule(Schedule.every("old", 60, NewJob("J"), first_at=later))
    new = await make_queue(stale_after=2)
    new.schedule(Schedule.every("new", 60, NewJob("J"), first_at=later))
    await old.tick_schedules()
    await new.tick_schedules()

    admin.execute("UPDATE axa_schedule SET seen_at = now() - interval '1 hour'")
    assert await new.archive_schedules() == 1
    assert await new.archive_schedules() == 0
    listed = {s.name: s for s in await new.schedules()}
    assert listed["old"].archived_at is not None and listed["new"].archived_at is None

    admin.execute("UPDATE axa_schedule SET due_at = now() - interval '1 second'")
    assert await new.tick_schedules() == 1, "only `new` queues"

    restarted = await make_queue()
    restarted.schedule(Schedule.every("old", 60, NewJob("J"), first_at=later))
    assert await restarted.tick_schedules() == 1, "restored, and due"
    assert schedule_row(admin, "old")[2] is None


async def test_the_schedules_are_listed_with_their_last_jobs_state(make_queue, admin) -> None:
    queue = await make_queue()

    @queue.handler("Flaky")
    async def flaky(args: Any) -> None:
        raise RuntimeError("nope")

    first = utcnow() - SECOND
    queue.schedule(Schedule.every("flaky", 3600, flaky.job({}), first_at=first))
    assert await queue.schedules() == []
    await queue.tick_schedules()
    (info,) = await queue.schedules()
    assert (info.name, info.interval, info.due_at) == (
        "flaky",
        timedelta(hours=1),
        first + timedelta(hours=1),
    )
    assert info.last_state is JobState.QUEUED and info.last_error is None
    assert info.archived_at is None and info.last_job is not None

    async def failed() -> bool:
        (info,) = await queue.schedules()
        return info.last_state is JobState.FAILED

    async with running(queue):
        await eventually(failed)
    (info,) = await queue.schedules()
    assert info.last_error == "RuntimeError: nope"


# --- the arithmetic, as properties ----------------------------------------------------

moments = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc)
)
intervals = st.integers(1_000, 400 * 86_400_000).map(lambda ms: timedelta(milliseconds=ms))
offsets = st.timedeltas(min_value=timedelta(days=-3650), max_value=timedelta(days=3650))


@given(due_at=moments, interval=intervals, offset=offsets)
def test_the_next_due_time_is_the_first_whole_interval_after_now(
    due_at: datetime, interval: timedelta, offset: timedelta
) -> None:
    now = due_at + offset
    result = next_due(due_at, interval, now)
    assert (result - due_at) % interval == timedelta(0)
    # Strictly after now, and at most one interval on (exactly one when now is a due time).
    assert now < result <= now + interval


@st.composite
def due_times(draw: st.DrawFn) -> tuple[datetime, timedelta, int]:
    """A first due time, an interval, and how many intervals on (within ten years)."""
    interval = draw(intervals)
    return draw(moments), interval, draw(st.integers(0, timedelta(days=3650) // interval))


@example((datetime(2000, 1, 1, tzinfo=timezone.utc), timedelta(milliseconds=32295), 13))
@given(due_times())
def test_a_tick_exactly_on_a_due_time_moves_a_whole_interval_on(
    drawn: tuple[datetime, timedelta, int],
) -> None:
    due_at, interval, k = drawn
    now = due_at + interval * k
    assert next_due(due_at, interval, now) == now + interval


async def test_the_advance_statement_moves_past_a_due_time_the_tick_lands_on_exactly(
    make_queue, admin
) -> None:
    await make_queue()
    admin.execute("INSERT INTO axa_schedule (name, due_at, interval_ms) VALUES ('s', now(), 32295)")
    with admin.transaction():  # now() stays put within it
        # 13 intervals of 32.295 s: 419.835 / 32.295 is 12.999999999999998 in float8.
        admin.execute("UPDATE axa_schedule SET due_at = now() - 13 * interval '32.295 seconds'")
        admin.execute(
            sql.SCHEDULE_TICK,
            {
                "name": "s",
                "interval": 32.295,
                "id": uuid4(),
                "job": "Tick",
                "args": "{}",
                "max_attempts": None,
                "priority": 0,
                "timeout_ms": None,
                "now": None,
            },
        )
        row = admin.execute("SELECT due_at - now() FROM axa_schedule").fetchone()
    assert row == (timedelta(seconds=32.295),)


@given(
    base=st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=2)),
    attempts=st.integers(1, 16),
)
def test_each_retry_waits_twice_as_long_up_to_an_hour(base: timedelta, attempts: int) -> None:
    assert backoff(base, 1) == min(base, MAX_BACKOFF)
    assert backoff(base, attempts + 1) == min(2 * backoff(base, attempts), MAX_BACKOFF)


@given(
    base=st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=2)),
    attempts=st.integers(-10, 100_000),
)
def test_a_wait_never_shrinks_with_attempts_nor_passes_an_hour(
    base: timedelta, attempts: int
) -> None:
    assert timedelta(0) <= backoff(base, attempts) <= MAX_BACKOFF
    assert backoff(base, attempts) <= backoff(base, attempts + 1)


def test_thirty_seconds_of_backoff_doubles_to_the_hour() -> None:
    base = timedelta(seconds=30)
    waits = [backoff(base, n).total_seconds() for n in (1, 2, 3, 8, 1000)]
    assert waits == [30, 60, 120, 3600, 3600]


@given(
    st.text(
        alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
        max_size=1500,
    )
)
def test_an_error_text_is_cut_on_a_character_boundary_to_at_most_1024_bytes(text: str) -> None:
    # (Surrogates and NUL, which the database cannot store, become "?": tested apart.)
    kept = cut_error(text)
    data = kept.encode("utf-8")
    assert len(data) <= MAX_ERROR_BYTES
    assert text.startswith(kept)
    if len(text.encode("utf-8")) <= MAX_ERROR_BYTES:
        assert kept == text
    else:
        assert len(data) > MAX_ERROR_BYTES - 4, "no more than a character's bytes are lost"


def test_a_nul_or_a_lone_surrogate_in_an_error_becomes_a_question_mark() -> None:
    assert cut_error("a\x00b\udcffc") == "a?b?c"


def test_a_long_error_of_two_byte_characters_is_cut_between_them() -> None:
    kept = cut_error("é" * 1024)
    assert kept == "é" * 512


# --- cron schedules ---------------------------------------------------------------------

PARIS = ZoneInfo("Europe/Paris")


def at(text: str) -> datetime:
    """A UTC time written as ISO text: the test clock."""
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def finish_all(conn: psycopg.Connection[Any]) -> None:
    """Finish whatever was queued, as a worker would, so no due time is skipped."""
    conn.execute("UPDATE axa_queue SET status = 'completed' WHERE status = 'queued'")


async def test_a_cron_schedule_is_first_due_at_its_next_time_not_at_once(make_queue, admin) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.cron("nightly", "0 3 * * *", NewJob("Report"), tz="Europe/Paris"))
    assert await queue.tick_schedules(now=at("2030-06-01T12:00:00")) == 0
    # 03:00 in Paris in summer (CEST, UTC+2) is 01:00 UTC.
    assert schedule_row(admin, "nightly")[0] == at("2030-06-02T01:00:00")
    assert await queue.tick_schedules(now=at("2030-06-02T00:59:59")) == 0
    assert await queue.tick_schedules(now=at("2030-06-02T01:00:00")) == 1
    assert schedule_row(admin, "nightly")[0] == at("2030-06-03T01:00:00"), "no drift"
    (info,) = await queue.schedules()
    assert (info.expression, info.timezone, info.interval) == ("0 3 * * *", "Europe/Paris", None)
    assert info.due_at == at("2030-06-03T01:00:00")


async def test_missed_cron_times_are_queued_once_then_the_next_time_after_now(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.cron("quarter", "*/15 * * * *", NewJob("J")))
    assert await queue.tick_schedules(now=at("2030-01-01T00:01:00")) == 0
    # Every process was down for five hours: one job, then the next time after now.
    assert await queue.tick_schedules(now=at("2030-01-01T05:07:00")) == 1
    assert schedule_row(admin, "quarter")[0] == at("2030-01-01T05:15:00")
    finish_all(admin)
    assert await queue.tick_schedules(now=at("2030-01-01T05:14:59")) == 0
    assert await queue.tick_schedules(now=at("2030-01-01T05:15:00")) == 1
    assert len(jobs_of(admin, "J")) == 2


async def test_a_cron_due_time_is_skipped_while_the_last_job_is_queued_or_running(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.cron("hourly", "0 * * * *", NewJob("J")))
    await queue.tick_schedules(now=at("2030-01-01T00:30:00"))
    assert await queue.tick_schedules(now=at("2030-01-01T01:00:00")) == 1
    ((last, _, _),) = jobs_of(admin, "J")
    assert await queue.tick_schedules(now=at("2030-01-01T02:00:00")) == 0, "the last is queued"
    due_at, last_job, _ = schedule_row(admin, "hourly")
    assert (due_at, last_job) == (at("2030-01-01T03:00:00"), last), "the time is passed over"
    admin.execute(
        "UPDATE axa_queue SET status = 'running', started_at = now(), attempts = 1 WHERE id = %s",
        (last,),
    )
    assert await queue.tick_schedules(now=at("2030-01-01T03:00:00")) == 0, "the last is running"
    admin.execute("UPDATE axa_queue SET status = 'completed' WHERE id = %s", (last,))
    assert await queue.tick_schedules(now=at("2030-01-01T04:00:00")) == 1
    assert len(jobs_of(admin, "J")) == 2


async def test_a_cron_tick_that_read_a_due_time_another_process_moved_on_queues_nothing(
    make_queue, admin
) -> None:
    queue = await make_queue()
    nightly = Schedule.cron("nightly", "0 3 * * *", NewJob("J"))
    queue.schedule(nightly)
    await queue.tick_schedules(now=at("2030-01-01T00:00:00"))
    due_at = at("2030-01-01T03:00:00")
    read = Due(due_at=due_at, now=at("2030-01-01T03:00:01"))
    async with queue.connection() as conn:
        assert await tick_one(conn, nightly, read.now, read) is not None
        # A second process that read the same due time, before the first moved it on.
        assert await tick_one(conn, nightly, read.now, read) is None
    assert len(jobs_of(admin, "J")) == 1
    assert schedule_row(admin, "nightly")[0] == at("2030-01-02T03:00:00")


async def test_a_time_in_the_skipped_hour_runs_once_at_the_first_minute_after_the_gap(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.cron("early", "30 2 * * *", NewJob("J"), tz="Europe/Paris"))
    # Paris, 29 March 2026: at 02:00 CET (01:00 UTC) the clocks go to 03:00 CEST.
    assert await queue.tick_schedules(now=at("2026-03-28T12:00:00")) == 0
    assert schedule_row(admin, "early")[0] == at("2026-03-29T01:00:00")
    assert at("2026-03-29T01:00:00").astimezone(PARIS).strftime("%H:%M %Z") == "03:00 CEST"
    assert await queue.tick_schedules(now=at("2026-03-29T00:59:59")) == 0
    assert await queue.tick_schedules(now=at("2026-03-29T01:00:00")) == 1
    finish_all(admin)
    for hour in ("01:30", "02:00", "12:00", "23:59"):
        assert await queue.tick_schedules(now=at(f"2026-03-29T{hour}:00")) == 0
    # The next night is back to 02:30 on the wall clock (CEST: 00:30 UTC).
    assert schedule_row(admin, "early")[0] == at("2026-03-30T00:30:00")
    assert len(jobs_of(admin, "J")) == 1


async def test_a_time_in_the_repeated_hour_runs_once_on_the_autumn_night(make_queue, admin) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.cron("early", "30 2 * * *", NewJob("J"), tz="Europe/Paris"))
    # Paris, 25 October 2026: at 03:00 CEST (01:00 UTC) the clocks go back to 02:00 CET,
    # so 02:30 is shown twice: 00:30 UTC and 01:30 UTC.
    assert await queue.tick_schedules(now=at("2026-10-24T12:00:00")) == 0
    assert schedule_row(admin, "early")[0] == at("2026-10-25T00:30:00"), "the first 02:30"
    assert await queue.tick_schedules(now=at("2026-10-25T00:30:00")) == 1
    finish_all(admin)
    assert await queue.tick_schedules(now=at("2026-10-25T01:30:00")) == 0, "not the second"
    assert schedule_row(admin, "early")[0] == at("2026-10-26T01:30:00"), "02:30 CET next"
    assert len(jobs_of(admin, "J")) == 1


async def test_a_catch_up_inside_the_repeated_hour_queues_once_and_not_the_second_showing(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.cron("early", "30 2 * * *", NewJob("J"), tz="Europe/Paris"))
    await queue.tick_schedules(now=at("2026-10-24T12:00:00"))
    # Down across the first 02:30; back at 02:10 CET, before the clock shows 02:30 again.
    assert await queue.tick_schedules(now=at("2026-10-25T01:10:00")) == 1
    finish_all(admin)
    assert schedule_row(admin, "early")[0] == at("2026-10-26T01:30:00")
    assert await queue.tick_schedules(now=at("2026-10-25T01:30:00")) == 0
    assert len(jobs_of(admin, "J")) == 1


async def test_an_hourly_cron_follows_real_time_across_the_autumn_night(make_queue, admin) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.cron("hourly", "30 * * * *", NewJob("J"), tz="Europe/Paris"))
    await queue.tick_schedules(now=at("2026-10-25T00:00:00"))
    for moment in ("2026-10-25T00:30:00", "2026-10-25T01:30:00", "2026-10-25T02:30:00"):
        assert await queue.tick_schedules(now=at(moment)) == 1, moment
        finish_all(admin)
    assert len(jobs_of(admin, "J")) == 3, "an hourly job runs every hour, 02:30 twice"


@pytest.mark.parametrize(
    ("expression", "field"),
    [
        ("61 3 * * *", "minute"),
        ("0 24 * * *", "hour"),
        ("0 3 32 * *", "day of month"),
        ("0 3 0 * *", "day of month"),
        ("0 3 * 13 *", "month"),
        ("0 3 * * 8", "day of week"),
        ("*/0 3 * * *", "minute"),
        ("0 3 * JANUARY *", "month"),
        ("0 5-3 * * *", "hour"),
    ],
)
def test_a_bad_cron_field_is_refused_when_made_and_named(expression: str, field: str) -> None:
    with pytest.raises(ScheduleError, match=f"has a bad {field} field"):
        Schedule.cron("nightly", expression, NewJob("J"))


@pytest.mark.parametrize("expression", ["0 3 * *", "0 0 3 * * *", "", "@daily"])
def test_a_cron_expression_that_is_not_five_fields_is_refused(expression: str) -> None:
    with pytest.raises(ScheduleError, match="give five: minute, hour, day of month"):
        Schedule.cron("nightly", expression, NewJob("J"))


def test_an_unknown_time_zone_is_refused_and_named() -> None:
    with pytest.raises(ScheduleError, match="unknown time zone 'Europe/Pariss'"):
        Schedule.cron("nightly", "0 3 * * *", NewJob("J"), tz="Europe/Pariss")
    with pytest.raises(ScheduleError, match="unknown time zone"):
        Schedule.cron("nightly", "0 3 * * *", NewJob("J"), tz="../../etc/passwd")


def test_a_cron_schedule_keeps_its_zones_name_and_its_expression_in_single_spaces() -> None:
    schedule = Schedule.cron("n", " 0  3 * * * ", NewJob("J", run_in=60), tz=PARIS)
    assert (schedule.expression, schedule.timezone) == ("0 3 * * *", "Europe/Paris")
    assert schedule.interval is None and schedule.job.run_in is None
    assert Schedule.cron("u", "0 3 * * *", NewJob("J")).timezone == "UTC"


def test_a_cron_schedule_with_an_interval_or_first_at_is_refused() -> None:
    with pytest.raises(ScheduleError, match="no interval or first_at"):
        Schedule("n", timedelta(hours=1), NewJob("J"), expression="0 3 * * *")


def test_the_package_imports_cronsim_only_once_a_cron_schedule_is_made() -> None:
    code = (
        "import sys, axa_queue\n"
        "assert 'cronsim' not in sys.modules\n"
        "axa_queue.Schedule.every('s', 60, axa_queue.NewJob('J'))\n"
        "assert 'cronsim' not in sys.modules\n"
        "axa_queue.Schedule.cron('c', '0 3 * * *', axa_queue.NewJob('J'))\n"
        "assert 'cronsim' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_cronsim_a_cron_schedule_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['cronsim'] = None\n"
        "import axa_queue\n"
        "try:\n"
        "    axa_queue.Schedule.cron('c', '0 3 * * *', axa_queue.NewJob('J'))\n"
        "except axa_queue.ScheduleError as error:\n"
        "    print(error)\n"
    )
    found = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert "pip install 'axa-queue[cron]'" in found.stdout


CRON_WORKER = """
import asyncio, sys
from datetime import datetime, timedelta
from axa_queue import NewJob, Queue, Schedule

async def main():
    dsn, start, steps = sys.argv[1], datetime.fromisoformat(sys.argv[2]), int(sys.argv[3])
    queue = Queue(dsn)
    queue.schedule(Schedule.cron("tick", "* * * * *", NewJob("Tick")))
    await queue.open()
    for step in range(steps):
        now = start + timedelta(seconds=7) * step
        await asyncio.gather(queue.tick_schedules(now=now), queue.tick_schedules(now=now))
        async with queue.connection() as conn:
            await conn.execute("UPDATE axa_queue SET status = 'completed' WHERE status = 'queued'")
    await queue.close()

asyncio.run(main())
"""

ADVANCES = """
CREATE TABLE advances (old_due TIMESTAMPTZ, new_due TIMESTAMPTZ, old_job UUID, new_job UUID);
CREATE FUNCTION record_advance() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.due_at IS DISTINCT FROM OLD.due_at THEN
        INSERT INTO advances VALUES (OLD.due_at, NEW.due_at, OLD.last_job, NEW.last_job);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER record_advance AFTER UPDATE ON axa_schedule
    FOR EACH ROW EXECUTE FUNCTION record_advance();
"""


def test_each_cron_due_time_is_queued_once_by_two_worker_processes(dsn, admin) -> None:
    asyncio.run(_setup(dsn))  # the tables, made before the processes race to make the row
    admin.execute(ADVANCES)
    start = at("2030-01-01T00:00:30")
    steps = 60  # seven minutes of the test clock, every process ticking twice per step
    workers = [
        subprocess.Popen([sys.executable, "-c", CRON_WORKER, dsn, start.isoformat(), str(steps)])
        for _ in range(2)
    ]
    assert [worker.wait(120) for worker in workers] == [0, 0]
    advances = admin.execute("SELECT * FROM advances ORDER BY old_due").fetchall()
    olds = [old for old, _, _, _ in advances]
    assert len(olds) == len(set(olds)), "a due time was moved on twice"
    assert all(new > old for old, new, _, _ in advances)
    assert [new for _, new, _, _ in advances[:-1]] == olds[1:], "one unbroken chain of times"
    assert olds[0] == at("2030-01-01T00:01:00")
    assert {old.second for old in olds} == {0}, "every due time is a minute of the expression"
    queued = [new_job for _, _, old_job, new_job in advances if new_job != old_job]
    jobs = jobs_of(admin, "Tick")
    assert sorted(str(j) for j in queued) == sorted(str(j) for j, _, _ in jobs)
    assert 1 <= len(jobs) <= 7


RUN_WORKER = """
import asyncio, sys
from datetime import datetime, timedelta
from axa_queue import NewJob, Queue, QueueOptions, Schedule

async def main():
    dsn, start, until = sys.argv[1], *map(datetime.fromisoformat, sys.argv[2:4])
    # Retention judges on the database's clock: keep the jobs the test clock dated 2020.
    queue = Queue(dsn, QueueOptions(poll_interval=0.02, retention=timedelta(days=36500)))
    queue.handle("Tick", lambda args: None)
    queue.schedule(Schedule.cron("tick", "* * * * *", NewJob("Tick")))
    queue.connector.clock = start  # the time every statement of the worker takes
    await queue.open()
    stop = asyncio.Event()

    async def clock() -> None:
        while queue.connector.clock < until:
            await asyncio.sleep(0.02)
            queue.connector.clock += timedelta(seconds=3)
        unfinished = "SELECT count(*) FROM axa_queue WHERE status IN ('queued', 'running')"
        while True:  # the clock stands still: no time falls due, the last jobs finish
            async with queue.connection() as conn:
                if (await (await conn.execute(unfinished)).fetchone())[0] == 0:
                    break
            await asyncio.sleep(0.02)
        stop.set()

    moving = asyncio.create_task(clock())
    await queue.run(stop)
    await moving
    await queue.close()

asyncio.run(main())
"""


def test_each_cron_due_time_is_queued_once_by_two_running_workers_on_test_clocks(
    dsn, admin
) -> None:
    asyncio.run(_setup(dsn))
    admin.execute(ADVANCES)
    # In the past: a claim takes jobs due by the database's own clock.
    start, until = at("2020-01-01T00:00:30"), at("2020-01-01T00:06:10")
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", RUN_WORKER, dsn, start.isoformat(), until.isoformat()]
        )
        for _ in range(2)
    ]
    assert [worker.wait(120) for worker in workers] == [0, 0]
    advances = admin.execute("SELECT * FROM advances ORDER BY old_due").fetchall()
    olds = [old for old, _, _, _ in advances]
    assert len(olds) == len(set(olds)), "a due time was moved on twice"
    assert [new for _, new, _, _ in advances[:-1]] == olds[1:], "one unbroken chain of times"
    assert olds[0] == at("2020-01-01T00:01:00") and {old.second for old in olds} == {0}
    queued = sorted(str(new) for _, _, old, new in advances if new != old)
    jobs = jobs_of(admin, "Tick")
    assert queued == sorted(str(j) for j, _, _ in jobs)
    assert 1 <= len(jobs) <= 6, "one a minute at most, a minute skipped while one is busy"
    assert {status for _, _, status in jobs} == {"completed"}


async def _setup(dsn: str) -> None:
    queue = Queue(dsn)
    await queue.open()
    await queue.close()


# --- cron arithmetic, as properties ----------------------------------------------------

zones = st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe"])
expressions = st.sampled_from(
    ["30 2 * * *", "0 3 * * *", "*/15 * * * *", "30 * * * *", "0 0 1 * *", "15 2 * * 0"]
)


@given(expression=expressions, zone=zones, after=moments)
def test_the_next_cron_time_is_later_and_the_same_from_anywhere_before_it(
    expression: str, zone: str, after: datetime
) -> None:
    found = next_after(expression, ZoneInfo(zone), after)
    assert found is not None and found > after
    halfway = after + (found - after) / 2
    assert next_after(expression, ZoneInfo(zone), halfway) == found, "no time in between"


@given(expression=st.sampled_from(["30 2 * * *", "0 3 * * *", "15 2 * * 0"]), zone=zones)
def test_a_wall_clock_cron_runs_once_per_matching_local_day_even_across_a_change(
    expression: str, zone: str
) -> None:
    moment = datetime(2026, 1, 1, tzinfo=timezone.utc)
    days: list[Any] = []
    for _ in range(120):
        found = next_after(expression, ZoneInfo(zone), moment)
        assert found is not None
        days.append(found.astimezone(ZoneInfo(zone)).date())
        moment = found
    assert len(days) == len(set(days)), "two runs on one local day"


async def test_a_due_time_python_cannot_hold_written_by_hand_stops_no_schedule(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.every("healthy", timedelta(minutes=5), NewJob("Healthy")))
    queue.schedule(Schedule.every("broken", timedelta(minutes=5), NewJob("Broken")))
    queue.schedule(Schedule.cron("nightly", "0 3 * * *", NewJob("Nightly")))
    await queue.tick_schedules(now=at("2030-01-01T00:00:00"))
    finish_all(admin)
    admin.execute("UPDATE axa_schedule SET due_at = '-infinity' WHERE name = 'broken'")
    admin.execute("UPDATE axa_schedule SET due_at = '0044-03-15 BC' WHERE name = 'nightly'")
    assert await queue.tick_schedules(now=at("2030-01-01T00:05:00")) == 3
    assert [len(jobs_of(admin, n)) for n in ("Healthy", "Broken", "Nightly")] == [2, 2, 1]
    # Each taken as due long ago: queued once, and its next due time one after now.
    assert schedule_row(admin, "broken")[0] == at("2030-01-01T00:10:00")
    assert schedule_row(admin, "nightly")[0] == at("2030-01-01T03:00:00")
