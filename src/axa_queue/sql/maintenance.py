"""Housekeeping's statements: stale recovery, retention and the rebuild of bloated
indexes, and what each would do now (for a dry run)."""

from __future__ import annotations

from string import Template

from psycopg import sql as pgsql

from .naming import statement
from .workers import GIVE_BACK_GRACE_MS, GONE_AFTER_BEATS, PRESENCE_LOCK, worker_gone

__all__ = [
    "GIVE_BACK_GONE",
    "GIVE_BACK_LIMIT",
    "INDEX_SIZES",
    "PURGE",
    "PURGEABLE",
    "RECOVER_STALE",
    "REINDEX_LOCK",
    "REINDEX_UNLOCK",
    "REINDEX_WAIT",
    "REINDEX_WAIT_RESET",
    "STALE",
    "drop_index",
    "reindex",
]

GIVE_BACK_LIMIT = 3
"""How many times stale recovery gives a job back an attempt whose handler it takes as
never started (`axa_queue.given_back`): a start is marked by the exchange after it (the
loop does not wait for it), so a handler that kills its process at once looks never
started; past this many give-backs its attempts are burned as any crashed run's, and
such a job fails at last rather than crash worker after worker for ever."""

RECOVER_STALE = statement("""WITH stale AS MATERIALIZED (
    SELECT id, started_at, ahead = attempts AND given_back < %(give_back)s AS gives_back,
        CASE WHEN run_attempt = attempts THEN run_worker END AS worker,
        CASE WHEN run_attempt = attempts THEN run_host END AS host,
        CASE WHEN run_attempt = attempts THEN run_pid END AS pid
    FROM {axa_queue}
    WHERE status = 'running' AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
      AND (pg_postmaster_start_time() < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
           OR updated_at < pg_postmaster_start_time() - make_interval(secs => %(stale)s))
      AND (id, attempts) NOT IN (
          SELECT * FROM unnest(%(held)s::uuid[], %(held_attempts)s::int[]))
    FOR NO KEY UPDATE SKIP LOCKED
    ), recovered AS (
    UPDATE {axa_queue}
    SET status = CASE WHEN (ahead = attempts AND given_back < %(give_back)s)
                            OR attempts < COALESCE(max_attempts, (%(limits)s::jsonb ->> name)::int, %(max)s)
                      THEN 'queued' ELSE 'failed' END,
        error = CASE WHEN (ahead = attempts AND given_back < %(give_back)s)
                          OR attempts < COALESCE(max_attempts, (%(limits)s::jsonb ->> name)::int, %(max)s) THEN error
                     ELSE 'abandoned by its worker' END,
        started_at = CASE WHEN (ahead = attempts AND given_back < %(give_back)s)
                               OR attempts < COALESCE(max_attempts, (%(limits)s::jsonb ->> name)::int, %(max)s) THEN NULL
                          ELSE started_at END,
        max_attempts = CASE WHEN ahead = attempts AND given_back < %(give_back)s
                            THEN LEAST(COALESCE(max_attempts, (%(limits)s::jsonb ->> name)::int, %(max)s)::bigint + 1, 2147483647)
                            ELSE max_attempts END,
        given_back = CASE WHEN ahead = attempts AND given_back < %(give_back)s
                          THEN given_back + 1 ELSE given_back END,
        updated_at = COALESCE(%(now)s::timestamptz, now())
    WHERE id = ANY(ARRAY(SELECT id FROM stale))
    RETURNING id, name, attempts, status
    ), ended AS (
        INSERT INTO {axa_queue_attempts} AS a
            (job_id, attempt, worker, host, pid, started_at, ended_at, outcome, error)
        SELECT r.id, r.attempts, s.worker, s.host, s.pid, s.started_at, COALESCE(%(now)s::timestamptz, now()),
            CASE WHEN s.gives_back THEN 'given back' ELSE 'abandoned' END,
            CASE WHEN s.gives_back THEN NULL ELSE 'abandoned by its worker' END
        FROM recovered r JOIN stale s ON s.id = r.id
        ON CONFLICT (job_id, attempt) DO UPDATE
        SET ended_at = EXCLUDED.ended_at, outcome = EXCLUDED.outcome, error = EXCLUDED.error
    ), told AS (
        SELECT pg_notify('axa_queue_done', {'axa_queue'}::regclass::oid::text || ' '
                         || CASE WHEN count(*) > 150 THEN '*' ELSE string_agg(id::text, ' ') END)
        FROM recovered WHERE status = 'failed' HAVING count(*) > 0
    )
    SELECT id, name, attempts, status FROM recovered WHERE (SELECT count(*) FROM told) >= 0""")
