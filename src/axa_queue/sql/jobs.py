"""The jobs table's statements of the `jobs` package: queuing jobs (one, many, by
COPY, with unique keys) and reading them back (counting them is `counts`')."""

from __future__ import annotations

from string import Template

from .attempts import RUNS
from .naming import statement
from .steps import STEPS
from .workers import worker_gone

__all__ = [
    "ENQUEUE",
    "ENQUEUE_COPY",
    "ENQUEUE_MANY",
    "ENQUEUE_UNIQUE",
    "ENQUEUE_UNIQUE_ONE",
    "JOB",
    "JOBS",
    "RESULT",
    "TASK_RESULT",
]

# --- Enqueue -----------------------------------------------------------------------------

ENQUEUE = statement("""INSERT INTO {axa_queue} (id, name, args, max_attempts, priority, run_at, timeout_ms,
                           trace_context)
    VALUES (%(id)s, %(name)s, %(args)s::text::jsonb, %(max_attempts)s, %(priority)s,
            COALESCE(%(at)s, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s)),
            %(timeout_ms)s, %(trace_context)s::text::jsonb)""")
"""Queue one job; run_at is the given time, or now plus a delay on the database's clock.
`trace_context` is the W3C trace context of the enqueue (NULL unless a tracing hook is
installed and a trace is active, see `tracing`). The JSON values travel as text
(`::text::jsonb`), so a `jsonb` codec an asyncpg user set on their connection cannot
encode them a second time."""

ENQUEUE_MANY = statement("""INSERT INTO {axa_queue} (id, name, args, max_attempts, priority, run_at, timeout_ms,
                           trace_context)
    SELECT j.id, j.name, j.args::jsonb, j.max_attempts, j.priority,
           COALESCE(j.at, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => j.delay)),
           j.timeout_ms, %(trace_context)s::jsonb
    FROM unnest(%(id)s::uuid[], %(name)s::text[], %(args)s::text[], %(max_attempts)s::int[],
                %(priority)s::smallint[], %(at)s::timestamptz[], %(delay)s::float8[],
                %(timeout_ms)s::bigint[])
         AS j(id, name, args, max_attempts, priority, at, delay, timeout_ms)""")
"""Queue many jobs in one statement (one notification, one round trip); they share one
`trace_context`, the enqueue's (or NULL), as `ENQUEUE` stores it."""

ENQUEUE_UNIQUE = statement("""WITH jobs AS (
        SELECT * FROM unnest(%(id)s::uuid[], %(name)s::text[], %(args)s::text[],
                             %(max_attempts)s::int[], %(priority)s::smallint[],
                             %(at)s::timestamptz[], %(delay)s::float8[], %(timeout_ms)s::bigint[],
                             %(unique_key)s::text[], %(unique_for_ms)s::bigint[], %(key)s::text[])
            AS j(id, name, args, max_attempts, priority, at, delay, timeout_ms, unique_key,
                 unique_for_ms, key)
    ), expired AS (
        UPDATE {axa_queue} SET unique_key = NULL
        WHERE unique_key = ANY(%(unique_key)s::text[]) AND unique_for_ms IS NOT NULL
          AND status IN ('completed', 'failed', 'cancelled')
          AND updated_at + make_interval(secs => unique_for_ms / 1000.0)
              <= COALESCE(%(now)s::timestamptz, now())
        RETURNING id
    ), inserted AS (
        INSERT INTO {axa_queue} (id, name, args, max_attempts, priority, run_at, timeout_ms,
                               trace_context, unique_key, unique_for_ms, key)
        SELECT j.id, j.name, j.args::jsonb, j.max_attempts, j.priority,
               COALESCE(j.at, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => j.delay)),
               j.timeout_ms, %(trace_context)s::jsonb, j.unique_key, j.unique_for_ms, j.key
        FROM jobs j WHERE (SELECT count(*) FROM expired) >= 0
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
            AND (status IN ('queued', 'running', 'needs_review') OR unique_for_ms IS NOT NULL)
        DO NOTHING
        RETURNING id, unique_key
    )
    SELECT id::text AS id, unique_key, true AS queued FROM inserted
    UNION ALL
    SELECT q.id::text, q.unique_key, false FROM {axa_queue} q
    WHERE q.unique_key = ANY(%(unique_key)s::text[])
      AND (q.status IN ('queued', 'running', 'needs_review') OR q.unique_for_ms IS NOT NULL)
      AND q.id <> ALL(ARRAY(SELECT id FROM expired))""")
