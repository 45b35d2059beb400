"""The schedules table's statements: a schedule seen in code, its due times queued
once (by interval or cron), archived when no process has it, and listed."""

from __future__ import annotations

from .naming import statement

__all__ = [
    "CRON_TICK",
    "SCHEDULES",
    "SCHEDULES_DUE",
    "SCHEDULES_SEEN",
    "SCHEDULE_ARCHIVE",
    "SCHEDULE_TICK",
]

SCHEDULES_SEEN = statement("""INSERT INTO {axa_schedule} (name, due_at, interval_ms, cron, timezone, seen_at)
    SELECT s.name, COALESCE(s.first_at, COALESCE(%(now)s::timestamptz, now())), s.interval_ms,
           s.cron, s.timezone, COALESCE(%(now)s::timestamptz, now())
    FROM unnest(%(names)s::text[], %(first_at)s::timestamptz[], %(interval_ms)s::bigint[],
                %(cron)s::text[], %(timezone)s::text[])
         AS s(name, first_at, interval_ms, cron, timezone)
    ON CONFLICT (name) DO UPDATE
    SET seen_at = COALESCE(%(now)s::timestamptz, now()), archived_at = NULL, interval_ms = EXCLUDED.interval_ms,
        cron = EXCLUDED.cron, timezone = EXCLUDED.timezone
    WHERE axa_schedule.archived_at IS NOT NULL
       OR axa_schedule.interval_ms IS DISTINCT FROM EXCLUDED.interval_ms
       OR axa_schedule.cron IS DISTINCT FROM EXCLUDED.cron
       OR axa_schedule.timezone IS DISTINCT FROM EXCLUDED.timezone
       OR axa_schedule.seen_at < COALESCE(%(now)s::timestamptz, now()) - interval '1 minute'""")
"""Make each schedule's row, or say it is still in code: restore it if archived, and note
its interval, or its cron expression and zone (a cron schedule's `interval_ms` is NULL,
which the crate reads as no interval). A cron schedule's first due time is worked out
in Python (`first_at`); a changed interval, expression or zone applies from the next
due time on. `seen_at` moves at most once a minute, so a tick rarely writes."""

_EARLIEST = "'0002-01-01 00:00:00+00'::timestamptz"
"""The earliest due time read as it is: Python's `datetime` holds none before year 1 (in
any time zone the session shows it in), and another client may write `-infinity` or a
date BC."""

SCHEDULES_DUE = statement(
    """SELECT name, CASE WHEN due_at >= {earliest} THEN due_at END AS due_at,
    COALESCE(%(now)s::timestamptz, now()) AS now FROM {axa_schedule}
    WHERE name = ANY(%(names)s::text[]) AND archived_at IS NULL AND due_at <= COALESCE(%(now)s::timestamptz, now())""",
    earliest=_EARLIEST,
)
"""Which schedules are due, without locking: most ticks stop here. With each, the due
time read and the clock it was read at, from which a cron schedule's next time is
worked out (`CRON_TICK`). A due time is at most now; one earlier than `_EARLIEST`
(`-infinity`, a date BC, which another client wrote) reads as NULL, so one schedule's
row never fails the read of every schedule due: the ticks take it as due long ago."""

SCHEDULE_TICK = statement(
    """WITH due AS (
        SELECT name, last_job FROM {axa_schedule}
        WHERE name = %(name)s AND archived_at IS NULL AND due_at <= COALESCE(%(now)s::timestamptz, now())
        FOR UPDATE SKIP LOCKED
    ), busy AS (
        SELECT EXISTS (SELECT 1 FROM {axa_queue} q JOIN due ON q.id = due.last_job
                       WHERE q.status IN ('queued', 'running')) AS busy
    ), queued AS (
        INSERT INTO {axa_queue} (id, name, args, max_attempts, priority, run_at, timeout_ms)
        SELECT %(id)s, %(job)s, %(args)s::jsonb, %(max_attempts)s, %(priority)s, COALESCE(%(now)s::timestamptz, now()),
               %(timeout_ms)s
        FROM due WHERE NOT (SELECT busy FROM busy)
        RETURNING id
    ), advanced AS (
        UPDATE {axa_schedule} s
        SET due_at = CASE WHEN s.due_at < {earliest}
                THEN COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(interval)s)
                ELSE s.due_at + make_interval(secs => %(interval)s)
                * (floor(EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now()) - s.due_at) / %(interval)s::numeric) + 1) END,
            last_job = COALESCE((SELECT id FROM queued), s.last_job), updated_at = COALESCE(%(now)s::timestamptz, now())
        FROM due WHERE s.name = due.name
        RETURNING s.name
    )
    SELECT (SELECT id FROM queued) AS queued, due.last_job,
        (SELECT count(*) FROM advanced) AS advanced
    FROM due""",
    earliest=_EARLIEST,
)
"""Queue a due schedule's job and move its due time on, in one statement (autocommit: no
transaction stays open while the event loop may be blocked). The row is taken with
`FOR UPDATE SKIP LOCKED`: a process finding it held skips it, the holder is queuing this
due time, and one whose holder committed first finds it no longer due. The job is not
queued while the last one is still queued or running (no stacking). The next due time
is the first after now a whole number of intervals from the last: no drift, one
catch-up, and no stacking; divided in exact numeric (the crate divides in float8, which
can leave `due_at` at now when a tick lands exactly on a due time).

Returns no row when the schedule was not due or another process held it; else the job
queued (NULL when skipped) and the last job before it."""

