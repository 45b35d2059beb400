"""Every SQL statement axa-queue sends at run time, each named and with a line saying
what it does. The statements that make the tables are in the `schema` package.

Nothing here is built from values: parameters go in as `%s` placeholders. Names are
unqualified, so the connection's `search_path` decides the schema, unless the queue is
given one (`QueueOptions.schema`): then `in_schema` names it in each statement.

Statements that read or stamp the time take it as `%(now)s`, read as
`COALESCE(%(now)s::timestamptz, now())` (or `clock_timestamp()` where that is the
statement's clock): NULL, what the package always sends, is the database's clock; a
test passes a later time to let time pass without waiting for it.
"""

from __future__ import annotations

import functools
import re

from psycopg import sql as pgsql

__all__ = ["CANCEL_CHANNEL", "CHANNEL", "DONE_CHANNEL", "in_schema"]

CHANNEL = "axa_queue"
"""The LISTEN/NOTIFY channel; the payload is `<schema> <seconds until the earliest new job>`."""

DONE_CHANNEL = "axa_queue_done"
"""The channel of finished jobs, for waiters; the payload is `<the table's oid> <id> <id>
...` (`EXCHANGE`, `CANCEL` and `MARK_LOST` name one job each), or `<oid> *` (look at
every job waited for: stale recovery finishing more than 150). Sent only while someone
waits, but by `CANCEL`, `MARK_LOST` and `RECOVER_STALE`, which are rare."""

CANCEL_CHANNEL = "axa_queue_cancel"
"""The channel of running jobs a person cancelled (`CANCEL`); the payload is the job's
id. Workers listen to it beside `CHANNEL`; one running the job checks it with a
heartbeat at once (`HEARTBEAT` says which runs are cancelled), so a notification for
another schema's job of the same id costs one heartbeat and stops nothing."""

CURRENT_SCHEMA = "SELECT current_schema()"
"""The schema the tables resolve to, which notifications name (unless the queue is
given its schema)."""

# --- Enqueue ---------------------------------------------------------------------------

ENQUEUE = """INSERT INTO axa_queue (id, name, args, max_attempts, priority, run_at, timeout_ms,
                           trace_context)
    VALUES (%(id)s, %(name)s, %(args)s::text::jsonb, %(max_attempts)s, %(priority)s,
            COALESCE(%(at)s, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s)),
            %(timeout_ms)s, %(trace_context)s::text::jsonb)"""
"""Queue one job; run_at is the given time, or now plus a delay on the database's clock.
`trace_context` is the W3C trace context of the enqueue (NULL unless a tracing hook is
installed and a trace is active, see `tracing`). The JSON values travel as text
(`::text::jsonb`), so a `jsonb` codec an asyncpg user set on their connection cannot
encode them a second time."""

ENQUEUE_MANY = """INSERT INTO axa_queue (id, name, args, max_attempts, priority, run_at, timeout_ms,
                           trace_context)
    SELECT j.id, j.name, j.args::jsonb, j.max_attempts, j.priority,
           COALESCE(j.at, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => j.delay)),
           j.timeout_ms, %(trace_context)s::jsonb
    FROM unnest(%(id)s::uuid[], %(name)s::text[], %(args)s::text[], %(max_attempts)s::int[],
                %(priority)s::smallint[], %(at)s::timestamptz[], %(delay)s::float8[],
                %(timeout_ms)s::bigint[])
         AS j(id, name, args, max_attempts, priority, at, delay, timeout_ms)"""
"""Queue many jobs in one statement (one notification, one round trip); they share one
`trace_context`, the enqueue's (or NULL), as `ENQUEUE` stores it."""

ENQUEUE_UNIQUE = """WITH jobs AS (
        SELECT * FROM unnest(%(id)s::uuid[], %(name)s::text[], %(args)s::text[],
                             %(max_attempts)s::int[], %(priority)s::smallint[],
                             %(at)s::timestamptz[], %(delay)s::float8[], %(timeout_ms)s::bigint[],
                             %(unique_key)s::text[], %(unique_for_ms)s::bigint[])
            AS j(id, name, args, max_attempts, priority, at, delay, timeout_ms, unique_key,
                 unique_for_ms)
    ), expired AS (
        UPDATE axa_queue SET unique_key = NULL
        WHERE unique_key = ANY(%(unique_key)s::text[]) AND unique_for_ms IS NOT NULL
          AND status IN ('completed', 'failed', 'cancelled')
          AND updated_at + make_interval(secs => unique_for_ms / 1000.0)
              <= COALESCE(%(now)s::timestamptz, now())
        RETURNING id
    ), inserted AS (
        INSERT INTO axa_queue (id, name, args, max_attempts, priority, run_at, timeout_ms,
                               trace_context, unique_key, unique_for_ms)
        SELECT j.id, j.name, j.args::jsonb, j.max_attempts, j.priority,
               COALESCE(j.at, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => j.delay)),
               j.timeout_ms, %(trace_context)s::jsonb, j.unique_key, j.unique_for_ms
        FROM jobs j WHERE (SELECT count(*) FROM expired) >= 0
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
            AND (status IN ('queued', 'running', 'needs_review') OR unique_for_ms IS NOT NULL)
        DO NOTHING
        RETURNING id, unique_key
    )
    SELECT id::text AS id, unique_key, true AS queued FROM inserted
    UNION ALL
    SELECT q.id::text, q.unique_key, false FROM axa_queue q
    WHERE q.unique_key = ANY(%(unique_key)s::text[])
      AND (q.status IN ('queued', 'running', 'needs_review') OR q.unique_for_ms IS NOT NULL)
      AND q.id <> ALL(ARRAY(SELECT id FROM expired))"""
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

ENQUEUE_UNIQUE_ONE = """WITH inserted AS (
        INSERT INTO axa_queue (id, name, args, max_attempts, priority, run_at, timeout_ms,
                               trace_context, unique_key, unique_for_ms)
        VALUES (%(id)s, %(name)s, %(args)s::text::jsonb, %(max_attempts)s, %(priority)s,
                COALESCE(%(at)s, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s)),
                %(timeout_ms)s, %(trace_context)s::text::jsonb, %(unique_key)s, %(unique_for_ms)s)
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
            AND (status IN ('queued', 'running', 'needs_review') OR unique_for_ms IS NOT NULL)
        DO NOTHING
        RETURNING id
    ), expired AS (
        UPDATE axa_queue SET unique_key = NULL
        WHERE NOT EXISTS (SELECT FROM inserted)
          AND unique_key = %(unique_key)s AND unique_for_ms IS NOT NULL
          AND status IN ('completed', 'failed', 'cancelled')
          AND updated_at + make_interval(secs => unique_for_ms / 1000.0)
              <= COALESCE(%(now)s::timestamptz, now())
        RETURNING id
    ), again AS (
        INSERT INTO axa_queue (id, name, args, max_attempts, priority, run_at, timeout_ms,
                               trace_context, unique_key, unique_for_ms)
        SELECT %(id)s, %(name)s, %(args)s::text::jsonb, %(max_attempts)s, %(priority)s,
               COALESCE(%(at)s, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s)),
               %(timeout_ms)s, %(trace_context)s::text::jsonb, %(unique_key)s, %(unique_for_ms)s
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
    SELECT q.id::text, false FROM axa_queue q
    WHERE NOT EXISTS (SELECT FROM inserted) AND NOT EXISTS (SELECT FROM again)
      AND q.unique_key = %(unique_key)s
      AND (q.status IN ('queued', 'running', 'needs_review') OR q.unique_for_ms IS NOT NULL)
      AND NOT (q.status IN ('completed', 'failed', 'cancelled') AND q.unique_for_ms IS NOT NULL
               AND q.updated_at + make_interval(secs => q.unique_for_ms / 1000.0)
                   <= COALESCE(%(now)s::timestamptz, now()))"""
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

ENQUEUE_COPY = """COPY axa_queue (id, name, args, max_attempts, priority, timeout_ms, trace_context)
    FROM STDIN (FORMAT BINARY)"""
"""Queue many jobs due now in one statement, faster than `ENQUEUE_MANY` from a few dozen
jobs up (no array to build and unpack, no expression per row): `run_at` takes its
default, `now()`, the transaction's start as `ENQUEUE_MANY` reads it. The notify
trigger is a statement trigger, which COPY fires once, as INSERT does: one
notification. Used only for jobs without `run_in`/`run_at`, on psycopg connections."""

# --- Running jobs ----------------------------------------------------------------------