"""Queue jobs some of which have a unique key (`NewJob.unique_key`), in one statement:
each job whose key no other job holds is queued; one whose key is held writes nothing.
Returns the jobs queued (`queued` true) and the holders of the batch's keys that the
statement's snapshot sees (`queued` false); the client pairs them with its jobs, in
order, by key. The batch holds each key once (`jobs.enqueue_unique_call` sends the
first job of a key, the others get its answer).

Safe under any concurrency: the unique index `axa_queue_unique` decides, never a read
before the write. `ON CONFLICT ... DO NOTHING` names the index's predicate (an
inference of a partial index needs it), and waits for a transaction that inserted the
same key to end: committed, its job holds the key; rolled back, ours is queued. A
holder committed after this statement's snapshot was taken is not among the holders it
reads, so a job can come back neither queued nor held: the client sends the statement
again for those (under READ COMMITTED each statement has a new snapshot; under
REPEATABLE READ or SERIALIZABLE PostgreSQL raises a serialization failure instead,
which the caller's transaction retries as it retries any). A finished holder whose
`unique_for` has passed by `now` loses its key first (`expired`, evaluated before the
insert, which sees that holder's new version, deleted by this very transaction, as no
conflict). Rows without a key go in as `ENQUEUE_MANY` puts them: no index entry, no
conflict."""

ENQUEUE_UNIQUE_ONE = statement("""WITH inserted AS (
        INSERT INTO {axa_queue} (id, name, args, max_attempts, priority, run_at, timeout_ms,
                               trace_context, unique_key, unique_for_ms, key)
        VALUES (%(id)s, %(name)s, %(args)s::text::jsonb, %(max_attempts)s, %(priority)s,
                COALESCE(%(at)s, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s)),
                %(timeout_ms)s, %(trace_context)s::text::jsonb, %(unique_key)s, %(unique_for_ms)s,
                %(key)s)
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
            AND (status IN ('queued', 'running', 'needs_review') OR unique_for_ms IS NOT NULL)
        DO NOTHING
        RETURNING id
    ), expired AS (
        UPDATE {axa_queue} SET unique_key = NULL
        WHERE NOT EXISTS (SELECT FROM inserted)
          AND unique_key = %(unique_key)s AND unique_for_ms IS NOT NULL
          AND status IN ('completed', 'failed', 'cancelled')
          AND updated_at + make_interval(secs => unique_for_ms / 1000.0)
              <= COALESCE(%(now)s::timestamptz, now())
        RETURNING id
    ), again AS (
        INSERT INTO {axa_queue} (id, name, args, max_attempts, priority, run_at, timeout_ms,
                               trace_context, unique_key, unique_for_ms, key)
        SELECT %(id)s, %(name)s, %(args)s::text::jsonb, %(max_attempts)s, %(priority)s,
               COALESCE(%(at)s, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s)),
               %(timeout_ms)s, %(trace_context)s::text::jsonb, %(unique_key)s, %(unique_for_ms)s,
               %(key)s::text
        WHERE EXISTS (SELECT FROM expired)
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
            AND (status IN ('queued', 'running', 'needs_review') OR unique_for_ms IS NOT NULL)
        DO NOTHING
        RETURNING id
    )
    SELECT id::text AS id, true AS queued FROM inserted
    UNION ALL
    SELECT id::text, true FROM again
    UNION ALL
    SELECT q.id::text, false FROM {axa_queue} q
    WHERE NOT EXISTS (SELECT FROM inserted) AND NOT EXISTS (SELECT FROM again)
      AND q.unique_key = %(unique_key)s
      AND (q.status IN ('queued', 'running', 'needs_review') OR q.unique_for_ms IS NOT NULL)
      AND NOT (q.status IN ('completed', 'failed', 'cancelled') AND q.unique_for_ms IS NOT NULL
               AND q.updated_at + make_interval(secs => q.unique_for_ms / 1000.0)
                   <= COALESCE(%(now)s::timestamptz, now()))""")
"""Queue one job with a unique key (`NewJob.unique_key`), in one statement of scalar
parameters: what `enqueue` sends for a keyed job, as `ENQUEUE` for one without. Returns
one row: the job's id with `queued` true, or the holder's with `queued` false (nothing
written); or no row: the holder committed after the statement's snapshot, send it again.

It inserts first: when the key is free (the usual case) the insert is all that runs, an
index probe and an index entry more than `ENQUEUE`'s, which the other steps' one-time
filters skip. Safe under any concurrency: the unique index `axa_queue_unique` decides,
never a read before the write; `ON CONFLICT ... DO NOTHING` names the index's predicate
(an inference of a partial index needs it) and waits for a transaction that inserted the
same key to end: committed, its job holds the key; rolled back, ours is queued. Only
when the insert was refused: a finished holder whose `unique_for` has passed by `now`
loses its key (`expired`) and the job is inserted again (`again`), which sees that
holder's new version, deleted by this very transaction, as no conflict. Then the holder
is read from the statement's snapshot: a holder committed after it is not there (under
READ COMMITTED the next statement has a new snapshot; under REPEATABLE READ or
SERIALIZABLE PostgreSQL raises a serialization failure instead, which the caller's
transaction retries as it retries any), nor is a finished holder past its `unique_for`
that another transaction freed first (ours found its key cleared): both come back as
no row, and the job is sent again."""

