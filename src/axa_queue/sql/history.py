"""The history table's statements: making its day partitions ahead, moving finished
jobs out of `axa_queue` in bounded batches, and dropping the days past retention.

A finished job (completed, failed, cancelled) stays in `axa_queue` for
`QueueOptions.keep_recent` after it finished, and longer while it holds its unique key
(`unique_for`); then `HISTORY_MOVE` moves it to `axa_queue_history`, one statement per
batch. A job is in one table or the other, never both: the reads of `jobs` read both
in one statement, whose one snapshot sees each job once.
"""

from __future__ import annotations

from .naming import statement

__all__ = [
    "HISTORY_COLUMNS_MOVED",
    "HISTORY_DAYS",
    "HISTORY_DAYS_PAST",
    "HISTORY_DROP",
    "HISTORY_FIRST_DAY",
    "HISTORY_LOCK_TIMEOUT",
    "HISTORY_MOVABLE",
    "HISTORY_MOVE",
    "HISTORY_PURGEABLE",
]

HISTORY_COLUMNS_MOVED = (
    "id, name, args, status, error, run_at, started_at, created_at, updated_at, attempts, "
    "max_attempts, priority, timeout_ms, trace_context, result, unique_key, unique_for_ms, "
    "ahead, given_back, run_worker, run_attempt, run_host, run_pid, key"
)
"""The columns a move carries, named (never `*`): the jobs table's of migrations 1 to 8
and 18.
A later migration adding a column to `axa_queue` adds it to `axa_queue_history` and
here, in the same release; until then an older worker's move leaves it behind."""

HISTORY_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true) AS lock_timeout"
"""`SET LOCAL lock_timeout` for the transaction making or dropping partitions: attaching
one waits for no reader of the history table, but dropping one does; it gives up after
this long and housekeeping tries again at its next round."""

HISTORY_FIRST_DAY = statement("""WITH f AS MATERIALIZED (
        SELECT GREATEST(b.earliest, LEAST(b.today,
            ((SELECT min(q.updated_at) FROM {axa_queue} q
              WHERE q.status IN ('completed', 'failed', 'cancelled')
                AND q.updated_at >= b.earliest::timestamp AT TIME ZONE 'UTC')
             AT TIME ZONE 'UTC')::date)) AS first_day, b.today
        FROM (SELECT GREATEST(
                         ((COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(retention)s))
                          AT TIME ZONE 'UTC')::date,
                         (COALESCE(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date - %(most)s) AS earliest,
                     (COALESCE(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date AS today) b
    )
    SELECT f.first_day, f.first_day::timestamp AT TIME ZONE 'UTC' AS since,
        EXISTS (SELECT FROM generate_series(f.first_day::timestamp,
                                            (f.today + %(ahead)s)::timestamp, interval '1 day') d
                WHERE NOT EXISTS (
                    SELECT FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                    WHERE i.inhparent = {'axa_queue_history'}::regclass
                      AND c.relname = 'axa_queue_history_' || to_char(d, 'YYYYMMDD'))) AS missing
    FROM f""")
"""The first day (UTC) whose history partition a move needs: the day the oldest finished
job still in `axa_queue` and inside the retention finished, or today when there is none;
the retention's first day is the day `retention` before `now` (at most `most` days
back). The oldest is the first entry of `axa_queue_finished` from that day on. So a new
database gets today's partition and the days ahead (`HISTORY_DAYS`), not one empty
table for each day of its retention; a database upgraded with a month of finished jobs
gets the days they finished on, and none for jobs older than the retention, which
`PURGE` deletes. Read before the transaction that makes the partitions, so that
transaction holds no lock on `axa_queue` while it waits for its DDL's. Under a snapshot
held back, the entries of jobs already moved are walked first, as `HISTORY_MOVE`'s
batches walk them (20,000 such entries: about 19,900 buffers, against 101,000 for the
move's first batch of 5,000; 4 buffers without them).

Also when that day began (`since`, as `HISTORY_DAYS` says it) and whether a partition
from that day to `ahead` days after today is `missing` (the catalog's list of the
history's partitions): when none is, a move makes none, and takes neither the
partitions' lock nor a transaction for it (every move of a long-running worker). The
first day is computed once (`MATERIALIZED`): inlined, its read of `axa_queue_finished`
ran once for each of the three columns that use it."""

HISTORY_DAYS = statement("""SELECT {axa_queue_history_days}({'axa_queue_history'}::regclass,
        %(first_day)s::date,
        (COALESCE(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date + %(ahead)s) AS made,
    %(first_day)s::date::timestamp AT TIME ZONE 'UTC' AS since""")
