"""Schedules: each due time queued once across processes, no drift, one catch-up, no
stacking, archiving, and the arithmetic behind them as properties."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from axa_queue import JobState, NewJob, Queue, Schedule, ScheduleError, sql
from axa_queue.retries import MAX_BACKOFF, MAX_ERROR_BYTES, backoff, cut_error
from axa_queue.schedules import next_due
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
    first = utcnow()
    queues = [await make_queue(), await make_queue()]
    for queue in queues:
        queue.schedule(Schedule.every("tick", 1, NewJob("Tick"), first_at=first))
    queued = 0
    deadline = time.monotonic() + 3.2
    while time.monotonic() < deadline:
        results = await asyncio.gather(*(q.tick_schedules() for q in queues for _ in range(2)))
        queued += sum(results)
        # Finish whatever was queued, as a worker would, so no due time is skipped.
        admin.execute("UPDATE axa_queue SET status = 'completed' WHERE status = 'queued'")
    jobs = jobs_of(admin, "Tick")
    due_times = assert_once_per_due_time(jobs, first, schedule_row(admin, "tick")[0], SECOND)
    assert len(jobs) == queued == due_times
    assert due_times >= 3


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
    # A due time is skipped only while the last job is unfinished, which is rare here.
    assert due_times - 1 <= len(jobs) <= due_times
    assert {status for _, _, status in jobs} == {"completed"}


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