ENQUEUE_COPY = statement("""COPY {axa_queue} (id, name, args, max_attempts, priority, timeout_ms, trace_context)
    FROM STDIN (FORMAT BINARY)""")
"""Queue many jobs due now in one statement, faster than `ENQUEUE_MANY` from a few dozen
jobs up (no array to build and unpack, no expression per row): `run_at` takes its
default, `now()`, the transaction's start as `ENQUEUE_MANY` reads it. The notify
trigger is a statement trigger, which COPY fires once, as INSERT does: one
notification. Used only for jobs without `run_in`/`run_at`, on psycopg connections."""

# --- Reads -------------------------------------------------------------------------------
# A job is in `axa_queue` (live, or finished less than `keep_recent` ago) or, moved, in
# `axa_queue_history`, never both: every read here reads both, in one statement, whose
# one snapshot sees a job once, in one table or the other (a move is one statement).

_JOB_COLUMNS = """id, name, status, attempts, max_attempts, priority, error, timeout_ms,
    unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at, EXTRACT(EPOCH FROM started_at) AS started_at,
    EXTRACT(EPOCH FROM created_at) AS created_at, EXTRACT(EPOCH FROM updated_at) AS updated_at,
    run_worker, run_attempt, run_host, run_pid"""
"""The columns `JOB` and `JOBS` read: every one but the arguments and the result."""

JOB = statement(
    Template("""SELECT j.*, (SELECT COALESCE(json_agg(r ORDER BY r.attempt), '[]') FROM ($runs) r) AS runs,
        (SELECT COALESCE(json_agg(s ORDER BY s.recorded_at, s.name), '[]') FROM ($steps) s) AS steps,
        $gone AS worker_gone
    FROM (SELECT {columns} FROM {axa_queue} WHERE id = %(id)s
          UNION ALL
          SELECT {columns} FROM {axa_queue_history} WHERE id = %(id)s
          LIMIT 1) j""").substitute(runs=RUNS, steps=STEPS, gone=worker_gone("j", "j.updated_at")),
    columns=_JOB_COLUMNS,
)
"""One job, without its arguments, from `axa_queue` or, moved, from the history (one
probe of `axa_queue_history_id` per day partition, only when it is not in `axa_queue`).
Times come as epoch seconds (exact numeric), which any row can be read as: a
`timestamptz` PostgreSQL holds but Python's `datetime` cannot (`infinity`, past year
9999, or year 9999 shown in a session time zone east of UTC), written by another
client, would otherwise fail the read (`jobs.moment` clamps it). With its attempts
(`runs`: a JSON array of `attempts.RUNS`' rows, oldest first) and its steps (`steps`:
`steps.STEPS`' rows, without results, in the order recorded), in the same snapshot,
and whether it is a run of a process that is gone (`worker_gone`, `workers.worker_gone`:
`%(now)s`, `%(beat_ms)s`)."""

RESULT = statement("""SELECT status, result FROM {axa_queue} WHERE id = %(id)s
    UNION ALL
    SELECT status, result FROM {axa_queue_history} WHERE id = %(id)s
    LIMIT 1""")
"""One job's state and result (a completed run's return value as JSON, or NULL), moved
or not: only for `Queue.result`, which returns it to its caller and never shows it."""

_JOBS_BRANCH = """(SELECT {columns}, {table}.created_at AS sort_at FROM {{{table}}}
         WHERE {test}
         ORDER BY {table}.created_at DESC, id LIMIT %(limit)s)"""
"""One branch of `JOBS`: the newest `limit` jobs of one test in one table."""


def _asked(state: str) -> str:
    """The one-time filter of a branch of `state`: no state asked, or this one."""
    return f"(%(state)s::text IS NULL OR %(state)s::text = '{state}')"


_ANY_NAME = "(%(name)s::text IS NULL OR name = %(name)s)"