"""Make the history's missing day partitions from `first_day` (`HISTORY_FIRST_DAY`) to
`ahead` days after `now` (`axa_queue_history_days`); returns how many it made and when
`first_day` began (`since`): a move takes only jobs finished since then, whose day has
a partition. A job that finishes after `HISTORY_FIRST_DAY` read, dated before `since`
(an ending whose transaction began before midnight), waits for the next move, which
reads it as the oldest."""

HISTORY_MOVE = statement(
    """WITH picked AS (
        SELECT id FROM {axa_queue}
        WHERE status IN ('completed', 'failed', 'cancelled')
          AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(keep)s)
          AND updated_at >= %(since)s::timestamptz
          AND (unique_key IS NULL OR unique_for_ms IS NULL
               OR updated_at + make_interval(secs => unique_for_ms / 1000.0)
                  <= COALESCE(%(now)s::timestamptz, now()))
        ORDER BY axa_queue.updated_at
        LIMIT %(batch)s FOR UPDATE SKIP LOCKED
    ), moved AS (
        DELETE FROM {axa_queue}
        WHERE id = ANY(ARRAY(SELECT id FROM picked)) AND status IN ('completed', 'failed', 'cancelled')
        RETURNING {columns}
    ), stored AS (
        INSERT INTO {axa_queue_history} ({columns})
        SELECT {columns} FROM moved
        RETURNING updated_at
    )
    SELECT count(*) AS moved, max(updated_at) AS newest FROM stored""",
    columns=HISTORY_COLUMNS_MOVED,
)
"""Move one bounded batch of finished jobs to the history, in one statement: those
finished (`updated_at`, through `axa_queue_finished`, oldest first) more than `keep`
seconds before `now` and since `since` (`HISTORY_DAYS`: their day has a partition;
older ones are left to `PURGE`), but not a job whose unique key is still held
(`unique_for` not passed: `axa_queue_unique` covers only `axa_queue`, so it stays there
until its time passes). Jobs in review are not finished and never move. Returns how
many it moved (`moved`) and when the newest of them finished (`newest`), repeated until
a batch comes back short, each batch from the last one's `newest` on (`since`): the jobs
it passed over (a unique key still held, a row locked by another mover) are not read
again by every batch (200,000 held jobs doubled the cost of moving a million), only by
the next move.

Any number of processes may move at once: each locks its batch `FOR UPDATE SKIP
LOCKED`, so no two take the same job, and a row another statement changed or moved
since the snapshot is read again locked (under READ COMMITTED) and left if no longer
finished (the `DELETE` checks again) or gone. A retry or an ending holding the row makes
the move skip it, and the retry goes on with the row in `axa_queue`."""

HISTORY_MOVABLE = statement("""SELECT count(*) AS movable FROM {axa_queue}
    WHERE status IN ('completed', 'failed', 'cancelled')
      AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(keep)s)
      AND updated_at >= %(since)s::timestamptz
      AND (unique_key IS NULL OR unique_for_ms IS NULL
           OR updated_at + make_interval(secs => unique_for_ms / 1000.0)
              <= COALESCE(%(now)s::timestamptz, now()))""")
"""How many jobs `HISTORY_MOVE` would move now (for a dry run)."""

HISTORY_DAYS_PAST = statement("""SELECT EXISTS (
    SELECT FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = {'axa_queue_history'}::regclass
      AND c.relname ~ '^axa_queue_history_[0-9]{{8}}$'
      AND c.relname < 'axa_queue_history_' || to_char(
          ((COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s))
           AT TIME ZONE 'UTC')::date, 'YYYYMMDD')) AS past""")
"""Whether the history has a day partition that `HISTORY_DROP` would drop now (named
for a day before the one `older_than` before `now`, as `axa_queue_history_drop` reads
the names), from the catalog alone: a round of housekeeping with none (nearly every
one) drops nothing, and sends neither the drop's transaction nor its deletions of the
days' attempts, steps and workflows."""

HISTORY_DROP = statement("""SELECT {axa_queue_history_drop}({'axa_queue_history'}::regclass,
    ((COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s))
     AT TIME ZONE 'UTC')::date) AS dropped""")
"""Drop the history's day partitions whose whole day is more than `older_than` seconds
before `now` (`axa_queue_history_drop`); returns how many jobs they held. Retention of
moved jobs is by the day: no row of the history is ever deleted one by one."""

HISTORY_PURGEABLE = statement("""SELECT count(*) AS purgeable FROM {axa_queue_history}
    WHERE updated_at < ((COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s))
                        AT TIME ZONE 'UTC')::date::timestamp AT TIME ZONE 'UTC'""")
"""How many moved jobs `HISTORY_DROP` would drop now (for a dry run): those of the days
before the one `older_than` before `now` (the partitions before it, by pruning)."""
