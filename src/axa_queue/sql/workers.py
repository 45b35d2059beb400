"""The worker processes table's statements (`axa_workers`): a process's row made,
refreshed and removed, dead ones forgotten, every one listed, the job names that have
waited long with no live process to handle them, and the running jobs whose process is
gone (`worker_gone`, the one test of it)."""

from __future__ import annotations

from string import Template

from .naming import statement

__all__ = [
    "ABSENT_BEAT_MS",
    "GIVE_BACK_GRACE_MS",
    "GONE_AFTER_BEATS",
    "PRESENCE_HOLD",
    "PRESENCE_LOCK",
    "UNHANDLED_JOBS",
    "WORKERS",
    "WORKERS_FORGET",
    "WORKER_GONE",
    "WORKER_GONE_JOBS",
    "WORKER_SEEN",
    "worker_gone",
]

GONE_AFTER_BEATS = 3
"""Heartbeat intervals a process may miss before it is taken as gone: one late beat (a
slow write, a busy host) is not a death, three in a row are (`presence.WorkerInfo`, and
`worker_gone` in SQL)."""

ABSENT_BEAT_MS = 60_000
"""The heartbeat interval, in milliseconds, a read judges a process by when the process
has no row in `axa_workers` (it stopped, or was forgotten; or has not written it yet):
`QueueOptions.heartbeat_interval`'s default. A worker asking judges by its own."""

_WORKER_GONE = Template("""CASE WHEN $job.status = 'running' AND $job.run_attempt = $job.attempts
                 AND $job.run_worker IS NOT NULL$others THEN EXISTS (
            SELECT FROM (SELECT) one LEFT JOIN {axa_workers} w ON w.id = $job.run_worker
            WHERE $updated < EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now()))
                  - ($beats * COALESCE(w.beat_ms, %(beat_ms)s::int) + $grace) / 1000.0
              AND (w.id IS NULL OR w.seen_at < COALESCE(%(now)s::timestamptz, now())
                                     - ($beats * w.beat_ms + $grace) * interval '1 millisecond'))
        ELSE false END""")


PRESENCE_LOCK = 1635213691
"""The first key of each worker process's presence lock: a session-level advisory lock
on `(PRESENCE_LOCK, hashtext(<its id in axa_workers>))`, held by its side connection
(`PRESENCE_HOLD`) for as long as that session lives. A process that died (SIGKILL, its
host lost) loses it when the server notices its connection closed; one whose event loop
is only blocked keeps it. The give-back (`GIVE_BACK_GONE`) takes a process for gone
only when, besides its silence, that lock is free: it tries it for the length of its
own transaction."""

PRESENCE_HOLD = statement(
    f"""SELECT pg_try_advisory_lock({PRESENCE_LOCK}, hashtext(%(worker)s::text)) AS held"""
)
"""Take this process's presence lock on its side connection, without waiting: `held`
false when another session holds it (the process's previous side connection, not yet
ended by the server; or another process whose id has the same 32-bit hash), tried again
at the next heartbeat. Never behind a transaction pooler (a session lock there lands on
a server connection other clients share)."""

GIVE_BACK_GRACE_MS = 1000
"""How much longer than `GONE_AFTER_BEATS` heartbeat intervals a process must be silent
before its runs claimed ahead are given back (`GIVE_BACK_GONE`; it is shown gone
without it): a process's beats come late by their statement's round trip and its event
loop's lag, whatever its interval, and giving back a run whose handler a live process
just started sends the job to review. A second covers a loaded host; beside the default
interval (a minute), it is nothing."""