EXCHANGE = """WITH RECURSIVE endings AS (
        SELECT d.id, d.attempts, 'completed' AS status, NULL::text AS error, 0::float8 AS delay,
               NULL::jsonb AS result, NULL::bigint AS max_attempts
        FROM unnest(%(completed)s::uuid[], %(completed_attempts)s::int[]) AS d(id, attempts)
        UNION ALL
        SELECT * FROM json_to_recordset(%(endings)s::json)
            AS r(id uuid, attempts int, status text, error text, delay float8, result jsonb,
                 max_attempts bigint)
    ), finished AS (
        UPDATE axa_queue q
        SET status = r.status, error = r.error, result = r.result,
            max_attempts = CASE WHEN r.max_attempts IS NULL THEN q.max_attempts
                                ELSE LEAST(r.max_attempts, 2147483647)::int END,
            updated_at = COALESCE(%(now)s::timestamptz, now()),
            started_at = CASE WHEN r.status = 'queued' THEN NULL ELSE q.started_at END,
            run_at = CASE WHEN r.status = 'queued'
                          THEN COALESCE(%(now)s::timestamptz, now())
                               + make_interval(secs => CASE WHEN r.delay > 3155760000 THEN 3155760000
                                                            ELSE r.delay END)
                          ELSE q.run_at END
        FROM endings r
        WHERE q.id = ANY(ARRAY(SELECT id FROM endings)) AND q.id = r.id
          AND q.attempts = r.attempts AND q.status = (SELECT 'running')
        RETURNING q.id::text AS id, q.attempts,
            CASE WHEN q.status = 'queued' THEN false
                 WHEN NOT pg_try_advisory_xact_lock_shared(1635213687, 'axa_queue'::regclass::oid::int4)
                      THEN pg_notify('axa_queue_done', 'axa_queue'::regclass::oid::text || ' ' || q.id::text)
                           ::text IS NOT NULL
                 WHEN pg_try_advisory_lock(1635213688, 'axa_queue'::regclass::oid::int4)
                      THEN NOT pg_advisory_unlock(1635213688, 'axa_queue'::regclass::oid::int4)
                 ELSE pg_notify('axa_queue_done', 'axa_queue'::regclass::oid::text || ' ' || q.id::text)
                      ::text IS NOT NULL
            END AS told
    ), marked AS (
        UPDATE axa_queue q SET ahead = NULL
        FROM unnest(%(starts)s::uuid[], %(started_attempts)s::int[]) AS m(id, attempts)
        WHERE q.id = ANY(%(starts)s::uuid[]) AND q.id = m.id AND q.attempts = m.attempts
          AND q.ahead = m.attempts AND q.status = (SELECT 'running')
          AND q.id <> ALL(ARRAY(SELECT id FROM endings))
        RETURNING q.id
    ), levels(priority) AS (
        (SELECT priority FROM axa_queue WHERE status = 'queued' ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT q.priority FROM axa_queue q
                WHERE q.status = 'queued' AND q.priority < levels.priority
                ORDER BY q.priority DESC LIMIT 1)
        FROM levels WHERE levels.priority IS NOT NULL
    ), wanted AS (
        SELECT w.name, least(w.cap, %(free)s) AS cap
        FROM json_to_recordset(%(wanted)s::json) AS w(name text, cap int)
        WHERE %(free)s > 0
    ), candidates AS MATERIALIZED (
        SELECT j.id, j.priority, j.run_at, wanted.name, wanted.cap
        FROM wanted CROSS JOIN levels CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM axa_queue
            WHERE status = 'queued' AND name = wanted.name AND priority = levels.priority
              AND run_at <= now() AND id <> ALL(ARRAY(SELECT id FROM endings))
              AND id <> ALL(%(losing)s::uuid[])
            ORDER BY run_at LIMIT wanted.cap FOR UPDATE SKIP LOCKED
        ) j WHERE levels.priority IS NOT NULL
    ), picked AS MATERIALIZED (
        SELECT id, row_number() OVER (ORDER BY priority DESC, run_at) AS rank FROM (
            SELECT id, priority, run_at, cap,
                   row_number() OVER (PARTITION BY name ORDER BY priority DESC, run_at) AS n
            FROM candidates
        ) c WHERE n <= cap ORDER BY priority DESC, run_at LIMIT %(free)s
    ), claimed AS (
        UPDATE axa_queue q
        SET status = 'running', started_at = COALESCE(%(now)s::timestamptz, clock_timestamp()), updated_at = COALESCE(%(now)s::timestamptz, clock_timestamp()),
            attempts = q.attempts + 1,
            ahead = CASE WHEN q.id = ANY(ARRAY(SELECT id FROM picked WHERE rank > %(idle)s))
                         THEN q.attempts + 1 END
        WHERE q.id = ANY(ARRAY(SELECT id FROM picked))
        RETURNING q.id::text AS id, q.attempts, q.name, q.args::text AS args, q.max_attempts,
                  q.timeout_ms, q.priority, extract(epoch FROM q.run_at)::float8 AS run_at,
                  q.trace_context::text AS trace_context, q.ahead IS NOT NULL AS ahead
    )
    SELECT id, attempts, NULL AS name, NULL AS args, NULL AS max_attempts, NULL AS timeout_ms,
           NULL AS priority, NULL AS run_at, NULL AS trace_context, NULL AS ahead FROM finished
    UNION ALL
    SELECT id, attempts, name, args, max_attempts, timeout_ms, priority, run_at, trace_context,
           ahead
    FROM claimed
    WHERE (SELECT count(*) FROM marked) >= 0"""
"""In one statement and one commit: record how runs ended (completed, failed, or queued
again after a backoff), each row fenced by its own attempt, and claim up to `free` ready
jobs of the wanted names, highest priority then oldest first, at most `cap` of each.

Rows with a name are the jobs claimed, with the trace context stored when each was
queued (NULL for most: see `tracing`); rows without are the endings recorded (an ending
not returned had lost its claim). The claim walks the priority levels with a recursive
CTE and scans `axa_queue_pick` per (name, level), so delayed jobs and jobs of other names
are never read; it picks in a MATERIALIZED CTE, so no more than `free` rows change, and
updates them by primary key (`id = ANY(ARRAY(...))`), which a generic plan cannot turn
into a hash join over the whole table. Writing endings and claiming together halves the
statements per job: the loop that frees a place writes its ending and fills the place.

Completed runs, nearly every ending, arrive as two array literals (`completed`: ids,
`completed_attempts`: their attempts, in the same order); the other endings, completed
runs whose handler returned a value (not `None`) among them, and the wanted names as
JSON arrays (`[{"id", "attempts", "status", "error", "delay", "result",
"max_attempts"}]`, a missing key read as NULL, the result already JSON so the client
only puts text together; and `[{"name", "cap"}]`). `max_attempts` is there only for a
run its handler snoozed (`policies.Snooze`): the job's new limit, one more than the
run's, written with the ending, so a snooze costs no attempt of the job's. Every ending writes its `result`: NULL but for a completed run
that returned a value. Each is one text parameter: far cheaper for the client to build
than a list per column (psycopg's list dumpers are pure Python) or JSON per ending. Ids
come back as text and `run_at` as epoch seconds, which the client reads and sorts by
more cheaply than `uuid` and `timestamptz`. Endings find their rows by primary key
(`id = ANY(ARRAY(...))` again), and the fence compares the status with
`(SELECT 'running')`, a value the planner cannot match to the partial index of running
jobs: else, whenever its statistics say few jobs run, it scans that index whole (every
running job of every worker, and the dead entries vacuum has not cleared yet), or on a
table of some thousand rows the table.

One statement carries many runs' endings and every name's claim, so no one job's
values may fail it: a new limit past the most an `integer` holds (a snooze of a job at
`max_attempts` 2147483647) is read as a `bigint` and stops at 2147483647 (a `CASE`:
`LEAST` would make a missing one 2147483647, as it ignores NULLs), and a delay stops
at 100 years (`options.MAX_DURATION`, which no delay the worker makes passes).
What fails it even so (a data error: SQLSTATE class 22, 23 or 54), `Exchange` sends
again in parts to find the run or name at fault (see `Exchange.isolate`).

Fencing: the claim never takes a job whose ending is in this statement, nor one in
`losing` (jobs of this process whose run lost its claim, until its job's fate is
written): an ending refused because recovery queued the job again is never followed
by a new run of it here. The endings are written first (they may wait for a row lock)
and the claims after, stamped with `clock_timestamp()`: a claim is stamped when its
row is written, never with a time from before a wait, so it cannot land stale. `now`
(NULL but in tests) stands for both clocks in what is written. Which jobs are due is
always judged by `now()` itself: the planner evaluates it when it estimates a generic
plan, so it knows every queued job of a backlog is due and walks `axa_queue_pick` in
order; compared with a parameter it cannot estimate, it took the `run_at` index and
filtered a 100,000-job backlog (40 ms a claim instead of 0.3 ms).

Runs claimed ahead (`QueueOptions.prefetch`): the claimed rows ranked within `idle`
(the loops idle as the statement is sent), in the claim's own order, start at once and
are stamped `ahead` NULL; the others wait in the process for a loop and are stamped
`ahead` = their attempt, returned as `ahead` true: their handler has not started, so
if the process dies stale recovery gives the attempt back (`RECOVER_STALE`). When a
loop starts a waiting run, its (id, attempt) travels in the next statement (`starts`,
`started_attempts`, array literals) and `marked` clears `ahead`, fenced like an ending
by the attempt and `running` (a run given back, or claimed again by anyone, is not
touched); a run whose ending is in the same statement needs no mark (and a row must
not be changed twice by one statement). The loop never waits for the mark: a run
started less than one exchange before its process died may be taken as not started,
which `GIVE_BACK_LIMIT` bounds. `marked` is a data-modifying CTE, which PostgreSQL
runs whether read or not; the final `WHERE` reads it only to say so.

Global limits are claimed by `EXCHANGE_LIMITED`, and rate limits by `EXCHANGE_RATED`,
this statement with a gate in `wanted`; a process without any sends this one,
unchanged.

Waiters (`Queue.wait`): for each job it finishes (completed or failed, not queued
again), while someone waits for jobs of this table, it notifies `DONE_CHANNEL` with the
table's oid and the job's id, in `finished`'s RETURNING (`told`, which no one reads: a
data-modifying CTE's RETURNING is computed for every row; a CASE tries its conditions
in order, so the waiting lock, once taken, is always let go). Two advisory locks, keyed
by the table's oid, say when (`WAITING` is the other side):

- the waiting lock (1635213688): every waiting connection holds it shared for as long
  as it waits. The statement tries it exclusively and, when it gets it, lets it go at
  once (in the same expression: nothing can fail in between): nobody waits, so no
  NOTIFY, whose commit lock serialises every notifying transaction. Refused, it
  notifies. Two exchanges at once almost never meet on it (it is held for a moment),
  and if they do, one notifies for no one: wasted, never lost.
- the ending lock (1635213687): the statement holds it shared from before it asks
  whether anyone waits until it commits (exchanges never conflict on it). A new
  waiting connection, once it holds the waiting lock, takes the ending lock
  exclusively and lets it go: that waits for every statement that may have asked
  before it came to commit, and only then does it read the rows it waits for. So an
  ending is either committed before a waiter reads, or notified. The statement only
  tries the ending lock: refused (a waiting connection is taking it), it notifies
  without asking, and never waits behind a waiter, which may itself wait behind an
  exchange held up by a row lock.

One lock taken, and one taken and let go, per ending: under a microsecond each (a
`told` CTE over `finished` run by an InitPlan cost 10% more server CPU per statement at
one ending a statement; this costs nothing measurable)."""