"""Recover runs not heard from for the stale period: queued again with attempts left,
else failed, so a crash can never loop for ever.

A run claimed ahead whose handler was never marked started (`ahead = attempts`, see
`EXCHANGE`) did no work: its job is queued again and gets its attempt back, at most
`give_back` (`GIVE_BACK_LIMIT`) times per job. Not by lowering `attempts`, which fences
every run (each run keeps a number of its own, and a stalled process that wakes finds
its attempt superseded), but by raising the job's limit by one (`max_attempts`; never
past 2147483647, the most an `integer` holds, so one job at that limit cannot fail the
recovery of every other), as a snooze does, and counting it in `given_back`. Such a
run never fails for want of attempts.

A job's limit is its own `max_attempts`, else its handler's in the recovering process
(`limits`, a JSON object of the handlers' by name), else that process's default (`max`):
`COALESCE(max_attempts, (limits ->> name)::int, max)`, the rule of
`limits.AttemptLimits.of`, whose `params` these are; the claim and `MARK_LOST` judge a
run by the same answer.

Never a run the recovering process holds itself (`held`, `held_attempts`), and, within
the stale period after the server started, only runs silent for that long before it
started: a restart cut every worker off, so the silence since says nothing. It compares with `now()`, the statement's start, never
later than when a row is read: a recovery held up by a lock judges as of before its
wait, so it can only find fewer runs stale (claims and heartbeats stamp the time they
write). The jobs it fails are told to waiters (`DONE_CHANNEL`; rare, so always).

It never waits for a row lock: `stale` locks the stale rows with `FOR NO KEY UPDATE SKIP
LOCKED` (the lock the `UPDATE` takes) and only those are recovered. A row another
statement holds is being written by it: its owner's exchange recording its ending or
marking its start, a heartbeat, `MARK_LOST`, a person's `CANCEL`; whatever it leaves,
the next recovery judges. A row whose newest version is no longer stale (a heartbeat
committed since the statement began) is not locked: the lock follows the row to its
newest version and checks it again, and the `UPDATE` writes that version, which it
holds. An `UPDATE` that waited for each row as it went would hold the rows it had
already taken while waiting, in its own order, and could close a cycle with an
exchange taking the same process's rows in its two passes (a process silent past
`stale_after` that speaks again just then): a statement that waits for no lock is in
no cycle.

Each run recovered gets its attempt row (`ended`): `given back` (its handler never
started) or `abandoned` (its process went silent), with who ran it (its claim's stamp on
the job's row, when the stamp is of this attempt: none for a run the crate made) and
when it started, read from the job's row as it was (`stale`)."""

