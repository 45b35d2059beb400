"""The worker processes table's statements (`axa_workers`): a process's row made,
refreshed and removed, dead ones forgotten, and every one listed."""

from __future__ import annotations

from .naming import statement

__all__ = ["WORKERS", "WORKERS_FORGET", "WORKER_GONE", "WORKER_SEEN"]

WORKER_SEEN = statement("""INSERT INTO {axa_workers} (id, host, pid, names, loops, running, version,
        started_at, seen_at)
    VALUES (%(id)s, %(host)s, %(pid)s, %(names)s::text[], %(loops)s, %(running)s, %(version)s,
            COALESCE(%(now)s::timestamptz, now()), COALESCE(%(now)s::timestamptz, now()))
    ON CONFLICT (id) DO UPDATE
    SET seen_at = EXCLUDED.seen_at, running = EXCLUDED.running, names = EXCLUDED.names""")
"""Say this worker process is alive: its row is made at start, then its last heartbeat
(`seen_at`) and jobs in progress (`running`) refreshed once per `heartbeat_interval`,
one primary-key write (never a statement per job). The same upsert both makes and
refreshes the row, so a row removed while the process was cut off comes back."""

WORKER_GONE = statement("DELETE FROM {axa_workers} WHERE id = %(id)s")
"""A worker process stopped cleanly: its row goes."""

WORKERS_FORGET = statement("""DELETE FROM {axa_workers}
    WHERE seen_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(after)s)""")
"""Remove the rows of processes not heard from for long (killed, or their host lost):
housekeeping, through the `axa_workers_seen` index."""

WORKERS = statement("""SELECT id, host, pid, names, loops, running, version,
    EXTRACT(EPOCH FROM started_at) AS started_at, EXTRACT(EPOCH FROM seen_at) AS seen_at,
    (EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now())) - EXTRACT(EPOCH FROM seen_at))::float8 AS silent
    FROM {axa_workers} ORDER BY host, pid, started_at""")
"""Every worker process with a row, and how many seconds since it was last heard from
(readers call it live while that is under `stale_after`); a small table, one row per
process. The seconds are a difference of epoch seconds, which a `seen_at` of `infinity`
or `-infinity`, written by another client, cannot fail before PostgreSQL 17 (it reads
as -infinity or infinity)."""