def _with_gate(statement: str, *, rate: bool = False) -> str:
    """`statement` (`EXCHANGE`) whose `wanted` caps a name with a `global` limit by
    `axa_queue_room`; with `rate`, also a name with a rate limit by
    `axa_queue_rate_room`, stamping the slots it claims by (`EXCHANGE_RATED`). Refuses a
    statement whose parts are not the ones expected."""
    plain = """    ), wanted AS (
        SELECT w.name, least(w.cap, %(free)s) AS cap
        FROM json_to_recordset(%(wanted)s::json) AS w(name text, cap int)
        WHERE %(free)s > 0
    ), candidates"""
    gated = """    ), wanted AS (
        SELECT w.name, CASE WHEN w.global IS NULL THEN least(w.cap, %(free)s)
            ELSE least(w.cap, %(free)s, axa_queue_room('axa_queue'::regclass, w.name,
                                                       greatest(least(w.global, 2147483647), 0)::int))
            END AS cap
        FROM json_to_recordset(%(wanted)s::json) AS w(name text, cap int, global bigint)
        WHERE %(free)s > 0
    ), candidates"""
    rated = """    ), gates AS (
        SELECT w.name, w.rate, w.per_ms,
            CASE WHEN w.global IS NULL THEN least(w.cap, %(free)s)
                ELSE least(w.cap, %(free)s, axa_queue_room('axa_queue'::regclass, w.name, w.global))
            END AS asked,
            CASE WHEN w.rate IS NULL THEN NULL
                ELSE axa_queue_rate_room('axa_queue'::regclass, 'axa_rate_slots'::regclass, w.name,
                                         w.rate, w.per_ms, %(now)s::timestamptz,
                                         least(w.cap, %(free)s))
            END AS slots
        FROM (SELECT r.name, r.cap,
                     CASE WHEN r.global > 2147483647 THEN 2147483647 WHEN r.global < 0 THEN 0
                          ELSE r.global END::int AS global,
                     CASE WHEN r.rate > 100000 THEN 100000 WHEN r.rate < 0 THEN 0
                          ELSE r.rate END::int AS rate,
                     CASE WHEN r.per_ms > 3155760000000 THEN 3155760000000 WHEN r.per_ms < 0 THEN 0
                          ELSE r.per_ms END AS per_ms
              FROM json_to_recordset(%(wanted)s::json)
                  AS r(name text, cap int, global bigint, rate bigint, per_ms bigint)) w
        WHERE %(free)s > 0
        OFFSET 0
    ), wanted AS MATERIALIZED (
        SELECT g.name, g.rate, g.per_ms, g.asked, g.slots,
               CASE WHEN g.slots IS NULL THEN g.asked ELSE least(g.asked, cardinality(g.slots)) END AS cap
        FROM gates g
    ), candidates"""
    tail = """                  q.trace_context::text AS trace_context, q.ahead IS NOT NULL AS ahead
    )
    SELECT id, attempts, NULL AS name"""
    stamped = """                  q.trace_context::text AS trace_context, q.ahead IS NOT NULL AS ahead
    ), taken AS (
        SELECT w.name, w.rate, w.per_ms, w.asked, w.slots,
               (SELECT count(*) FROM claimed c WHERE c.name = w.name)::int AS n
        FROM wanted w WHERE w.slots IS NOT NULL
    ), stamped AS (
        INSERT INTO axa_rate_slots (name, slot, at)
        SELECT t.name, t.slots[i], COALESCE(%(now)s::timestamptz, clock_timestamp())
        FROM taken t CROSS JOIN LATERAL generate_series(1, t.n) AS i
        ON CONFLICT (name, slot) DO UPDATE SET at = EXCLUDED.at
    )
    SELECT id, attempts, NULL AS name"""
    waits = """
    UNION ALL
    SELECT NULL, NULL, t.name, NULL, NULL, NULL, NULL,
           extract(epoch FROM least(greatest(COALESCE(
               (SELECT min(s.at) FROM axa_rate_slots s
                WHERE s.name = t.name AND s.slot < t.rate AND s.slot <> ALL(t.slots)),
               COALESCE(%(now)s::timestamptz, clock_timestamp())),
               COALESCE(%(now)s::timestamptz, clock_timestamp()) - t.per_ms * interval '1 millisecond'),
               COALESCE(%(now)s::timestamptz, clock_timestamp()))
               + t.per_ms * interval '1 millisecond'
               - COALESCE(%(now)s::timestamptz, clock_timestamp()))::float8,
           NULL, NULL
    FROM taken t WHERE cardinality(t.slots) < t.asked AND t.n = cardinality(t.slots)"""
    if plain not in statement or (rate and tail not in statement):
        raise AssertionError("EXCHANGE's wanted CTE changed: change _with_gate with it")
    if not rate:
        return statement.replace(plain, gated)
    return statement.replace(plain, rated).replace(tail, stamped) + waits


EXCHANGE_LIMITED = _with_gate(EXCHANGE)
"""`EXCHANGE` for a process with global limits (`Queue.limit(..., scope="global")`): the
same statement, but a wanted name may carry its `global` limit (`[{"name", "cap",
"global"}]`), and its cap is then cut to `axa_queue_room` (migration 6), which locks
the name for the rest of the transaction and counts its running jobs, every process's,
with a snapshot of its own, so two processes never both see the same free places.
Other names never call it (a `CASE`). The call makes `wanted` a materialized CTE (a
volatile function keeps it from being folded in), which is why a process without
global limits sends `EXCHANGE` itself, whose plan stays as it was.

The client sorts the wanted names, so statements take the names' locks in one order
and never deadlock on them; the endings are written before any is taken, and the
claim never waits for a row lock (`SKIP LOCKED`), so a statement holding a name's lock
waits for nothing else. `SKIP LOCKED` picks as always: a row claimed by a statement
that committed while this one waited for the lock is found `running` when locked, and
skipped. A process with rate limits sends `EXCHANGE_RATED` instead."""

EXCHANGE_RATED = _with_gate(EXCHANGE, rate=True)
"""`EXCHANGE_LIMITED` for a process with rate limits (`Queue.rate_limit`): a wanted
name may also carry its rate limit (`[{"name", "cap", "global", "rate", "per_ms"}]`),
and its cap is then cut to the number of its free slots, which `axa_queue_rate_room`
(migration 7) returns after taking the name's lock (the one global limits take) and
reading `axa_rate_slots` with a snapshot of its own. `gates` calls the functions once
per name (`OFFSET 0` keeps it from being folded into `wanted`, which would copy the
calls). Then, in the same statement, `stamped` stamps as many of those free slots as
jobs of the name were claimed (`taken`, counted over `claimed`), with the clock read
after the claims (so never before a claimed job's `started_at`).

Why this is exact under concurrency: the name's lock is held from the read of the
slots to the commit of the stamps, so statements read and stamp a name's slots one at
a time, each seeing every stamp committed before; a slot is used only when its last
stamp is `per` old or more, read after the lock, and stamped later still; so the
claims that used one slot are `per` apart or more, and any window of `per` holds at
most one per slot: never more than `rate` claims. The stamps are an upsert (`ON
CONFLICT DO UPDATE`), which in READ COMMITTED writes the newest version of a slot's row
even when the statement's own snapshot, taken before it waited for the lock, is older:
an `UPDATE` would miss a slot's row made by another process after that snapshot, and a
claim would go unstamped. A slot without a row is free and the stamp makes it, so
nothing need be made ahead. Retries and jobs queued again are claimed by this
statement like any other job, so each of their runs takes a slot.

The last `UNION ALL` says when to look again: for each rate-limited name whose free
slots were fewer than it asked for and all used, a row with no id, the name, and in
`run_at` the seconds until its earliest busy slot frees (read with the statement's
snapshot, which can only make it sooner: a slot stamped since looks older, and one
looked at early costs an exchange that finds it busy and says when again). A stamp
later than now (only a row written by hand has one, `infinity` say) is taken as now,
so the seconds are at most `per` and the arithmetic cannot leave the range of a
timestamp.

The limits come as `bigint` and are clamped where they are read: a global limit to
0..2147483647 (`limits.MAX_LIMIT`), a rate to 0..`limits.MAX_RATE` (100000), a window to
0..100 years (`limits.MAX_WINDOW`) in
milliseconds; `Queue.limit` and `Queue.rate_limit` refuse more, so only a registry
written to by hand carries it, and it must not fail the claim of every other name. The client
sets a timer for it (`WorkerState.wake_in`), rather than waiting for the poll interval.
A process without rate limits never sends this statement."""