GIVE_BACK_GONE = statement(
    Template("""WITH gone AS MATERIALIZED (
    SELECT q.id FROM {axa_queue} q
    WHERE q.status = 'running' AND q.ahead = q.attempts AND q.given_back < %(give_back)s
      AND q.updated_at < COALESCE(%(now)s::timestamptz, now()) - $beats * interval '1 millisecond'
          * (SELECT LEAST(min(beat_ms), %(beat_ms)s::int) FROM {axa_workers})
      AND pg_postmaster_start_time() < COALESCE(%(now)s::timestamptz, now()) - $beats
          * interval '1 millisecond' * (SELECT GREATEST(max(beat_ms), %(beat_ms)s::int) FROM {axa_workers})
      AND CASE WHEN $gone AND q.run_worker <> ALL (ARRAY(
                   SELECT w.id FROM {axa_workers} w WHERE w.seen_at < pg_postmaster_start_time()))
               THEN pg_try_advisory_xact_lock($presence, hashtext(q.run_worker::text))
               ELSE false END
    FOR NO KEY UPDATE OF q SKIP LOCKED
    ), back AS (
    UPDATE {axa_queue} q
    SET status = 'queued', ahead = NULL, started_at = NULL,
        max_attempts = LEAST(COALESCE(q.max_attempts, (%(limits)s::jsonb ->> q.name)::int, %(max)s)::bigint + 1,
                             2147483647),
        given_back = q.given_back + 1,
        updated_at = COALESCE(%(now)s::timestamptz, now())
    WHERE q.id = ANY(ARRAY(SELECT id FROM gone))
    RETURNING q.id, q.name, q.attempts, q.run_worker AS worker, q.run_host AS host, q.run_pid AS pid
    ), ended AS (
    INSERT INTO {axa_queue_attempts} AS a (job_id, attempt, worker, host, pid, ended_at, outcome, error)
    SELECT id, attempts, worker, host, pid, COALESCE(%(now)s::timestamptz, now()), 'given back',
        'its worker process was gone before its handler started'
    FROM back
    ON CONFLICT (job_id, attempt) DO UPDATE
    SET ended_at = EXCLUDED.ended_at, outcome = EXCLUDED.outcome, error = EXCLUDED.error
    WHERE a.ended_at IS NULL
    RETURNING a.job_id
    ), woken AS (
        SELECT pg_notify('axa_queue', n.nspname || ' 0')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = {'axa_queue'}::regclass AND EXISTS (SELECT FROM back)
    )
    SELECT id::text AS id, name, attempts FROM back
    WHERE (SELECT count(*) FROM ended) >= 0 AND (SELECT count(*) FROM woken) >= 0""").substitute(
        beats=GONE_AFTER_BEATS,
        presence=PRESENCE_LOCK,
        gone=worker_gone(
            "q", "EXTRACT(EPOCH FROM q.updated_at)", others=True, grace_ms=GIVE_BACK_GRACE_MS
        ),
    )
)
"""Give back at once the runs a gone process claimed ahead and never started: queued
again, their attempt given back, without waiting for `stale_after` (`RECOVER_STALE`).
A run qualifies when it is `running` with `ahead = attempts` (its handler never marked
started, see `EXCHANGE`) and its process is gone (`workers.worker_gone`: the run's row
and the process's row silent for `GONE_AFTER_BEATS` of its heartbeat intervals and
`GIVE_BACK_GRACE_MS` more, or the process has no row) and its presence lock is free
(`workers.PRESENCE_LOCK`: a process whose event loop is blocked, a handler hogging it,
still holds it on its side connection, and keeps its runs; the lock is tried only for a
run its silence already gave up, in a `CASE`, and held until this transaction ends),
never a run of the process asking (`worker`). A restart of the server frees every
process's lock, and a process takes it again only as it makes its side connection anew,
which one whose event loop is blocked cannot do: so a process last seen (`seen_at`)
before the server started is never taken for gone here, dead or blocked, and its runs
are left to stale recovery, which gives a run that never started its attempt back too.
Once it writes its row again it holds its lock again. Those processes are read once per
statement (an `ARRAY` of them, not a probe per row): a probe per row doubled the
planner's estimate on a large table, past `jit_above_cost`, and a connection without
the workers' `jit = off` (behind a transaction pooler) spent 30 ms compiling it. Started runs are
left to stale recovery: their handler may still run on a stalled host.

Fencing stays exact: a process taken as gone may only be stalled, and may come back
with that attempt. So `attempts` is never lowered (another claim would reuse its
number, and the stalled process's start mark, heartbeat or ending could land on that
run): the job keeps its number and its stored limit rises by one instead (`max_attempts`,
stored by the claim; never past 2147483647), as `RECOVER_STALE` and `GIVE_BACK` do, and
`given_back` counts it; the run gets its row in `axa_queue_attempts`, `given back`
(`ended`), with why and the process its claim stamped (the stamp is of this attempt:
`worker_gone` asks it). At most `give_back` (`GIVE_BACK_LIMIT`) times per job, as stale
recovery: past that the run waits for stale recovery, which burns its attempt. A process
that comes back finds its attempt superseded: its start mark (`EXCHANGE`'s `marked`,
fenced by the attempt, `ahead` and `running`) and its ending change nothing, its
heartbeat finds the claim gone, and a waiting run proves its claim before it starts
(`decisions.needs_proof`: it has not been renewed for two heartbeat intervals).

Only running rows not renewed for `GONE_AFTER_BEATS` of the shortest interval any
process records (or the asker's, `beat_ms`) are read, through `axa_queue_running`:
while every process reports in, none. Nothing within that many of the longest interval
of the server's start: a restart cut every process off, and they report in again
within one interval. The worker asks only once its own connection has been up that long
(`worker.housekeeping`).

It never waits for a row lock, like `RECOVER_STALE` and `HEARTBEAT`: `gone` locks the
rows with `FOR NO KEY UPDATE SKIP LOCKED` (the lock the `UPDATE` takes), re-checked on
the newest version (a heartbeat committed since renews the row, and it is left), so no
cycle of waits passes through it. The attempts rows it ends are those of the rows it
holds. The jobs queued again wake the workers on commit (one notification)."""