CRON_TICK = statement(
    """WITH due AS (
        SELECT name, last_job FROM {axa_schedule}
        WHERE name = %(name)s AND archived_at IS NULL
          AND (due_at = %(due_at)s OR (%(due_at)s::timestamptz IS NULL AND due_at < {earliest}))
          AND due_at <= COALESCE(%(now)s::timestamptz, now())
        FOR UPDATE SKIP LOCKED
    ), busy AS (
        SELECT EXISTS (SELECT 1 FROM {axa_queue} q JOIN due ON q.id = due.last_job
                       WHERE q.status IN ('queued', 'running')) AS busy
    ), queued AS (
        INSERT INTO {axa_queue} (id, name, args, max_attempts, priority, run_at, timeout_ms)
        SELECT %(id)s, %(job)s, %(args)s::jsonb, %(max_attempts)s, %(priority)s, COALESCE(%(now)s::timestamptz, now()),
               %(timeout_ms)s
        FROM due WHERE NOT (SELECT busy FROM busy)
        RETURNING id
    ), advanced AS (
        UPDATE {axa_schedule} s
        SET due_at = %(next_at)s, last_job = COALESCE((SELECT id FROM queued), s.last_job),
            updated_at = COALESCE(%(now)s::timestamptz, now())
        FROM due WHERE s.name = due.name
        RETURNING s.name
    )
    SELECT (SELECT id FROM queued) AS queued, due.last_job,
        (SELECT count(*) FROM advanced) AS advanced
    FROM due""",
    earliest=_EARLIEST,
)
"""`SCHEDULE_TICK` for a cron schedule, whose next time SQL cannot work out: the process
read the due time (`SCHEDULES_DUE`) and passes it with the next time it worked out
after the clock it read (`next_at`, later than both). The row is taken only while its
due time is still the one read (and due), so of any number of processes that read the
same due time, one moves it on and queues its job and the others find no row: each due
time is queued once. After an outage, one job, then the first time after now; the job
is not queued while the last is still queued or running (no stacking).

Returns no row when the due time was moved on already or another process holds the
row; else the job queued (NULL when skipped) and the last job before it."""

SCHEDULE_ARCHIVE = statement("""UPDATE {axa_schedule} SET archived_at = COALESCE(%(now)s::timestamptz, now()), updated_at = COALESCE(%(now)s::timestamptz, now())
    WHERE archived_at IS NULL
      AND seen_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
      AND NOT EXISTS (SELECT FROM unnest(%(in_code)s::text[]) AS c(name)
                      WHERE c.name = axa_schedule.name)""")
"""Archive schedules no live process has in code (unseen for the stale period). The
names in code are looked up by a hashed anti-join (as `name <> ALL(in_code)`, the
generic plan compared each schedule with every name: 2.4 s for 20,000 schedules)."""

SCHEDULES = statement("""SELECT s.name, s.interval_ms, s.cron, s.timezone, EXTRACT(EPOCH FROM s.due_at) AS due_at, s.last_job,
    EXTRACT(EPOCH FROM s.seen_at) AS seen_at, EXTRACT(EPOCH FROM s.archived_at) AS archived_at,
    EXTRACT(EPOCH FROM s.created_at) AS created_at, q.status AS last_status, q.error AS last_error
    FROM {axa_schedule} s LEFT JOIN LATERAL (
        SELECT status, error FROM {axa_queue} WHERE id = s.last_job
        UNION ALL
        SELECT status, error FROM {axa_queue_history} WHERE id = s.last_job
        LIMIT 1
    ) q ON true ORDER BY s.name""")
"""Every schedule, archived or not, with its last job's state, moved to the history or
not; times as epoch seconds, as `JOB` reads them."""