def _claim_only(statement: str) -> str:
    """`statement` (`EXCHANGE`) without its endings and start marks: the claim alone.
    Refuses a statement whose parts are not the ones expected."""
    head = "WITH RECURSIVE endings AS ("
    levels = "    ), levels(priority) AS ("
    not_ending = " AND id <> ALL(ARRAY(SELECT id FROM endings))"
    endings_rows = """    SELECT id, attempts, NULL AS name, NULL AS args, NULL AS max_attempts, NULL AS timeout_ms,
           NULL AS priority, NULL AS run_at, NULL AS trace_context, NULL AS ahead FROM finished
    UNION ALL
"""
    marked = "\n    WHERE (SELECT count(*) FROM marked) >= 0"
    if not (
        statement.startswith(head)
        and levels in statement
        and not_ending in statement
        and endings_rows in statement
        and statement.endswith(marked)
    ):
        raise AssertionError("EXCHANGE changed: change _claim_only with it")
    claim = "WITH RECURSIVE levels(priority) AS (" + statement.split(levels, 1)[1]
    return claim.replace(not_ending, "").replace(endings_rows, "")[: -len(marked)]


CLAIM = _claim_only(EXCHANGE)
"""`EXCHANGE` with nothing to record: the claim alone, for a process without global or
rate limits that has no ending to write and no start to mark (a worker woken while
idle, or looking for work with loops free and nothing finished). It is the same claim,
the same parameters (those it does not name are ignored), the same rows; only the
endings' and the marks' CTEs are gone, which PostgreSQL would set up and run empty
(about 0.3 ms of a round trip of 0.9 ms on the benchmark machine, loaded): on the path
of enqueue-to-start latency, which it shortens by that much."""

GIVE_BACK = """UPDATE axa_queue q
    SET status = 'queued', ahead = NULL, started_at = NULL,
        run_at = COALESCE(%(now)s::timestamptz, now()),
        updated_at = COALESCE(%(now)s::timestamptz, clock_timestamp()),
        max_attempts = LEAST(r.max_attempts + 1, 2147483647), given_back = q.given_back + 1
    FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(limits)s::bigint[])
        AS r(id, attempts, max_attempts)
    WHERE q.id = ANY(%(ids)s::uuid[]) AND q.id = r.id AND q.attempts = r.attempts
      AND q.ahead = r.attempts AND q.status = (SELECT 'running')
    RETURNING q.id::text AS id"""
"""A stopping worker lets go of runs it claimed ahead and never started (the grace
period over): queue them again at once, each with its attempt given back, rather than
leave them to stale recovery. Fenced by the attempt and by `ahead` (never a run whose
start was marked, nor one given back or claimed again since). `limits` is each run's
limit as its worker read it (the job's `max_attempts`, else its handler's or the
worker's), raised by one, as stale recovery raises it, but never past the most an
`integer` holds (so a job at the limit of 2147483647 cannot fail the statement for the
others); `attempts` is never lowered (it fences every run). Counted in `given_back`."""

FAIL_UNCLAIMABLE = """WITH failed AS (
        UPDATE axa_queue
        SET status = 'failed', error = %(error)s,
            updated_at = COALESCE(%(now)s::timestamptz, now())
        WHERE status = 'queued' AND name = %(name)s AND attempts >= 2147483647
        RETURNING id, attempts
    ), told AS (
        SELECT pg_notify('axa_queue_done', 'axa_queue'::regclass::oid::text || ' ' || id::text)
        FROM failed
    )
    SELECT id::text AS id, attempts FROM failed WHERE (SELECT count(*) FROM told) >= 0"""
"""Fail the queued jobs of one name whose attempts are at the most an `integer` holds:
the claim adds one to a job's attempts, so `EXCHANGE` fails on such a row, for every
name it claims. No run of ours gets there (it would take two billion runs); a row
written so by another client does. Sent only after a claim of that name alone has
failed (`Exchange` finds the name by claiming the names apart), never on the way of
a claim; returns the jobs failed, told to waiters (`DONE_CHANNEL`; rare, so always)."""

HEARTBEAT = """WITH beats AS (
        SELECT * FROM unnest(%(ids)s::uuid[], %(attempts)s::int[]) AS r(id, attempts)
    ), beaten AS (
        UPDATE axa_queue q SET updated_at = COALESCE(%(now)s::timestamptz, clock_timestamp())
        FROM beats r
        WHERE q.id = ANY(ARRAY(SELECT id FROM beats)) AND q.id = r.id
          AND q.attempts = r.attempts AND q.status = (SELECT 'running')
        RETURNING q.id::text AS id, q.attempts
    )
    SELECT id, attempts, false AS cancelled FROM beaten
    UNION ALL
    SELECT q.id::text, q.attempts, true FROM axa_queue q JOIN beats r
        ON q.id = r.id AND q.attempts = r.attempts
    WHERE q.id = ANY(ARRAY(SELECT id FROM beats)) AND q.status = (SELECT 'cancelled')"""
"""Report in for every run of this process at once; a run whose attempt no longer matches
is not returned: it lost its claim. Rows are found by primary key, as `EXCHANGE`'s
endings are, never by scanning every running job of every worker. Stamped with
`clock_timestamp()`, when the row is written, even after waiting for a lock.

A run whose job a person cancelled under its attempt (`CANCEL`) comes back with
`cancelled` true: its process stops it without writing anything (the fallback of
`CANCEL_CHANNEL`). That branch reads the statement's snapshot: a cancel committed while
the statement ran is not seen there, so the run is found lost, and `MARK_LOST`, which
reads the row locked, finds it cancelled."""

MARK_LOST = """WITH found AS (
        SELECT id, status, attempts, error, max_attempts FROM axa_queue
        WHERE id = %(id)s FOR UPDATE
    ), decided AS (
        SELECT id, status, attempts, CASE
            WHEN NOT %(started)s THEN NULL
            WHEN attempts = %(attempts)s AND status = %(ending)s::text
                 AND error IS NOT DISTINCT FROM %(ending_error)s::text THEN NULL
            WHEN attempts = %(attempts)s AND status = 'running' THEN
                CASE WHEN attempts < COALESCE(max_attempts, %(max)s) THEN 'queued' ELSE 'failed' END
            WHEN %(gave_up)s THEN NULL
            WHEN status IN ('queued', 'running', 'failed') THEN 'needs_review'
        END AS becomes
        FROM found
    ), changed AS (
        UPDATE axa_queue q
        SET status = d.becomes, error = %(error)s, updated_at = COALESCE(%(now)s::timestamptz, clock_timestamp()),
            started_at = CASE WHEN d.becomes = 'queued' THEN NULL ELSE q.started_at END,
            run_at = CASE WHEN d.becomes = 'queued' THEN COALESCE(%(now)s::timestamptz, now()) ELSE q.run_at END,
            unique_key = CASE WHEN d.status = 'failed' AND q.unique_for_ms IS NULL
                              THEN NULL ELSE q.unique_key END
        FROM decided d WHERE q.id = d.id AND d.becomes IS NOT NULL
        RETURNING q.id, q.status
    ), told AS (
        SELECT pg_notify('axa_queue_done', 'axa_queue'::regclass::oid::text || ' ' || id::text)
        FROM changed WHERE status IN ('failed', 'needs_review')
    )
    SELECT d.status, d.attempts, (SELECT status FROM changed) AS became,
        (SELECT count(*) FROM told) AS told
    FROM decided d"""
"""A run of this process lost its claim or gave it up: decide on the row as it is now
(locked) what becomes of the job, and return what was found (status, attempts) and
what it was changed to (NULL: nothing).

- A run whose handler never started (`started` false) changes nothing: it did no work.
- The run's own ending is there (`ending`, `ending_error` under its attempt: an
  exchange whose answer was lost, then sent again): nothing to do.
- Still `running` under the run's attempt: no one took it, its process gave it up (it
  could not report in for `stale_after`), so the job goes back to the queue at once,
  or fails when out of attempts (`max`: the run's limit, as its claim resolved it,
  `limits.AttemptLimits`), as stale recovery would have it.
- A run that gave up (`gave_up`: it could not report in for `stale_after`) stopped
  before anyone could take its claim (recovery needs `stale_after` of silence from the
  last report it sent): whatever became of the job since is left as it is.
- `queued`, `running` or `failed` otherwise: another worker or recovery took the claim
  while the run went on, so the job may have run in part or twice and waits for a
  person (`needs_review`); a run holding it now is stopped at its next report.
- `completed`, `cancelled` or already `needs_review`: left as it is (a job another run
  completed stays completed).

A failed job it sends to review had freed its unique key (unless it has a
`unique_for`), which another job may hold now: it goes to review without it.

A job it fails or sends to review is told to waiters (`DONE_CHANNEL`), always: this
statement is rare, so it does not ask whether anyone waits."""

# --- Draining (tests) ------------------------------------------------------------------

DRAIN_READY = """SELECT count(*) AS ready FROM axa_queue
    WHERE status = 'queued' AND name = ANY(%(names)s::text[]) AND run_at <= now()"""
"""How many jobs of the drained names are ready: a drain ends when, its worker idle,
none is. Due is judged by `now()`, as `EXCHANGE`'s claim judges it."""

DRAIN_DUE_NOW = """UPDATE axa_queue SET run_at = now(), updated_at = COALESCE(%(now)s::timestamptz, now())
    WHERE status = 'queued' AND name = ANY(%(names)s::text[]) AND run_at > now()
    RETURNING id"""
"""Make every waiting job of the drained names due now (`drain(include_delayed=True)`:
a retry's backoff and a delayed job are not waited for); returns the jobs moved."""

DRAIN_REVIEW = """SELECT count(*) AS needs_review FROM axa_queue
    WHERE id = ANY(%(ids)s::uuid[]) AND status = 'needs_review'"""