STALE = statement("""SELECT id, name, attempts,
        CASE WHEN (ahead = attempts AND given_back < %(give_back)s)
                  OR attempts < COALESCE(max_attempts, (%(limits)s::jsonb ->> name)::int, %(max)s)
             THEN 'queued' ELSE 'failed' END AS status
    FROM {axa_queue}
    WHERE status = 'running' AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
      AND (pg_postmaster_start_time() < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
           OR updated_at < pg_postmaster_start_time() - make_interval(secs => %(stale)s))
    ORDER BY updated_at""")
"""What stale recovery would do now, changing nothing (for a dry run)."""

PURGE = statement("""WITH doomed AS (
        SELECT id FROM {axa_queue}
        WHERE status IN ('completed', 'failed', 'cancelled')
          AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s)
        LIMIT %(batch)s FOR UPDATE SKIP LOCKED
    ), attempts_gone AS (
        DELETE FROM {axa_queue_attempts} WHERE job_id IN (SELECT id FROM doomed)
    ), steps_gone AS (
        DELETE FROM {axa_queue_steps} WHERE job_id IN (SELECT id FROM doomed)
    ), deps_gone AS (
        DELETE FROM {axa_queue_deps} WHERE child IN (SELECT id FROM doomed)
    ), members_gone AS (
        DELETE FROM {axa_workflows} WHERE job IN (SELECT id FROM doomed)
    )
    DELETE FROM {axa_queue} q USING doomed WHERE q.id = doomed.id""")
"""Delete one bounded batch of finished rows older than the retention period (never a
job in review), and their attempts (`attempts_gone`), steps (`steps_gone`), their own dependencies
(`deps_gone`: a finished job's are never read again) and workflow places
(`members_gone`) in the same statement; repeated
until a batch comes back short (its row count is the jobs')."""

PURGEABLE = statement("""SELECT count(*) AS purgeable FROM {axa_queue}
    WHERE status IN ('completed', 'failed', 'cancelled')
      AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s)""")
"""How many rows retention would delete now (for a dry run)."""