def worker_gone(job: str, updated: str, *, others: bool = False, grace_ms: int = 0) -> str:
    """The SQL test that job `job` (a row with `status`, `attempts` and the claim's stamp,
    `run_worker`, `run_attempt`) is a run whose worker process is gone: `running`, its
    claim's stamp names a process for its current attempt (`run_attempt = attempts`:
    migration 16), and both have been silent for
    `GONE_AFTER_BEATS` of that process's heartbeat intervals: the run's row not renewed
    (`updated`, an expression of its `updated_at` as epoch seconds: every heartbeat stamps
    it) and the process's row in `axa_workers` not refreshed, or not there at all (it
    stopped, its row removed; or it was forgotten). A process whose row records no
    interval (an older version's) is never judged gone here. A process with no row is
    judged by `%(beat_ms)s`, the reader's own heartbeat interval in milliseconds. A run the
    Rust crate made names no process: never gone. With `others`, never a run of
    `%(worker)s` (the process asking). Reads one primary key, only for a running job.

    Both silences are needed: a process whose `axa_workers` write fails while its
    heartbeats go through (presence only informs) still holds its runs, and a process
    whose row is not written yet (it just started) or never is (`drain()`'s) renews its
    runs. With `grace_ms`, both must be silent that much longer. The statements take
    `%(now)s` and `%(beat_ms)s`."""
    return _WORKER_GONE.substitute(
        job=job,
        updated=updated,
        beats=GONE_AFTER_BEATS,
        grace=grace_ms,
        others=f"\n                 AND {job}.run_worker <> %(worker)s::uuid" if others else "",
    )


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

WORKERS = statement("""SELECT w.id, w.host, w.pid, w.names, w.loops, w.running, w.version, w.beat_ms,
    EXTRACT(EPOCH FROM w.started_at) AS started_at, EXTRACT(EPOCH FROM w.seen_at) AS seen_at,
    (EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now())) - EXTRACT(EPOCH FROM w.seen_at))::float8 AS silent,
    COALESCE(h.jobs, 0) AS holding
    FROM {axa_workers} w
    LEFT JOIN (SELECT q.run_worker, count(*) AS jobs FROM {axa_queue} q
               WHERE q.status = 'running' AND q.run_attempt = q.attempts
               GROUP BY q.run_worker) h ON h.run_worker = w.id
    ORDER BY w.host, w.pid, w.started_at""")
"""Every worker process with a row, how many jobs the table says it runs (`holding`:
running under a claim it stamped, through `axa_queue_running`: the running jobs, read
once and counted by process, not once per process: 1,000 processes and 10,000 running
jobs took a second read per process),
and how many seconds since it was last heard from
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
            WHERE q.status = 'queued' AND q.name = ANY(ARRAY[names.name])
              AND names.name <> ALL(%(handled)s::text[])
              AND q.run_at <= COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(after)s)
            ORDER BY q.name, q.priority DESC, q.run_at LIMIT %(cap)s
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
the plan joins in). The count reads its name's jobs in an order that starts with the
name, which only `axa_queue_pick` gives without a sort (the name is compared through
`= ANY(ARRAY[...])`, as the claim's `levels` do, so PostgreSQL does not drop it from the
order as fixed): whatever the statistics, the plan never walks `axa_queue_claim`
(every name's jobs in claim order) filtering out other names' jobs, which it did now
and then on a table of 50,000 handled jobs. Who is live is judged by the caller from
`WORKERS`, so the rule lives in one place."""

WORKER_GONE_JOBS = statement(
    Template("""SELECT q.name, count(*) AS jobs FROM {axa_queue} q
    WHERE q.status = 'running'
      AND q.updated_at < COALESCE(%(now)s::timestamptz, now()) - $beats * interval '1 millisecond'
          * (SELECT LEAST(min(beat_ms), %(beat_ms)s::int) FROM {axa_workers})
      AND $gone
    GROUP BY q.name ORDER BY q.name""").substitute(
        beats=GONE_AFTER_BEATS, gone=worker_gone("q", "EXTRACT(EPOCH FROM q.updated_at)")
    )
)
"""How many running jobs of each name are runs of a process that is gone (`worker_gone`):
shown as "worker gone" until stale recovery decides them (a run claimed ahead and never
started is given back at once: `GIVE_BACK_GONE`). Only the running rows not renewed for
`GONE_AFTER_BEATS` of the shortest heartbeat interval any process records (or the
reader's) are read, through `axa_queue_running` (`updated_at`): while every process
reports in, none."""