"""How many of the jobs whose runs lost their claim during a drain now wait for review."""

ENQUEUED = """SELECT id, name, args, status, priority, attempts, max_attempts, timeout_ms,
    EXTRACT(EPOCH FROM run_at) AS run_at, EXTRACT(EPOCH FROM created_at) AS created_at
    FROM axa_queue WHERE %(name)s::text IS NULL OR name = %(name)s
    ORDER BY axa_queue.created_at, id"""
"""Every stored job (or every one of a name), oldest first, with its arguments: the one
statement that returns them to the caller, for tests (`axa_queue.testing.enqueued`);
times as epoch seconds, as `JOB` reads them."""

END_SESSIONS = """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND application_name = %(name)s"""
"""End the sessions a test left open on its schema (`axa_queue.testing.fresh_schema`
names them after it), so the schema can be dropped."""

# --- Housekeeping ----------------------------------------------------------------------

GIVE_BACK_LIMIT = 3
"""How many times stale recovery gives a job back an attempt whose handler it takes as
never started (`axa_queue.given_back`): a start is marked by the exchange after it (the
loop does not wait for it), so a handler that kills its process at once looks never
started; past this many give-backs its attempts are burned as any crashed run's, and
such a job fails at last rather than crash worker after worker for ever."""

RECOVER_STALE = """WITH recovered AS (
    UPDATE axa_queue
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
    WHERE status = 'running' AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
      AND (pg_postmaster_start_time() < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
           OR updated_at < pg_postmaster_start_time() - make_interval(secs => %(stale)s))
      AND (id, attempts) NOT IN (
          SELECT * FROM unnest(%(held)s::uuid[], %(held_attempts)s::int[]))
    RETURNING id, name, attempts, status
    ), told AS (
        SELECT pg_notify('axa_queue_done', 'axa_queue'::regclass::oid::text || ' '
                         || CASE WHEN count(*) > 150 THEN '*' ELSE string_agg(id::text, ' ') END)
        FROM recovered WHERE status = 'failed' HAVING count(*) > 0
    )
    SELECT id, name, attempts, status FROM recovered WHERE (SELECT count(*) FROM told) >= 0"""
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
write). The jobs it fails are told to waiters (`DONE_CHANNEL`; rare, so always)."""

STALE = """SELECT id, name, attempts,
        CASE WHEN (ahead = attempts AND given_back < %(give_back)s)
                  OR attempts < COALESCE(max_attempts, (%(limits)s::jsonb ->> name)::int, %(max)s)
             THEN 'queued' ELSE 'failed' END AS status
    FROM axa_queue
    WHERE status = 'running' AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
      AND (pg_postmaster_start_time() < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
           OR updated_at < pg_postmaster_start_time() - make_interval(secs => %(stale)s))
    ORDER BY updated_at"""
"""What stale recovery would do now, changing nothing (for a dry run)."""

PURGE = """WITH doomed AS (
        SELECT id FROM axa_queue
        WHERE status IN ('completed', 'failed', 'cancelled')
          AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s)
        LIMIT %(batch)s FOR UPDATE SKIP LOCKED
    )
    DELETE FROM axa_queue q USING doomed WHERE q.id = doomed.id"""
"""Delete one bounded batch of finished rows older than the retention period (never a
job in review); repeated until a batch comes back short."""

PURGEABLE = """SELECT count(*) AS purgeable FROM axa_queue
    WHERE status IN ('completed', 'failed', 'cancelled')
      AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s)"""
"""How many rows retention would delete now (for a dry run)."""

# --- Inspection ------------------------------------------------------------------------

JOB = """SELECT id, name, status, attempts, max_attempts, priority, error, timeout_ms,
    unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at, EXTRACT(EPOCH FROM started_at) AS started_at,
    EXTRACT(EPOCH FROM created_at) AS created_at, EXTRACT(EPOCH FROM updated_at) AS updated_at
    FROM axa_queue WHERE id = %s"""
"""One job, without its arguments. Times come as epoch seconds (exact numeric), which
any row can be read as: a `timestamptz` PostgreSQL holds but Python's `datetime` cannot
(`infinity`, past year 9999, or year 9999 shown in a session time zone east of UTC),
written by another client, would otherwise fail the read (`jobs.moment` clamps it)."""

RESULT = "SELECT status, result FROM axa_queue WHERE id = %s"
"""One job's state and result (a completed run's return value as JSON, or NULL): only
for `Queue.result`, which returns it to its caller and never shows it."""

JOBS = """SELECT id, name, status, attempts, max_attempts, priority, error, timeout_ms,
    unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at, EXTRACT(EPOCH FROM started_at) AS started_at,
    EXTRACT(EPOCH FROM created_at) AS created_at, EXTRACT(EPOCH FROM updated_at) AS updated_at
    FROM axa_queue
    WHERE (%(state)s::text IS NULL OR status = %(state)s)
      AND (%(name)s::text IS NULL OR name = %(name)s)
    ORDER BY axa_queue.created_at DESC, id LIMIT %(limit)s"""
"""The newest jobs, optionally of one state and name, without their arguments; times
as epoch seconds, as `JOB` reads them, so one odd row never breaks the listing."""

TASK_RESULT = """SELECT id, name, args, status, error, attempts, priority, result,
    EXTRACT(EPOCH FROM run_at) AS run_at, EXTRACT(EPOCH FROM started_at) AS started_at,
    EXTRACT(EPOCH FROM created_at) AS created_at, EXTRACT(EPOCH FROM updated_at) AS updated_at
    FROM axa_queue WHERE id = %s"""
"""One job as Django's tasks framework reports it (`axa_queue.contrib.django`'s
`get_result`): with its arguments and its result, which Django's `TaskResult` carries
for the application's own code (never logged or shown); times as epoch seconds, as `JOB`
reads them."""

COUNTS = """SELECT
    count(*) FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now())) AS ready,
    count(*) FILTER (WHERE status = 'queued' AND run_at > COALESCE(%(now)s::timestamptz, now())) AS waiting,
    count(*) FILTER (WHERE status = 'running') AS running,
    count(*) FILTER (WHERE status = 'completed') AS completed,
    count(*) FILTER (WHERE status = 'failed') AS failed,
    count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
    count(*) FILTER (WHERE status = 'needs_review') AS needs_review,
    (EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now())) - EXTRACT(EPOCH FROM min(run_at)
        FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now()))))::float8 AS oldest
    FROM axa_queue"""
"""How many jobs are in each state, and how long the oldest ready job has waited (the
difference of epoch seconds, which `-infinity`, written by another client, cannot
fail before PostgreSQL 17; it reads as infinity)."""

COUNTS_BY_NAME = """SELECT name,
    count(*) FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now())) AS ready,
    count(*) FILTER (WHERE status = 'queued' AND run_at > COALESCE(%(now)s::timestamptz, now())) AS waiting,
    count(*) FILTER (WHERE status = 'running') AS running,
    count(*) FILTER (WHERE status = 'completed') AS completed,
    count(*) FILTER (WHERE status = 'failed') AS failed,
    count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
    count(*) FILTER (WHERE status = 'needs_review') AS needs_review,
    (EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now())) - EXTRACT(EPOCH FROM min(run_at)
        FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now()))))::float8 AS oldest
    FROM axa_queue GROUP BY name ORDER BY name"""
"""The same counts for each job name."""

LIVE_COUNTS_BY_NAME = """SELECT name,
    count(*) FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now())) AS ready,
    count(*) FILTER (WHERE status = 'queued' AND run_at > COALESCE(%(now)s::timestamptz, now())) AS waiting,
    count(*) FILTER (WHERE status = 'running') AS running,
    count(*) FILTER (WHERE status = 'needs_review') AS needs_review,
    (EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now())) - EXTRACT(EPOCH FROM min(run_at)
        FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now()))))::float8 AS oldest
    FROM (
        SELECT name, status, run_at FROM axa_queue WHERE status = 'queued'
        UNION ALL
        SELECT name, status, run_at FROM axa_queue WHERE status = 'running'
        UNION ALL
        SELECT name, status, run_at FROM axa_queue WHERE status = 'needs_review'
    ) live GROUP BY name ORDER BY name"""
"""The counts of jobs not finished, for each job name: each branch reads one partial
index (queued, running, in review), never the finished rows, so it costs the same on a
table holding millions of them (what metrics count every few seconds)."""

FINISHED_COUNTS_BY_NAME = """SELECT name,
    count(*) FILTER (WHERE status = 'completed') AS completed,
    count(*) FILTER (WHERE status = 'failed') AS failed,
    count(*) FILTER (WHERE status = 'cancelled') AS cancelled
    FROM axa_queue WHERE status IN ('completed', 'failed', 'cancelled')
    GROUP BY name ORDER BY name"""
"""The counts of finished jobs, for each job name: a scan of every finished row kept
by retention (metrics count them far less often than the live ones)."""

LOCAL_SEARCH_PATH = "SELECT set_config('search_path', %s, true)"
"""Point this transaction's unqualified names at the queue's schema (`QueueOptions.schema`)
for the caller's own statements on `queue.connection()`: a transaction-local setting,
which a transaction pooler carries, where rewriting the caller's SQL could change the
text of its literals."""

SEARCH_PATH = "SELECT current_setting('search_path') AS search_path"
"""The transaction's `search_path`, to set it back (`LOCAL_SEARCH_PATH`) after statements
run in the queue's schema in a transaction that goes on (a Django migration's)."""

PING = "SELECT 1"
"""Whether the database answers."""

# --- Acts ------------------------------------------------------------------------------

CANCEL = """WITH target AS (
        SELECT id, status FROM axa_queue
        WHERE id = %(id)s AND status IN ('queued', 'running')
        FOR UPDATE
    ), changed AS (
        UPDATE axa_queue q SET status = 'cancelled', updated_at = COALESCE(%(now)s::timestamptz, now())
        FROM target WHERE q.id = target.id
        RETURNING q.id, q.name, q.attempts, target.status AS was
    ), kept AS (
        INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason)
        SELECT id, name, 'cancelled', attempts, %(by)s, %(reason)s FROM changed
        RETURNING act
    ), told AS (
        SELECT pg_notify('axa_queue_done', 'axa_queue'::regclass::oid::text || ' ' || id::text)
        FROM changed
        UNION ALL
        SELECT pg_notify('axa_queue_cancel', id::text) FROM changed WHERE was = 'running'
    )
    SELECT (SELECT act FROM kept) AS act,
        COALESCE((SELECT status FROM target),
                 (SELECT status FROM axa_queue WHERE id = %(id)s)) AS found,
        (SELECT count(*) FROM told) AS told"""
"""Cancel a queued or running job and keep the act, in one statement; any other state
changes nothing and writes no act. Returns the act kept (or NULL) and the state it
found: the state it cancelled (read locked), else the state of the job it left alone. A job cancelled is told to waiters (`DONE_CHANNEL`) when the
caller's transaction commits: always, without the advisory lock `EXCHANGE` asks, which
would be held until the caller's commit and keep new waiters waiting that long.