_JOBS_TESTS = (
    ("axa_queue", f"status = 'running' AND {_asked('running')} AND {_ANY_NAME}"),
    ("axa_queue", f"status = 'needs_review' AND {_asked('needs_review')} AND {_ANY_NAME}"),
    ("axa_queue", f"status = 'blocked' AND {_asked('blocked')} AND {_ANY_NAME}"),
    (
        "axa_queue",
        "status IN ('completed', 'failed', 'cancelled') "
        f"AND (%(state)s::text IS NULL OR status = %(state)s) AND {_ANY_NAME}",
    ),
    *(
        ("axa_queue_history", f"status = '{state}' AND {_asked(state)} AND {name}")
        for state in ("completed", "failed", "cancelled")
        for name in ("%(name)s::text IS NULL", "%(name)s::text IS NOT NULL AND name = %(name)s")
    ),
)
"""`JOBS`' branches but the queued jobs': each state of `axa_queue` through
its partial index (blocked jobs newest first through `axa_queue_blocked_created`,
migration 21), and each finished state of the history without a name (through
`axa_queue_history_status_created`) and with one (`axa_queue_history_name_created`)."""

_QUEUED = (
    """(SELECT q.* FROM queued_names n CROSS JOIN LATERAL (
            SELECT """  # noqa: S608
    + _JOB_COLUMNS
    + """, axa_queue.created_at AS sort_at FROM {axa_queue}
            WHERE status = 'queued' AND name = n.name
            ORDER BY axa_queue.created_at DESC, id LIMIT %(limit)s) q
         ORDER BY q.sort_at DESC, q.id LIMIT %(limit)s)"""
)
"""The queued jobs' branch: the newest `limit` of each name asked (`queued_names`)."""

JOBS = statement(
    """WITH RECURSIVE names AS (
        (SELECT name FROM {axa_queue}
         WHERE status = 'queued' AND """  # noqa: S608
    + _asked("queued")
    + """ AND %(name)s::text IS NULL
         ORDER BY name LIMIT 1)
        UNION ALL
        SELECT (SELECT q.name FROM {axa_queue} q WHERE q.status = 'queued' AND q.name > names.name
                ORDER BY q.name LIMIT 1)
        FROM names WHERE names.name IS NOT NULL
    ), queued_names AS (
        SELECT name FROM names WHERE name IS NOT NULL
        UNION ALL
        SELECT %(name)s::text WHERE %(name)s::text IS NOT NULL AND """
    + _asked("queued")
    + """
    )
    SELECT id, name, status, attempts, max_attempts, priority, error, timeout_ms, unique_key,
    unique_for_ms, given_back, run_at, started_at, created_at, updated_at, """
    + worker_gone("jobs", "jobs.updated_at")
    + """ AS worker_gone
    FROM (
        """
    + "\n        UNION ALL\n        ".join(
        [_QUEUED]
        + [
            _JOBS_BRANCH.format(columns=_JOB_COLUMNS, table=table, test=test)
            for table, test in _JOBS_TESTS
        ]
    )
    + """
    ) jobs ORDER BY sort_at DESC, id LIMIT %(limit)s"""
)
"""The newest jobs (by creation), moved or not, optionally of one state and name,
without their arguments; times as epoch seconds, as `JOB` reads them, so one odd row
never breaks the listing. The newest `limit` of each branch, then the newest of all:
never a sort of every row (figures in docs/performance.md). A running job says whether
its process is gone (`worker_gone`, two primary-key probes for each running job listed).

Each branch names its status as a literal and tests the name as an equality or not at
all, so even a generic plan (the queue's connections force them) reads the index made
for it (migration 12), and its `%(state)s` and `%(name)s` tests are one-time filters
that skip it unread when it is not asked for: the running, in review, blocked and finished jobs still in
`axa_queue` (few: they move after `keep_recent`) sorted as read; each finished state
of the history through `axa_queue_history_status_created`, or, of one name,
`axa_queue_history_name_created` (each day partition's newest, merged). Queued jobs
are read through `axa_queue_queued_created` (name, then newest first): the names with
queued jobs found by skipping from one to the next in it (`names`, a loose index scan,
one probe a name), or the name asked, then the newest `limit` of each name: a page of
each name, never a walk of every queued job (the names with queued jobs times `limit`
rows at most, for a backlog of millions)."""

TASK_RESULT = statement(
    """SELECT {columns} FROM {axa_queue} WHERE id = %(id)s
    UNION ALL
    SELECT {columns} FROM {axa_queue_history} WHERE id = %(id)s
    LIMIT 1""",
    columns="""id, name, args, status, error, attempts, priority, result,
    EXTRACT(EPOCH FROM run_at) AS run_at, EXTRACT(EPOCH FROM started_at) AS started_at,
    EXTRACT(EPOCH FROM created_at) AS created_at, EXTRACT(EPOCH FROM updated_at) AS updated_at""",
)
"""One job, moved or not, as Django's tasks framework reports it
(`axa_queue.contrib.django`'s `get_result`): with its arguments and its result, which
Django's `TaskResult` carries for the application's own code (never logged or shown);
times as epoch seconds, as `JOB` reads them."""
