"""The worker processes table's statements (`axa_workers`): a process's row made,
refreshed and removed, dead ones forgotten, every one listed, and the job names that
have waited long with no live process to handle them."""

from __future__ import annotations

from .naming import statement

__all__ = ["UNHANDLED_JOBS", "WORKERS", "WORKERS_FORGET", "WORKER_GONE", "WORKER_SEEN"]

WORKER_SEEN = statement("""INSERT INTO {axa_workers} (id, host, pid, names, loops, running, version,
        started_at, seen_at, beat_ms)
    VALUES (%(id)s, %(host)s, %(pid)s, %(names)s::text[], %(loops)s, %(running)s, %(version)s,
            COALESCE(%(now)s::timestamptz, now()), COALESCE(%(now)s::timestamptz, now()),
            %(beat_ms)s)
    ON CONFLICT (id) DO UPDATE
    SET seen_at = EXCLUDED.seen_at, running = EXCLUDED.running, names = EXCLUDED.names,
        beat_ms = EXCLUDED.beat_ms""")
"""Say this worker process is alive: its row is made at start, then its last heartbeat
(`seen_at`) and jobs in progress (`running`) refreshed once per `heartbeat_interval`
(`beat_ms`, so readers know after how long a silent process is gone), one primary-key
write (never a statement per job). The same upsert both makes and refreshes the row, so
a row removed while the process was cut off comes back."""

WORKER_GONE = statement("DELETE FROM {axa_workers} WHERE id = %(id)s")
"""A worker process stopped cleanly: its row goes."""

WORKERS_FORGET = statement("""DELETE FROM {axa_workers}
    WHERE seen_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(after)s)""")
"""Remove the rows of processes not heard from for long (killed, or their host lost):
housekeeping, through the `axa_workers_seen` index."""

WORKERS = statement("""SELECT id, host, pid, names, loops, running, version, beat_ms,
    EXTRACT(EPOCH FROM started_at) AS started_at, EXTRACT(EPOCH FROM seen_at) AS seen_at,
    (EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now())) - EXTRACT(EPOCH FROM seen_at))::float8 AS silent
    FROM {axa_workers} ORDER BY host, pid, started_at""")
"""Every worker process with a row, and how many seconds since it was last heard from
(readers call it gone after `presence.GONE_AFTER_BEATS` of its heartbeat intervals,
`beat_ms`, or, in a row without one, after `stale_after`); a small table, one row per
process. The seconds are a difference of epoch seconds, which a `seen_at` of `infinity`
or `-infinity`, written by another client, cannot fail before PostgreSQL 17 (it reads
as -infinity or infinity)."""

UNHANDLED_JOBS = statement("""WITH RECURSIVE names AS (
        (SELECT name FROM {axa_queue} WHERE status = 'queued' ORDER BY name LIMIT 1)
        UNION ALL
        SELECT (SELECT q.name FROM {axa_queue} q
                WHERE q.status = 'queued' AND q.name > names.name ORDER BY q.name LIMIT 1)
        FROM names WHERE names.name IS NOT NULL
    )
    SELECT names.name, waiting.jobs, waiting.oldest
    FROM names CROSS JOIN LATERAL (
        SELECT count(*) AS jobs,
            (EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now()))
             - EXTRACT(EPOCH FROM min(w.run_at)))::float8 AS oldest
        FROM (
            SELECT q.run_at FROM {axa_queue} q
            WHERE q.status = 'queued' AND q.name = names.name
              AND names.name <> ALL(%(handled)s::text[])
              AND q.run_at <= COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(after)s)
            ORDER BY q.priority DESC, q.run_at LIMIT %(cap)s
        ) w
    ) waiting
    WHERE names.name IS NOT NULL AND names.name <> ALL(%(handled)s::text[]) AND waiting.jobs > 0
    ORDER BY names.name""")
"""The job names with jobs due for longer than `after` seconds that none of `handled`
(the names live worker processes handle, `presence.handled_names`) is: how many such
jobs each has and how long the oldest has waited. The queued names are found by a skip
scan of the `axa_queue_pick` index (one probe per name, however many jobs queue under
each), and only a name nobody handles has its jobs counted, through the same index: a
backlog of handled jobs costs nothing (the handled names are refused inside the count
too, a filter on the name alone that PostgreSQL checks before any scan, whatever order
the plan joins in). Who is live is judged by the caller from
`WORKERS`, so the rule lives in one place."""