A running job's row becomes `cancelled` under the same attempt: the run's ending is
then refused by the fence (`status = 'running'`, ours and the crate's alike), its
heartbeat reports it cancelled (`HEARTBEAT`), and `CANCEL_CHANNEL` tells its process
at once, on the caller's commit (NOTIFY is transactional: a rollback tells no one)."""

RETRY = """WITH target AS (
        SELECT id, status FROM axa_queue
        WHERE id = %(id)s AND status IN ('failed', 'needs_review')
        FOR UPDATE
    ), changed AS (
        UPDATE axa_queue q
        SET status = 'queued', run_at = COALESCE(%(now)s::timestamptz, now()), started_at = NULL,
            updated_at = COALESCE(%(now)s::timestamptz, now()),
            max_attempts = q.attempts + 1,
            unique_key = CASE WHEN target.status = 'failed' AND q.unique_for_ms IS NULL
                              THEN NULL ELSE q.unique_key END
        FROM target WHERE q.id = target.id
        RETURNING q.id, q.name, q.attempts, target.status AS was
    ), kept AS (
        INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason)
        SELECT id, name, CASE was WHEN 'needs_review' THEN 'released' ELSE 'retried' END,
            attempts, %(by)s, %(reason)s
        FROM changed
        RETURNING act
    )
    SELECT (SELECT act FROM kept) AS act,
        (SELECT status FROM axa_queue WHERE id = %(id)s) AS found"""
"""Queue a failed job (act `retried`) or one in review (act `released`) for one more try,
and keep the act, in one statement. Attempts keep rising, so an old run stays fenced.
A failed job without `unique_for` had freed its unique key, which another job may hold
now: it is queued again without it (one in review, or with `unique_for`, still holds
its key and keeps it).
Returns the act kept (or NULL) and the state it found."""

ACTS = """SELECT id, job_id, job_name, act, attempts, by, reason, EXTRACT(EPOCH FROM at) AS at,
    db_role FROM axa_job_acts WHERE job_id = %s ORDER BY id"""
"""Every act done to one job, oldest first; its time as epoch seconds, as `JOB` reads
times."""

# --- Schedules -------------------------------------------------------------------------

SCHEDULES_SEEN = """INSERT INTO axa_schedule (name, due_at, interval_ms, cron, timezone, seen_at)
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
       OR axa_schedule.seen_at < COALESCE(%(now)s::timestamptz, now()) - interval '1 minute'"""
"""Make each schedule's row, or say it is still in code: restore it if archived, and note
its interval, or its cron expression and zone (a cron schedule's `interval_ms` is NULL,
which the crate reads as no interval). A cron schedule's first due time is worked out
in Python (`first_at`); a changed interval, expression or zone applies from the next
due time on. `seen_at` moves at most once a minute, so a tick rarely writes."""

SCHEDULES_DUE = """SELECT name, due_at, COALESCE(%(now)s::timestamptz, now()) AS now FROM axa_schedule
    WHERE name = ANY(%(names)s::text[]) AND archived_at IS NULL AND due_at <= COALESCE(%(now)s::timestamptz, now())"""
"""Which schedules are due, without locking: most ticks stop here. With each, the due
time read and the clock it was read at, from which a cron schedule's next time is
worked out (`CRON_TICK`). (A due time is at most now, so Python can hold it.)"""

SCHEDULE_TICK = """WITH due AS (
        SELECT name, last_job FROM axa_schedule
        WHERE name = %(name)s AND archived_at IS NULL AND due_at <= COALESCE(%(now)s::timestamptz, now())
        FOR UPDATE SKIP LOCKED
    ), busy AS (
        SELECT EXISTS (SELECT 1 FROM axa_queue q JOIN due ON q.id = due.last_job
                       WHERE q.status IN ('queued', 'running')) AS busy
    ), queued AS (
        INSERT INTO axa_queue (id, name, args, max_attempts, priority, run_at, timeout_ms)
        SELECT %(id)s, %(job)s, %(args)s::jsonb, %(max_attempts)s, %(priority)s, COALESCE(%(now)s::timestamptz, now()),
               %(timeout_ms)s
        FROM due WHERE NOT (SELECT busy FROM busy)
        RETURNING id
    ), advanced AS (
        UPDATE axa_schedule s
        SET due_at = s.due_at + make_interval(secs => %(interval)s)
                * (floor(EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now()) - s.due_at) / %(interval)s::numeric) + 1),
            last_job = COALESCE((SELECT id FROM queued), s.last_job), updated_at = COALESCE(%(now)s::timestamptz, now())
        FROM due WHERE s.name = due.name
        RETURNING s.name
    )
    SELECT (SELECT id FROM queued) AS queued, due.last_job,
        (SELECT count(*) FROM advanced) AS advanced
    FROM due"""
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

CRON_TICK = """WITH due AS (
        SELECT name, last_job FROM axa_schedule
        WHERE name = %(name)s AND archived_at IS NULL AND due_at = %(due_at)s
          AND due_at <= COALESCE(%(now)s::timestamptz, now())
        FOR UPDATE SKIP LOCKED
    ), busy AS (
        SELECT EXISTS (SELECT 1 FROM axa_queue q JOIN due ON q.id = due.last_job
                       WHERE q.status IN ('queued', 'running')) AS busy
    ), queued AS (
        INSERT INTO axa_queue (id, name, args, max_attempts, priority, run_at, timeout_ms)
        SELECT %(id)s, %(job)s, %(args)s::jsonb, %(max_attempts)s, %(priority)s, COALESCE(%(now)s::timestamptz, now()),
               %(timeout_ms)s
        FROM due WHERE NOT (SELECT busy FROM busy)
        RETURNING id
    ), advanced AS (
        UPDATE axa_schedule s
        SET due_at = %(next_at)s, last_job = COALESCE((SELECT id FROM queued), s.last_job),
            updated_at = COALESCE(%(now)s::timestamptz, now())
        FROM due WHERE s.name = due.name
        RETURNING s.name
    )
    SELECT (SELECT id FROM queued) AS queued, due.last_job,
        (SELECT count(*) FROM advanced) AS advanced
    FROM due"""
"""`SCHEDULE_TICK` for a cron schedule, whose next time SQL cannot work out: the process
read the due time (`SCHEDULES_DUE`) and passes it with the next time it worked out
after the clock it read (`next_at`, later than both). The row is taken only while its
due time is still the one read (and due), so of any number of processes that read the
same due time, one moves it on and queues its job and the others find no row: each due
time is queued once. After an outage, one job, then the first time after now; the job
is not queued while the last is still queued or running (no stacking).

Returns no row when the due time was moved on already or another process holds the
row; else the job queued (NULL when skipped) and the last job before it."""

SCHEDULE_ARCHIVE = """UPDATE axa_schedule SET archived_at = COALESCE(%(now)s::timestamptz, now()), updated_at = COALESCE(%(now)s::timestamptz, now())
    WHERE archived_at IS NULL AND name <> ALL(%(in_code)s::text[])
      AND seen_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)"""
"""Archive schedules no live process has in code (unseen for the stale period)."""

SCHEDULES = """SELECT s.name, s.interval_ms, s.cron, s.timezone, EXTRACT(EPOCH FROM s.due_at) AS due_at, s.last_job,
    EXTRACT(EPOCH FROM s.seen_at) AS seen_at, EXTRACT(EPOCH FROM s.archived_at) AS archived_at,
    EXTRACT(EPOCH FROM s.created_at) AS created_at, q.status AS last_status, q.error AS last_error
    FROM axa_schedule s LEFT JOIN axa_queue q ON q.id = s.last_job ORDER BY s.name"""
"""Every schedule, archived or not, with its last job's state; times as epoch seconds,
as `JOB` reads them."""

# --- Worker processes ------------------------------------------------------------------

WORKER_SEEN = """INSERT INTO axa_workers (id, host, pid, names, loops, running, version,
        started_at, seen_at)
    VALUES (%(id)s, %(host)s, %(pid)s, %(names)s::text[], %(loops)s, %(running)s, %(version)s,
            COALESCE(%(now)s::timestamptz, now()), COALESCE(%(now)s::timestamptz, now()))
    ON CONFLICT (id) DO UPDATE
    SET seen_at = EXCLUDED.seen_at, running = EXCLUDED.running, names = EXCLUDED.names"""
"""Say this worker process is alive: its row is made at start, then its last heartbeat
(`seen_at`) and jobs in progress (`running`) refreshed once per `heartbeat_interval`,
one primary-key write (never a statement per job). The same upsert both makes and
refreshes the row, so a row removed while the process was cut off comes back."""

WORKER_GONE = "DELETE FROM axa_workers WHERE id = %(id)s"
"""A worker process stopped cleanly: its row goes."""

WORKERS_FORGET = """DELETE FROM axa_workers
    WHERE seen_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(after)s)"""
"""Remove the rows of processes not heard from for long (killed, or their host lost):
housekeeping, through the `axa_workers_seen` index."""

WORKERS = """SELECT id, host, pid, names, loops, running, version,
    EXTRACT(EPOCH FROM started_at) AS started_at, EXTRACT(EPOCH FROM seen_at) AS seen_at,
    (EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now())) - EXTRACT(EPOCH FROM seen_at))::float8 AS silent
    FROM axa_workers ORDER BY host, pid, started_at"""
"""Every worker process with a row, and how many seconds since it was last heard from
(readers call it live while that is under `stale_after`); a small table, one row per
process. The seconds are a difference of epoch seconds, which a `seen_at` of `infinity`
or `-infinity`, written by another client, cannot fail before PostgreSQL 17 (it reads
as -infinity or infinity)."""

# --- Dashboard -------------------------------------------------------------------------


WEB_LIVE_COUNTS = """SELECT name,
    count(*) FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now())) AS ready,
    count(*) FILTER (WHERE status = 'queued' AND run_at > COALESCE(%(now)s::timestamptz, now())) AS waiting,
    count(*) FILTER (WHERE status = 'running') AS running,
    count(*) FILTER (WHERE status = 'needs_review') AS needs_review,
    (EXTRACT(EPOCH FROM COALESCE(%(now)s::timestamptz, now())) - EXTRACT(EPOCH FROM min(run_at)
        FILTER (WHERE status = 'queued' AND run_at <= COALESCE(%(now)s::timestamptz, now()))))::float8 AS oldest
    FROM (
        (SELECT name, status, run_at FROM axa_queue WHERE status = 'queued'
         ORDER BY axa_queue.run_at LIMIT %(cap)s)
        UNION ALL
        (SELECT name, status, run_at FROM axa_queue WHERE status = 'running' LIMIT %(cap)s)
        UNION ALL
        (SELECT name, status, run_at FROM axa_queue WHERE status = 'needs_review' LIMIT %(cap)s)
    ) live GROUP BY name ORDER BY name"""
"""The dashboard's counts of jobs not finished, per name, reading at most `cap` rows of
each state: queued ones in due order through `axa_queue_ready` (so the ready ones come
first, and each name's oldest ready job is among them), running ones and those in
review through their partial indexes. Exact while a state holds fewer than `cap` jobs;
past that the dashboard shows the counts read as "at least" and the totals from
`WEB_ESTIMATE_READY` and `WEB_ESTIMATE_WAITING`. Counting a backlog of 100,000 jobs
exactly at every refresh would cost more than the 50 ms a page may take."""

WEB_ESTIMATE_READY = """EXPLAIN (FORMAT JSON)
    SELECT 1 FROM axa_queue WHERE status = 'queued' AND run_at <= now()"""
"""The planner's estimate of the ready jobs, from the table's statistics (as Oban counts
big tables): a plan, never a scan, for a backlog too big to count at each refresh."""

WEB_ESTIMATE_WAITING = """EXPLAIN (FORMAT JSON)
    SELECT 1 FROM axa_queue WHERE status = 'queued' AND run_at > now()"""
"""The planner's estimate of the jobs queued for later (see `WEB_ESTIMATE_READY`)."""

WEB_JOBS_NEWEST = """SELECT id, name, status, attempts, max_attempts, priority, error, timeout_ms, unique_key,
    unique_for_ms, given_back, run_at, started_at, created_at, updated_at, key
    FROM (
        (SELECT id, name, status, attempts, max_attempts, priority, error,
            timeout_ms, unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at,
            EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM created_at) AS created_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at,
            CASE WHEN isfinite(run_at) THEN to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                || CASE WHEN run_at < TIMESTAMPTZ '0001-01-01 00:00:00+00' THEN ' BC' ELSE '' END
                ELSE run_at::text END AS key, axa_queue.run_at AS sort_at
        FROM axa_queue
        WHERE %(state)s::text = 'queued' AND status = 'queued'
          AND (%(name)s::text IS NULL OR name = %(name)s)
          AND run_at <= COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', 'infinity'::timestamptz)
          AND (run_at, id) < (COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', 'infinity'::timestamptz), COALESCE(%(after)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
        ORDER BY axa_queue.run_at DESC, id DESC LIMIT %(limit)s)
        UNION ALL
        (SELECT id, name, status, attempts, max_attempts, priority, error,
            timeout_ms, unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at,
            EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM created_at) AS created_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at,
            CASE WHEN isfinite(updated_at) THEN to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                || CASE WHEN updated_at < TIMESTAMPTZ '0001-01-01 00:00:00+00' THEN ' BC' ELSE '' END
                ELSE updated_at::text END AS key, axa_queue.updated_at AS sort_at
        FROM axa_queue
        WHERE %(state)s::text = 'running' AND status = 'running'
          AND (%(name)s::text IS NULL OR name = %(name)s)
          AND updated_at <= COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', 'infinity'::timestamptz)
          AND (updated_at, id) < (COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', 'infinity'::timestamptz), COALESCE(%(after)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
        ORDER BY axa_queue.updated_at DESC, id DESC LIMIT %(limit)s)
        UNION ALL
        (SELECT id, name, status, attempts, max_attempts, priority, error,
            timeout_ms, unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at,
            EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM created_at) AS created_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at,
            CASE WHEN isfinite(updated_at) THEN to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                || CASE WHEN updated_at < TIMESTAMPTZ '0001-01-01 00:00:00+00' THEN ' BC' ELSE '' END
                ELSE updated_at::text END AS key, axa_queue.updated_at AS sort_at
        FROM axa_queue
        WHERE %(state)s::text = 'needs_review' AND status = 'needs_review'
          AND (%(name)s::text IS NULL OR name = %(name)s)
          AND updated_at <= COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', 'infinity'::timestamptz)
          AND (updated_at, id) < (COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', 'infinity'::timestamptz), COALESCE(%(after)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
        ORDER BY axa_queue.updated_at DESC, id DESC LIMIT %(limit)s)
        UNION ALL
        (SELECT id, name, status, attempts, max_attempts, priority, error,
            timeout_ms, unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at,
            EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM created_at) AS created_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at,
            CASE WHEN isfinite(updated_at) THEN to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                || CASE WHEN updated_at < TIMESTAMPTZ '0001-01-01 00:00:00+00' THEN ' BC' ELSE '' END
                ELSE updated_at::text END AS key, axa_queue.updated_at AS sort_at
        FROM axa_queue
        WHERE %(state)s::text = ANY('{completed,failed,cancelled}'::text[]) AND status IN ('completed', 'failed', 'cancelled') AND status = %(state)s::text
          AND (%(name)s::text IS NULL OR name = %(name)s)
          AND updated_at <= COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', 'infinity'::timestamptz)
          AND (updated_at, id) < (COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', 'infinity'::timestamptz), COALESCE(%(after)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
        ORDER BY axa_queue.updated_at DESC, id DESC LIMIT %(limit)s)
    ) page ORDER BY sort_at DESC, id DESC"""
"""One page of the dashboard's job list: jobs of one state (and optionally one name),
newest first, after the keyset cursor (`key`, `after`: the last row's key and id; NULL
for the first page); without arguments, with a text `key` (its order key in UTC) to ask
for the next page by. The key is any time PostgreSQL holds, written so that it reads
back as the same time: `YYYY-MM-DDTHH:MM:SS.ffffff` (` BC` after a year before 1), or
`infinity` or `-infinity`, which another client may have written (`web.params` checks a
cursor sent back against that form). The page is ordered by the time itself
(`sort_at`, never read by Python, which cannot hold `infinity`), not by its text.

A state is ordered by the partial index that holds it: queued jobs by due time
(`axa_queue_ready`), running ones and those in review by their last change
(`axa_queue_running`, `axa_queue_review`), finished ones by when they finished
(`axa_queue_finished`). Each state is a branch naming its status as a literal, so even
a generic plan (the queue's connections force them) can use its partial index; the
`%(state)s` test of the other branches is a one-time filter that skips them unread.
The cursor condition starts the index scan at the key, so a page deep into millions of
finished rows costs what the first one does; with no cursor it is `infinity` and the
largest id, never an `OR` that would keep the bound out of the index scan. Each branch
orders by the qualified column (`axa_queue.updated_at`): the bare name would be the
output column of that name, its epoch seconds, which no index holds."""

WEB_JOBS_OLDEST = """SELECT id, name, status, attempts, max_attempts, priority, error, timeout_ms, unique_key,
    unique_for_ms, given_back, run_at, started_at, created_at, updated_at, key
    FROM (
        (SELECT id, name, status, attempts, max_attempts, priority, error,
            timeout_ms, unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at,
            EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM created_at) AS created_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at,
            CASE WHEN isfinite(run_at) THEN to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                || CASE WHEN run_at < TIMESTAMPTZ '0001-01-01 00:00:00+00' THEN ' BC' ELSE '' END
                ELSE run_at::text END AS key, axa_queue.run_at AS sort_at
        FROM axa_queue
        WHERE %(state)s::text = 'queued' AND status = 'queued'
          AND (%(name)s::text IS NULL OR name = %(name)s)
          AND run_at >= COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', '-infinity'::timestamptz)
          AND (run_at, id) > (COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', '-infinity'::timestamptz), COALESCE(%(after)s::uuid, '00000000-0000-0000-0000-000000000000'))
        ORDER BY axa_queue.run_at ASC, id ASC LIMIT %(limit)s)
        UNION ALL
        (SELECT id, name, status, attempts, max_attempts, priority, error,
            timeout_ms, unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at,
            EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM created_at) AS created_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at,
            CASE WHEN isfinite(updated_at) THEN to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                || CASE WHEN updated_at < TIMESTAMPTZ '0001-01-01 00:00:00+00' THEN ' BC' ELSE '' END
                ELSE updated_at::text END AS key, axa_queue.updated_at AS sort_at
        FROM axa_queue
        WHERE %(state)s::text = 'running' AND status = 'running'
          AND (%(name)s::text IS NULL OR name = %(name)s)
          AND updated_at >= COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', '-infinity'::timestamptz)
          AND (updated_at, id) > (COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', '-infinity'::timestamptz), COALESCE(%(after)s::uuid, '00000000-0000-0000-0000-000000000000'))
        ORDER BY axa_queue.updated_at ASC, id ASC LIMIT %(limit)s)
        UNION ALL
        (SELECT id, name, status, attempts, max_attempts, priority, error,
            timeout_ms, unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at,
            EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM created_at) AS created_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at,
            CASE WHEN isfinite(updated_at) THEN to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                || CASE WHEN updated_at < TIMESTAMPTZ '0001-01-01 00:00:00+00' THEN ' BC' ELSE '' END
                ELSE updated_at::text END AS key, axa_queue.updated_at AS sort_at
        FROM axa_queue
        WHERE %(state)s::text = 'needs_review' AND status = 'needs_review'
          AND (%(name)s::text IS NULL OR name = %(name)s)
          AND updated_at >= COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', '-infinity'::timestamptz)
          AND (updated_at, id) > (COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', '-infinity'::timestamptz), COALESCE(%(after)s::uuid, '00000000-0000-0000-0000-000000000000'))
        ORDER BY axa_queue.updated_at ASC, id ASC LIMIT %(limit)s)
        UNION ALL
        (SELECT id, name, status, attempts, max_attempts, priority, error,
            timeout_ms, unique_key, unique_for_ms, given_back, EXTRACT(EPOCH FROM run_at) AS run_at,
            EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM created_at) AS created_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at,
            CASE WHEN isfinite(updated_at) THEN to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                || CASE WHEN updated_at < TIMESTAMPTZ '0001-01-01 00:00:00+00' THEN ' BC' ELSE '' END
                ELSE updated_at::text END AS key, axa_queue.updated_at AS sort_at
        FROM axa_queue
        WHERE %(state)s::text = ANY('{completed,failed,cancelled}'::text[]) AND status IN ('completed', 'failed', 'cancelled') AND status = %(state)s::text
          AND (%(name)s::text IS NULL OR name = %(name)s)
          AND updated_at >= COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', '-infinity'::timestamptz)
          AND (updated_at, id) > (COALESCE(%(key)s::timestamp AT TIME ZONE 'UTC', '-infinity'::timestamptz), COALESCE(%(after)s::uuid, '00000000-0000-0000-0000-000000000000'))
        ORDER BY axa_queue.updated_at ASC, id ASC LIMIT %(limit)s)
    ) page ORDER BY sort_at ASC, id ASC"""
"""The same page, oldest first (`WEB_JOBS_NEWEST` explains its shape): the cursor
bounds are the other way, and a missing cursor is `-infinity` and the smallest id."""

WEB_FINISHED_PER_MINUTE = """SELECT
    EXTRACT(EPOCH FROM date_bin('1 minute', updated_at, TIMESTAMPTZ '2000-01-01 00:00:00+00'))::bigint
        AS minute,
    name,
    count(*) FILTER (WHERE status = 'completed') AS completed,
    count(*) FILTER (WHERE status = 'failed') AS failed,
    count(*) FILTER (WHERE status = 'cancelled') AS cancelled
    FROM axa_queue
    WHERE status IN ('completed', 'failed', 'cancelled')
      AND updated_at >= to_timestamp(%(since)s::float8)
      AND updated_at < COALESCE(to_timestamp(%(until)s::float8), 'infinity'::timestamptz)
    GROUP BY 1, 2"""
"""Jobs that finished in a window of whole minutes (`since`, `until`: epoch seconds;
`until` NULL: from `since` on, short of `infinity`, a time another client may have
written and which has no minute), per minute and name: what the dashboard's charts and its
"finished in the last hour" counts are made from. It reads only the window, through
`axa_queue_finished`: the dashboard asks for each past hour once and then only for the
last two minutes at each refresh, keeping what it read (`web.history`), so a refresh
never reads the finished rows of the day again."""

WEB_ACTS = """SELECT id, job_id, job_name, act, attempts, by, reason, EXTRACT(EPOCH FROM at) AS at,
    db_role FROM axa_job_acts
    WHERE (%(by)s::text IS NULL OR by = %(by)s)
      AND (%(act)s::text IS NULL OR act = %(act)s)
      AND (%(before)s::bigint IS NULL OR id < %(before)s)
    ORDER BY id DESC LIMIT %(limit)s"""
"""The acts log: every act, newest first, optionally by one person or of one kind, one
page before the act `before` (the last one shown); walks the primary key backwards."""

# --- Notifications ---------------------------------------------------------------------

LISTEN = "LISTEN axa_queue"
"""Receive wake-ups for new jobs."""

WAITING_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, false)"
"""How long `WAITING` may wait for its locks on `SyncQueue.wait`'s own connection (the
wait's time left, as `<n>ms`; `0` for no limit): it waits behind statements finishing
jobs, one of which may itself wait for a row lock."""

