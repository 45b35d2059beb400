"""Schedules: a job queued every interval or at the times of a cron expression, each
due time exactly once.

Each due time becomes one ordinary job, so its retries, state, limit and recovery
are the queue's. A schedule's row in `axa_schedule` is locked (SKIP LOCKED) by the one
statement that queues its job and moves its due time on, so across any number of
processes each due time is queued once, and no transaction stays open between awaits.

- No drift: the next time is counted from when the last was due, not when it ran.
- Missed times run once: after every process was down, one job is queued, and the
  schedule keeps its place (still a whole number of intervals from the first).
- No stacking: when the last job is still queued or running at a due time, that time
  is skipped.
- The first time is `first_at`, or as soon as the row is made; it applies only when
  the row is made. Times are on the database's clock.

A cron schedule (`Schedule.cron`) keeps the same promises, but its next time cannot be
counted in SQL: the process reads the due time and the database's clock, works out the
next time after that clock in Python (`cron.next_after`), and its one statement
(`sql.CRON_TICK`) queues the job and moves the due time only from the value it read, to
the one it worked out. Its first time is the expression's first after the row is made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

import psycopg

from .. import sql
from ..db.calls import Call, by_name
from ..errors import OptionsError, ScheduleError
from ..jobs.model import (
    EARLIEST_RUN_AT,
    LATEST_RUN_AT,
    JobState,
    NewJob,
    check_name,
    moment,
    optional_moment,
)
from ..options import Duration, to_timedelta

__all__ = [
    "MAX_SCHEDULE_NAME",
    "SEEN_EVERY",
    "Schedule",
    "ScheduleInfo",
    "Ticker",
    "next_due",
    "schedules_call",
]

CRON_HINT = "pip install 'axa-queue[cron]'"
"""How to get what `Schedule.cron` needs (cronsim)."""

log = logging.getLogger("axa_queue.schedules")

MAX_SCHEDULE_NAME = 200
"""The longest schedule name, in characters (a job name's limit too)."""


@dataclass(frozen=True)
class Schedule:
    """A job queued every `interval`, or at the times of the cron expression `expression` in
    the zone `timezone`, under the stable name `name`.

    Make one with `Schedule.every` or `Schedule.cron`. A delay set on the job is
    ignored. Whichever way it is made, it is checked as those say.
    """

    name: str
    interval: timedelta | None
    """None for a cron schedule."""
    job: NewJob
    first_at: datetime | None = None
    expression: str | None = None
    """The cron expression (five fields, single spaces), or None for an interval."""
    timezone: str | None = None
    """The IANA zone the expression is read in (a cron schedule's; "UTC" by default)."""

    def __post_init__(self) -> None:
        try:
            check_name(self.name, "schedule", MAX_SCHEDULE_NAME)
        except OptionsError as error:
            raise ScheduleError(str(error)) from None
        name = self.name
        if self.expression is not None or self.timezone is not None:
            self._check_cron()
            return
        if self.interval is None:
            raise ScheduleError(
                f"the schedule {name!r} needs an interval (Schedule.every) or a cron "
                "expression (Schedule.cron)"
            )
        try:
            length = to_timedelta(self.interval, "interval")
        except OptionsError as error:
            raise ScheduleError(f"schedule {name!r}: {error}") from None
        if length < timedelta(seconds=1):
            raise ScheduleError(
                f"the schedule {name!r} needs an interval of at least a second, got: {length}"
            )
        object.__setattr__(self, "interval", length)
        self._check_job()
        if self.first_at is not None and (
            not isinstance(self.first_at, datetime) or self.first_at.utcoffset() is None
        ):
            raise ScheduleError(
                f"expected first_at of schedule {name!r} to be a timezone-aware datetime, "
                f"got: {self.first_at!r}"
            )
        if self.first_at is not None and not EARLIEST_RUN_AT <= self.first_at < LATEST_RUN_AT:
            raise ScheduleError(
                f"expected first_at of schedule {name!r} to be from "
                f"{EARLIEST_RUN_AT.isoformat()} to before {LATEST_RUN_AT.isoformat()}, "
                f"got: {self.first_at.isoformat()}"
            )

    def _check_cron(self) -> None:
        """Check a cron schedule: its expression, zone and job (not `every`'s checks)."""
        name = self.name
        if self.interval is not None or self.first_at is not None:
            raise ScheduleError(
                f"the schedule {name!r} has a cron expression: give it no interval or first_at"
            )
        try:
            from . import cron
        except ImportError:
            raise ScheduleError(f"Schedule.cron needs the cronsim package: {CRON_HINT}") from None
        zone = cron.zone_of(name, "UTC" if self.timezone is None else self.timezone)
        object.__setattr__(self, "expression", cron.check(name, self.expression, zone))
        object.__setattr__(self, "timezone", zone.key)
        self._check_job()

    def _check_job(self) -> None:
        name = self.name
        if not isinstance(self.job, NewJob):  # a NewJob's arguments were checked when made
            raise ScheduleError(f"expected the job of schedule {name!r} to be a NewJob")
        if self.job.run_in is not None or self.job.run_at is not None:
            object.__setattr__(self, "job", dataclasses.replace(self.job, run_in=None, run_at=None))

    @classmethod
    def cron(
        cls, name: str, expression: str, job: NewJob, *, tz: str | ZoneInfo = "UTC"
    ) -> Schedule:
        """Queue `job` at each time the cron expression `expression` names (five fields:
        minute, hour, day of month, month, day of week, as `0 3 * * *`), read on the
        clock of the IANA zone `tz` (default "UTC"). Needs `pip install 'axa-queue[cron]'`.

        The first time is the expression's first after the schedule's row is made (not
        at once). Across daylight-saving changes, a time in the hour the clocks skip
        runs once, at the first minute after the gap (02:30 runs at 03:00), and a time
        in the hour they repeat runs once, the first time it is shown; an expression
        with `*` in its minute or hour field follows real time instead (docs:
        configuration.md, Cron schedules).

        Raises `ScheduleError` for a bad name, an expression that is not five fields or
        has a bad field (the message names it), one that is never due, or an unknown
        zone: mistakes in code, found at boot.
        """
        return cls(name, None, job, expression=expression, timezone=tz)  # type: ignore[arg-type]

    @classmethod
    def every(
        cls, name: str, interval: Duration, job: NewJob, *, first_at: datetime | None = None
    ) -> Schedule:
        """Queue `job` every `interval` (at least a second, at most 100 years), first at
        `first_at` (a timezone-aware time, used only when the schedule's row is made) or
        at once.

        Raises `ScheduleError` for a name that is not 1 to `MAX_SCHEDULE_NAME` characters
        with no NUL or lone surrogate, an interval out of bounds, or a naive `first_at`:
        mistakes in code, found at boot. (A job whose arguments cannot be stored is
        refused before, by `NewJob`.)
        """
        return cls(name, interval, job, first_at)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ScheduleInfo:
    """What `axa_schedule` holds of one schedule, with its last job's state. Times are in
    UTC, and one Python cannot hold is read as `JobInfo` reads it."""

    name: str
    interval: timedelta | None
    due_at: datetime
    last_job: UUID | None
    last_state: JobState | None
    """None when there was no job yet, or retention deleted it."""
    last_error: str | None
    seen_at: datetime
    """When a live process last had it in code, to within a minute."""
    archived_at: datetime | None
    """Set when no live process had it in code; a schedule of that name restores it."""
    created_at: datetime
    expression: str | None = None
    """A cron schedule's expression (`interval` is then None)."""
    timezone: str | None = None
    """The IANA zone a cron schedule's expression is read in."""


def next_due(due_at: datetime, interval: timedelta, now: datetime) -> datetime:
    """The first due time after `now`, a whole number of intervals after `due_at`.

    The same arithmetic as `sql.SCHEDULE_TICK`, kept here to be tested on its own;
    exact (whole microseconds), as a float division can fall short when `now` is a due time.
    """
    return due_at + interval * ((now - due_at) // interval + 1)


def schedule_info(row: Any) -> ScheduleInfo:
    """Read a row of `sql.SCHEDULES`, by name (`namedtuple_row`)."""
    return ScheduleInfo(
        name=row.name,
        interval=None if row.interval_ms is None else timedelta(milliseconds=row.interval_ms),
        due_at=moment(row.due_at),
        last_job=row.last_job,
        seen_at=moment(row.seen_at),
        archived_at=optional_moment(row.archived_at),
        created_at=moment(row.created_at),
        last_state=None if row.last_status is None else JobState(row.last_status),
        last_error=row.last_error,
        expression=row.cron,
        timezone=row.timezone,
    )


def schedules_call() -> Call[list[ScheduleInfo]]:
    """The call that reads every schedule in the table, archived or not, with its last
    job's state (`sql.SCHEDULES`)."""
    return Call(sql.SCHEDULES, (), lambda rows, _n: [schedule_info(row) for row in rows])


def next_time(schedule: Schedule, after: datetime) -> datetime:
    """A cron schedule's first time strictly after `after`, in UTC (`LATEST_RUN_AT`, in
    effect never, if none within fifty years)."""
    from . import cron  # cronsim, there since the schedule was made

    assert schedule.expression is not None and schedule.timezone is not None
    found = cron.next_after(schedule.expression, ZoneInfo(schedule.timezone), after)
    return LATEST_RUN_AT if found is None else found


async def mark_seen(
    conn: psycopg.AsyncConnection[Any],
    schedules: Sequence[Schedule],
    now: datetime | None = None,
) -> None:
    """Make the rows of `schedules`, or note they are still in code (restoring archived
    ones), as of `now` (default: the database's clock).

    A cron schedule's first time is worked out here from `now`, or without one from
    this process's clock (not the database's: only the row's first placement depends on
    it, and clocks kept by NTP differ by milliseconds)."""
    placed_after = datetime.now(timezone.utc) if now is None else now
    async with conn.cursor() as cursor:
        await cursor.execute(
            sql.SCHEDULES_SEEN,
            {
                "names": [s.name for s in schedules],
                "first_at": [
                    s.first_at if s.expression is None else next_time(s, placed_after)
                    for s in schedules
                ],
                "interval_ms": [
                    None if s.interval is None else round(s.interval.total_seconds() * 1000)
                    for s in schedules
                ],
                "cron": [s.expression for s in schedules],
                "timezone": [s.timezone for s in schedules],
                "now": now,
            },
        )


@dataclass(frozen=True)
class Due:
    """A schedule found due: its due time, and the database's clock when it was read."""

    due_at: datetime | None
    """`None`: a due time Python cannot hold (`-infinity`, a date BC, written by another
    client), taken as due long ago."""
    now: datetime


async def due(
    conn: psycopg.AsyncConnection[Any],
    schedules: Sequence[Schedule],
    now: datetime | None = None,
) -> dict[str, Due]:
    """The `schedules` that are due at `now` (default: the database's clock), by name,
    read without locking."""
    async with conn.cursor(row_factory=by_name) as cursor:
        await cursor.execute(sql.SCHEDULES_DUE, {"names": [s.name for s in schedules], "now": now})
        return {row.name: Due(row.due_at, row.now) for row in await cursor.fetchall()}


async def tick_one(
    conn: psycopg.AsyncConnection[Any],
    schedule: Schedule,
    now: datetime | None = None,
    found: Due | None = None,
) -> UUID | None:
    """Queue `schedule`'s job if it is due at `now` (default: the database's clock) and no
    other process is queuing it, and move its due time on; returns the job queued, if
    any. One statement (`sql.SCHEDULE_TICK`, or `sql.CRON_TICK` for a cron schedule,
    which needs what `due` read: `found`) on an autocommit `conn`: no transaction is
    ever left open between awaits."""
    job = schedule.job
    moves: dict[str, Any]
    if schedule.interval is not None:
        statement, moves = sql.SCHEDULE_TICK, {"interval": schedule.interval.total_seconds()}
    else:
        assert found is not None, "a cron schedule ticks from the due time read"
        statement = sql.CRON_TICK
        moves = {"due_at": found.due_at, "next_at": next_time(schedule, found.now)}
    async with conn.cursor(row_factory=by_name) as cursor:
        await cursor.execute(
            statement,
            {
                "name": schedule.name,
                **moves,
                "id": uuid4(),
                "job": job.name,
                "args": job.encoded_args(),
                "max_attempts": job.max_attempts,
                "priority": job.priority_value(),
                "timeout_ms": job.timeout_ms(),
                "now": now,
            },
        )
        row = await cursor.fetchone()
    if row is None:
        return None  # another process holds it, or it is no longer due
    job_id: UUID | None = row.queued
    if job_id is None:
        log.info(
            "schedule skipped: %s, its last job (%s) has not finished",
            schedule.name,
            row.last_job,
            extra={"schedule": schedule.name, "job_id": str(row.last_job)},
        )
    else:
        log.debug(
            "schedule queued its job: schedule %s, job %s %s",
            schedule.name,
            job.name,
            job_id,
            extra={"schedule": schedule.name, "job_id": str(job_id), "job": job.name},
        )
    return job_id


SEEN_EVERY = 30.0
"""Seconds between notes that this process still has its schedules in code (at most a
quarter of `stale_after`), by which housekeeping tells the schedules no live process
has any more."""


class Ticker:
    """Queues the jobs of this process's schedules when they are due, each schedule on
    its own (one failing keeps no other from queuing), and notes now and then that this
    process still has them in code. Any number of processes may tick at once."""

    def __init__(self, schedules: Sequence[Schedule]) -> None:
        self.schedules = schedules
        """The schedules in code (the registry's list, read at each tick)."""
        self.seen_at: float | None = None
        """When (event loop time) the schedules were last noted as in code."""

    async def tick(
        self,
        conn: psycopg.AsyncConnection[Any],
        *,
        stale_after: float,
        now: datetime | None = None,
    ) -> tuple[int, dict[str, Exception]]:
        """Queue a job for each due schedule on `conn`; returns how many were queued and
        what each schedule that failed raised, by name. A broken connection is raised:
        the next tick tries again. `now`: the time to tick at (default: the database's
        clock; tests pass a later one to let intervals pass)."""
        loop = asyncio.get_running_loop()
        every = min(SEEN_EVERY, stale_after / 4)
        if self.seen_at is None or loop.time() - self.seen_at >= every:
            await mark_seen(conn, self.schedules, now)
            self.seen_at = loop.time()
        due_now = await due(conn, self.schedules, now)
        queued = 0
        failures: dict[str, Exception] = {}
        for schedule in self.schedules:
            found = due_now.get(schedule.name)
            if found is None:
                continue
            try:
                if await tick_one(conn, schedule, now, found) is not None:
                    queued += 1
            except psycopg.OperationalError:
                raise  # the connection, not the schedule: the next tick tries again
            except Exception as error:
                failures[schedule.name] = error
        return queued, failures