INDEX_SIZES = statement("""SELECT n.nspname AS schema, ic.relname AS index, i.indisvalid AS valid,
        pg_relation_size(i.indexrelid) AS bytes,
        CASE WHEN ic.reltuples >= 0 THEN
            (2 + ceil(ic.reltuples * ((8 + w.width + 7) / 8 * 8 + 4) / ((8192 - 24 - 16) * 0.9)))::bigint
            * current_setting('block_size')::bigint
        END AS fresh_bytes,
        pg_has_role(t.relowner, 'MEMBER') AS owned,
        (SELECT extract(epoch FROM now() - min(a.xact_start)) FROM pg_stat_activity a
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
           AND a.backend_xmin IS NOT NULL
           AND a.pid NOT IN (SELECT v.pid FROM pg_stat_progress_vacuum v)) AS oldest_snapshot
    FROM pg_index i
    JOIN pg_class ic ON ic.oid = i.indexrelid
    JOIN pg_class t ON t.oid = i.indrelid
    JOIN pg_namespace n ON n.oid = ic.relnamespace
    CROSS JOIN LATERAL (
        SELECT COALESCE(sum(COALESCE(s.avg_width, NULLIF(a.attlen, -1), 8)), 0)::int AS width
        FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, position)
        LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
        LEFT JOIN pg_stats s
            ON s.schemaname = n.nspname AND s.tablename = t.relname AND s.attname = a.attname
        WHERE k.position <= i.indnkeyatts
    ) w
    WHERE i.indrelid = {'axa_queue'}::regclass
    ORDER BY ic.relname""")
"""The indexes of `axa_queue`: each one's size on disk (`bytes`) beside what a fresh
build of it would take (`fresh_bytes`), whether it is valid (a `REINDEX
CONCURRENTLY` stopped half way leaves an invalid copy, named `..._ccnew`, that every
write still pays for), whether this role owns the table (only an owner may rebuild its
indexes), and how long (seconds) the oldest snapshot another session of this database
holds has been open (`NULL`: none, or none this role may see), leaving out a lazy
`VACUUM` at work (`pg_stat_progress_vacuum`, autovacuum's too): its snapshot holds back
no other vacuum, and a vacuum of a large table (a day's history partition, under its
cost limits) may run for minutes.

Why: a B-tree never gives back pages. While a long transaction holds back vacuum, every
job that passes through the hot table leaves its entries in each index; once vacuum may
remove them the pages are empty and reused, but the index keeps its size, and every
scan of it its height. `fresh_bytes` is the planner's count of live entries
(`reltuples`, which vacuum and analyze keep) times one entry's bytes on a leaf page --
its 8-byte header, the key columns' average widths (`pg_stats`; an expression's, 8),
aligned to 8, and its 4-byte line pointer -- over a page filled as a build fills it
(90%, less the page header and the B-tree's own 16 bytes), plus the meta page and a
root. It overestimates an index whose keys repeat (deduplication stores them once),
so it errs towards leaving an index alone."""

REINDEX_LOCK = statement(
    """SELECT pg_try_advisory_lock(1635213690, {'axa_queue'}::regclass::oid::int4) AS locked"""
)
"""Take the rebuild's lock (a session lock: `REINDEX CONCURRENTLY` runs outside any
transaction), so that one process at a time rebuilds the queue's indexes; `false` when
another holds it."""

REINDEX_WAIT = "SET lock_timeout = '2s'"
"""How long a rebuild (and the drop of a copy one left) waits for a lock, or for an
older transaction to end, before it gives up until the next round: `REINDEX
CONCURRENTLY` waits for every transaction that began before it, and it must not sit
behind a long report holding vacuum back (its lock would keep vacuum off the table)."""

REINDEX_WAIT_RESET = "RESET lock_timeout"
"""The session's own `lock_timeout` again, once the rebuilds are done."""

REINDEX_UNLOCK = statement(
    """SELECT pg_advisory_unlock(1635213690, {'axa_queue'}::regclass::oid::int4) AS unlocked"""
)
"""Let the rebuild's lock go."""


def reindex(schema: str, index: str) -> pgsql.Composed:
    """`REINDEX INDEX CONCURRENTLY` of `index` in `schema` (names as `INDEX_SIZES` gave
    them): a new copy is built beside the old one while jobs are queued, claimed and
    ended as usual, then swapped in; its waits are bounded by the session's
    `lock_timeout`."""
    return pgsql.SQL("REINDEX INDEX CONCURRENTLY {}").format(pgsql.Identifier(schema, index))


def drop_index(schema: str, index: str) -> pgsql.Composed:
    """`DROP INDEX CONCURRENTLY` of `index` in `schema`: the invalid copy a rebuild
    stopped half way left behind (`INDEX_SIZES`)."""
    return pgsql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(pgsql.Identifier(schema, index))