LISTEN_CANCEL = "LISTEN axa_queue_cancel"
"""Receive word of running jobs a person cancelled (`CANCEL_CHANNEL`), on the worker's
notification connection."""

LISTEN_DONE = "LISTEN axa_queue_done"
"""Receive word of finished jobs (`DONE_CHANNEL`), for `Queue.wait`."""

WAITING = """SELECT CASE
    WHEN pg_advisory_lock_shared(1635213688, 'axa_queue'::regclass::oid::int4)::text IS NULL
        THEN NULL
    WHEN pg_advisory_lock(1635213687, 'axa_queue'::regclass::oid::int4)::text IS NULL THEN NULL
    WHEN pg_advisory_unlock(1635213687, 'axa_queue'::regclass::oid::int4)
        THEN 'axa_queue'::regclass::oid::text
    END AS tag"""
"""Say this session waits for jobs of the table to finish, until it ends: hold the
waiting lock shared, so statements that finish jobs notify `DONE_CHANNEL`; then take
and let go the ending lock, which waits for every such statement that may have asked
before to commit (see `EXCHANGE`). Sent after `LISTEN_DONE`, before reading any row
waited for. Returns the table's oid, which notifications name."""

SESSION_SETTINGS = "SET jit = off; SET plan_cache_mode = force_generic_plan"
"""The claim's estimates can tempt the JIT, which costs far more than the query. Set
only on connections that are the queue's own: never behind a transaction pooler, where
they would stay on a server connection other clients then use (see `pooler`)."""

# --- A schema named in every statement ---------------------------------------------------

_TABLE = re.compile(
    r"(?<![\w.'\"])(?<!LISTEN )(axa_queue|axa_schedule|axa_job_acts|axa_schema_version|axa_workers|axa_rate_slots)(?![\w.'\"(])"
)
"""A table named in a statement; not the channel (`'axa_queue'`, `LISTEN axa_queue`),
a setting (`axa_queue.notify`), a `table.column` or a longer name (`axa_queue_ready`)."""

_TABLE_LITERAL = re.compile(
    r"(?<=to_regclass\(')(axa_queue|axa_schedule|axa_job_acts|axa_schema_version|axa_workers|axa_rate_slots)(?=')"
    r"|(?<=')(axa_queue|axa_schedule|axa_job_acts|axa_schema_version|axa_workers|axa_rate_slots)(?='::regclass)"
)
"""A table named in a literal that becomes a `regclass`."""

_FUNCTION = re.compile(
    r"(?<![\w.])(axa_queue_notify|axa_job_acts_refuse|axa_job_acts_role|axa_queue_room|axa_queue_rate_room)(?=\()"
)
"""A function the setup makes (a trigger of the same name is not followed by `(`)."""


@functools.lru_cache(maxsize=1024)
def in_schema(statement: str, schema: str) -> str:
    """`statement` with the queue's tables and functions qualified by `schema`, so it
    runs whatever the connection's `search_path` (a transaction pooler refuses to set
    it at connect, and shares the server connection). Computed once per statement.

    `schema` must be a plain lowercase name (`QueueOptions` checks it); it goes in
    quoted as an identifier, and inside the `regclass` literals (where a plain name
    needs no escaping) as well."""
    quoted = pgsql.Identifier(schema).as_string()
    statement = _TABLE.sub(lambda m: f"{quoted}.{m[1]}", statement)
    statement = _TABLE_LITERAL.sub(lambda m: f"{quoted}.{m[0]}", statement)
    return _FUNCTION.sub(lambda m: f"{quoted}.{m[1]}", statement)
