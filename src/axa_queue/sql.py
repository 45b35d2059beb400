"""Every SQL statement axa-queue sends, each named and with a line saying what it does.

The tables are the reference crate's (`axa_queue`, `axa_schedule`, `axa_job_acts`)
with the same columns, types and status strings, so a Rust service using the crate
and a Python service using this package can share one queue. What this package adds
is additive: indexes, a CHECK constraint marked NOT VALID, table storage settings and
a statement-level trigger that sends one notification per INSERT statement.

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

__all__ = ["CHANNEL", "SETUP_LOCK", "SETUP_STATEMENTS", "in_schema"]

CHANNEL = "axa_queue"
"""The LISTEN/NOTIFY channel; the payload is `<schema> <seconds until the earliest new job>`."""

SETUP_LOCK = 0x0061_7861_5F71
"""Advisory lock key held while setup runs: `axa_q` as bytes, as the crate uses."""

# --- Schema: the crate's statements, in the crate's order ------------------------------

SETUP_QUEUE = """CREATE TABLE IF NOT EXISTS axa_queue (
    id UUID PRIMARY KEY,
    name TEXT NOT NULL,
    args JSONB NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    error TEXT,
    run_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
"""The jobs table as axa 0.1.0 made it; later statements bring it up to date."""

SETUP_ATTEMPTS = (
    "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS attempts INTEGER NOT NULL DEFAULT 0"
)
"""Runs so far; each claim adds one, and it fences every later write of that run."""

SETUP_MAX_ATTEMPTS = "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS max_attempts INTEGER"
"""A job's own limit on tries, or NULL for the worker's default."""

SETUP_READY_INDEX = (
    "CREATE INDEX IF NOT EXISTS axa_queue_ready ON axa_queue (run_at) WHERE status = 'queued'"
)
"""Queued jobs by due time (axa 0.1.0's claim index)."""

SETUP_PRIORITY = (
    "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS priority SMALLINT NOT NULL DEFAULT 0"
)
"""Higher runs first."""

SETUP_TIMEOUT = "ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS timeout_ms BIGINT"
"""A job's own time limit per run, or NULL for none."""

SETUP_CLAIM_INDEX = """CREATE INDEX IF NOT EXISTS axa_queue_claim
    ON axa_queue (priority DESC, run_at) WHERE status = 'queued'"""
"""Queued jobs in claim order; small, because finished rows are not in it."""

SETUP_SCHEDULE = """CREATE TABLE IF NOT EXISTS axa_schedule (
    name TEXT PRIMARY KEY,
    due_at TIMESTAMPTZ NOT NULL,
    last_job UUID,
    interval_ms BIGINT,
    seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    archived_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
"""One row per recurring schedule: when it is next due and the last job it queued."""

SETUP_ACTS = """CREATE TABLE IF NOT EXISTS axa_job_acts (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id UUID NOT NULL,
    job_name TEXT NOT NULL,
    act TEXT NOT NULL CHECK (act IN ('cancelled', 'retried', 'released')),
    attempts INTEGER NOT NULL,
    by TEXT NOT NULL CHECK (length(by) BETWEEN 1 AND 200 AND by !~ '[[:cntrl:]]'),
    reason TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 200 AND reason !~ '[[:cntrl:]]'),
    at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
"""A person's acts on jobs: a record, only ever inserted into, with no foreign key so it
outlives the job's row."""

SETUP_ACTS_INDEX = "CREATE INDEX IF NOT EXISTS axa_job_acts_job ON axa_job_acts (job_id, id)"
"""A job's acts in order."""

SETUP_ACTS_REFUSE = """CREATE OR REPLACE FUNCTION axa_job_acts_refuse() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on % is refused: acts on jobs are only ever added to',
        TG_OP, TG_TABLE_NAME;
END
$$"""
"""Refuses whatever fired it, whoever sent it."""

SETUP_ACTS_ROWS = """CREATE OR REPLACE TRIGGER axa_job_acts_refuse
    BEFORE UPDATE OR DELETE ON axa_job_acts
    FOR EACH ROW EXECUTE FUNCTION axa_job_acts_refuse()"""
"""No act is ever changed or deleted."""

SETUP_ACTS_TRUNCATE = """CREATE OR REPLACE TRIGGER axa_job_acts_refuse_truncate
    BEFORE TRUNCATE ON axa_job_acts
    FOR EACH STATEMENT EXECUTE FUNCTION axa_job_acts_refuse()"""
"""Nor is the table emptied."""

SETUP_ACTS_ALWAYS = """ALTER TABLE axa_job_acts
    ENABLE ALWAYS TRIGGER axa_job_acts_refuse,
    ENABLE ALWAYS TRIGGER axa_job_acts_refuse_truncate"""
"""The refusals fire even with `session_replication_role = replica`."""

# --- Schema: what this package adds, all additive --------------------------------------

SETUP_RUNNING_INDEX = """CREATE INDEX IF NOT EXISTS axa_queue_running
    ON axa_queue (updated_at) WHERE status = 'running'"""
"""Running jobs by last report, so stale recovery reads only running rows."""

SETUP_FINISHED_INDEX = """CREATE INDEX IF NOT EXISTS axa_queue_finished
    ON axa_queue (updated_at) WHERE status IN ('completed', 'failed', 'cancelled')"""
"""Finished jobs by age, so retention deletes in small batches without a table scan."""

SETUP_PICK_INDEX = """CREATE INDEX IF NOT EXISTS axa_queue_pick
    ON axa_queue (name, priority DESC, run_at) WHERE status = 'queued'"""
"""Queued jobs by name in claim order, so a worker reads only the names it handles, at
exactly the priority level it wants; on a large existing table, create it CONCURRENTLY
first (setup then skips it)."""

SETUP_REVIEW_INDEX = """CREATE INDEX IF NOT EXISTS axa_queue_review
    ON axa_queue (updated_at) WHERE status = 'needs_review'"""
"""Jobs waiting for a person, for review screens."""

SETUP_STATE_CHECK = """DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'axa_queue_state_valid' AND conrelid = 'axa_queue'::regclass
    ) THEN
        ALTER TABLE axa_queue ADD CONSTRAINT axa_queue_state_valid CHECK (
            status IN ('queued', 'running', 'completed', 'failed', 'cancelled', 'needs_review')
            AND attempts >= 0
            AND (status <> 'running' OR started_at IS NOT NULL)
        ) NOT VALID;
    END IF;
END
$$"""
"""The table refuses unknown states, and a running job without a start; NOT VALID so
rows already there are not rescanned (an old table may hold anything)."""

SETUP_ACTS_ROLE = """DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = 'axa_job_acts'::regclass AND attname = 'db_role' AND NOT attisdropped
    ) THEN
        ALTER TABLE axa_job_acts ADD COLUMN IF NOT EXISTS db_role TEXT,
            ALTER COLUMN db_role SET DEFAULT current_user;
    END IF;
END
$$"""
"""Each act keeps the database role that inserted it (`current_user`), whoever's
statement it was, the Rust crate's included. Acts kept before the column was added
have none (NULL), rather than the role that ran setup; added once, so later setups take
no lock."""

SETUP_ACTS_ROLE_FUNCTION = """CREATE OR REPLACE FUNCTION axa_job_acts_role() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.db_role := current_user;
    RETURN NEW;
END
$$"""
"""Sets an act's role to the role inserting it, whatever the INSERT said."""

SETUP_ACTS_ROLE_TRIGGER = """CREATE OR REPLACE TRIGGER axa_job_acts_role
    BEFORE INSERT ON axa_job_acts
    FOR EACH ROW EXECUTE FUNCTION axa_job_acts_role()"""
"""No insert chooses its own `db_role`: a role that may insert acts can write any `by`,
but not another role's name."""

SETUP_ACTS_ROLE_ALWAYS = "ALTER TABLE axa_job_acts ENABLE ALWAYS TRIGGER axa_job_acts_role"
"""It fires even with `session_replication_role = replica`."""

SETUP_ACTS_CODES = r"""DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'axa_job_acts_codes_visible' AND conrelid = 'axa_job_acts'::regclass
    ) THEN
        ALTER TABLE axa_job_acts ADD CONSTRAINT axa_job_acts_codes_visible CHECK (
            by !~ '^ | $|[\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]'
            AND reason !~ '^ | $|[\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]'
        ) NOT VALID;
    END IF;
END
$$"""
"""The table refuses a `by` or `reason` with a space first or last (so a blank one) or
with an invisible character PostgreSQL's `[[:cntrl:]]` lets through: zero-width and
bidi controls (U+200B..U+200F, U+202A..U+202E, U+2066..U+2069), line and paragraph
separators, the BOM, soft hyphen and tag characters. `acts.check_code` refuses all this
and more before anything is sent; this keeps acts other clients insert visible too. NOT
VALID, so acts already kept are not rescanned (and they may never be changed)."""

SETUP_STORAGE = """DO $$
BEGIN
    IF NOT coalesce((SELECT reloptions FROM pg_class WHERE oid = 'axa_queue'::regclass)
                    @> ARRAY['fillfactor=80', 'autovacuum_vacuum_scale_factor=0.02',
                             'autovacuum_analyze_scale_factor=0.02'], false) THEN
        ALTER TABLE axa_queue SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
                                   autovacuum_analyze_scale_factor = 0.02);
    END IF;
END
$$"""
"""Room on each page for a row's new versions (claims, endings, heartbeats) to stay on
its page, and vacuum that keeps up with a hot table; set once, so later setups take no
lock. (Heartbeats are not HOT updates: `updated_at` keys the partial indexes that stale
recovery and retention read.)"""

SETUP_NOTIFY_FUNCTION = """CREATE OR REPLACE FUNCTION axa_queue_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    earliest TIMESTAMPTZ;
BEGIN
    IF current_setting('axa_queue.notify', true) IS DISTINCT FROM 'off' THEN
        SELECT min(run_at) INTO earliest FROM axa_queue_inserted WHERE status = 'queued';
        IF earliest IS NOT NULL THEN
            PERFORM pg_notify('axa_queue', TG_TABLE_SCHEMA || ' '
                || greatest(EXTRACT(EPOCH FROM earliest) - EXTRACT(EPOCH FROM now()),
                            0)::float8::text);
        END IF;
    END IF;
    RETURN NULL;
END
$$"""
"""One notification per INSERT statement, however many rows, saying when the earliest
new job is due; `SET axa_queue.notify = off` silences it for a session. The delay is a
difference of epoch seconds, so a `run_at` of `infinity` (another client's) is no
error before PostgreSQL 17, where timestamps at infinity cannot be subtracted."""

SETUP_NOTIFY_TRIGGER = """CREATE OR REPLACE TRIGGER axa_queue_notify
    AFTER INSERT ON axa_queue REFERENCING NEW TABLE AS axa_queue_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION axa_queue_notify()"""
"""Wakes workers for jobs queued by anyone, the Rust crate included."""

SETUP_STATEMENTS: tuple[str, ...] = (
    SETUP_QUEUE,
    SETUP_ATTEMPTS,
    SETUP_MAX_ATTEMPTS,
    SETUP_READY_INDEX,
    SETUP_PRIORITY,
    SETUP_TIMEOUT,
    SETUP_CLAIM_INDEX,
    SETUP_SCHEDULE,
    SETUP_ACTS,
    SETUP_ACTS_INDEX,
    SETUP_ACTS_REFUSE,
    SETUP_ACTS_ROWS,
    SETUP_ACTS_TRUNCATE,
    SETUP_ACTS_ALWAYS,
    SETUP_RUNNING_INDEX,
    SETUP_FINISHED_INDEX,
    SETUP_REVIEW_INDEX,
    SETUP_PICK_INDEX,
    SETUP_STATE_CHECK,
    SETUP_ACTS_ROLE,
    SETUP_ACTS_ROLE_FUNCTION,
    SETUP_ACTS_ROLE_TRIGGER,
    SETUP_ACTS_ROLE_ALWAYS,
    SETUP_ACTS_CODES,
    SETUP_STORAGE,
    SETUP_NOTIFY_FUNCTION,
    SETUP_NOTIFY_TRIGGER,
)
"""The ordered statements that make or update the tables, each safe to repeat; the
first fourteen are the crate's own. Needs PostgreSQL 14 or later. Run them in one
transaction holding `pg_advisory_xact_lock(SETUP_LOCK)`, as `Queue.setup` does."""

TAKE_SETUP_LOCK = "SELECT pg_advisory_xact_lock(%s)"
"""Run setup one service at a time; released when the transaction ends."""

SETUP_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"
"""`SET LOCAL lock_timeout` for setup's transaction (the value as a parameter): its DDL
waits behind an application's open transaction no longer than this, rather than holding
every claim and enqueue queued behind its own ACCESS EXCLUSIVE request."""

SETUP_MISSING = """SELECT 'table ' || t FROM unnest(%(tables)s::text[]) AS t
        WHERE to_regclass(t) IS NULL
    UNION ALL
    SELECT 'column ' || c.t || '.' || c.c
        FROM unnest(%(column_tables)s::text[], %(columns)s::text[]) AS c(t, c)
        WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
            WHERE a.attrelid = to_regclass(c.t) AND a.attname = c.c AND NOT a.attisdropped)
    UNION ALL
    SELECT 'index ' || i FROM unnest(%(indexes)s::text[]) AS i
        WHERE to_regclass(i) IS NULL
    UNION ALL
    SELECT 'constraint ' || k.c FROM unnest(%(constraint_tables)s::text[],
            %(constraints)s::text[]) AS k(t, c)
        WHERE NOT EXISTS (SELECT 1 FROM pg_constraint n
            WHERE n.conrelid = to_regclass(k.t) AND n.conname = k.c)
    UNION ALL
    SELECT 'function ' || f.f || '()' FROM unnest(%(functions)s::text[], %(bodies)s::text[])
            AS f(f, body)
        WHERE NOT EXISTS (SELECT 1 FROM pg_proc p
            WHERE p.oid = to_regprocedure(f.f || '()') AND p.prosrc = f.body)
    UNION ALL
    SELECT 'trigger ' || g.g FROM unnest(%(trigger_tables)s::text[], %(triggers)s::text[],
            %(trigger_always)s::bool[]) AS g(t, g, always)
        WHERE NOT EXISTS (SELECT 1 FROM pg_trigger r
            WHERE r.tgrelid = to_regclass(g.t) AND r.tgname = g.g
              AND CASE WHEN g.always THEN r.tgenabled::text = 'A'
                       ELSE r.tgenabled::text <> 'D' END)
    UNION ALL
    SELECT DISTINCT 'storage settings of ' || o.t
        FROM unnest(%(storage_tables)s::text[], %(storage)s::text[]) AS o(t, setting)
        WHERE NOT coalesce((SELECT reloptions FROM pg_class WHERE oid = to_regclass(o.t))
                           @> ARRAY[o.setting], false)"""
"""What `SETUP_STATEMENTS` would still change: tables, columns, indexes, constraints,
functions (by their body), triggers (and whether they fire always) and storage settings
that are missing or differ, one line each. It reads only the catalogs, so it takes no
lock an application's transaction could be holding: when nothing is missing, setup runs
nothing more (`ALTER TABLE ... ADD COLUMN IF NOT EXISTS` would take an ACCESS EXCLUSIVE
lock on the jobs table even with the column there). The lists come from the setup
statements themselves (`queue.setup_expectations`)."""

# --- Checks ----------------------------------------------------------------------------

CHECK_QUEUE = "SELECT id, name, args, status, error, run_at, started_at, created_at, updated_at, attempts, max_attempts, priority, timeout_ms FROM axa_queue LIMIT 0"
"""Fails unless the jobs table has every column."""

CHECK_SCHEDULE = "SELECT name, due_at, last_job, interval_ms, seen_at, archived_at, created_at, updated_at FROM axa_schedule LIMIT 0"
"""Fails unless the schedule table has every column."""

CHECK_ACTS = (
    "SELECT id, job_id, job_name, act, attempts, by, reason, at, db_role FROM axa_job_acts LIMIT 0"
)
"""Fails unless the acts table has every column."""

MISSING_TRIGGERS = """SELECT want FROM unnest(%s::text[]) AS want
    WHERE NOT EXISTS (
        SELECT 1 FROM pg_trigger t
        WHERE t.tgrelid = to_regclass('axa_job_acts') AND t.tgname = want
          AND t.tgenabled::text = 'A'
    )"""
"""The named triggers of `axa_job_acts` that are missing or not set to fire always."""

HAS_NOTIFY_TRIGGER = """SELECT EXISTS (SELECT 1 FROM pg_trigger
    WHERE tgrelid = to_regclass('axa_queue') AND tgname = 'axa_queue_notify'
      AND tgenabled::text <> 'D')"""
"""Whether inserts notify; without it workers fall back to polling."""

CURRENT_SCHEMA = "SELECT current_schema()"
"""The schema the tables resolve to, which notifications name (unless the queue is
given its schema)."""

# --- Enqueue ---------------------------------------------------------------------------

ENQUEUE = """INSERT INTO axa_queue (id, name, args, max_attempts, priority, run_at, timeout_ms)
    VALUES (%(id)s, %(name)s, %(args)s::jsonb, %(max_attempts)s, %(priority)s,
            COALESCE(%(at)s, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s)),
            %(timeout_ms)s)"""
"""Queue one job; run_at is the given time, or now plus a delay on the database's clock."""

ENQUEUE_MANY = """INSERT INTO axa_queue (id, name, args, max_attempts, priority, run_at, timeout_ms)
    SELECT j.id, j.name, j.args::jsonb, j.max_attempts, j.priority,
           COALESCE(j.at, COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => j.delay)),
           j.timeout_ms
    FROM unnest(%(id)s::uuid[], %(name)s::text[], %(args)s::text[], %(max_attempts)s::int[],
                %(priority)s::smallint[], %(at)s::timestamptz[], %(delay)s::float8[],
                %(timeout_ms)s::bigint[])
         AS j(id, name, args, max_attempts, priority, at, delay, timeout_ms)"""
"""Queue many jobs in one statement (one notification, one round trip)."""

# --- Running jobs ----------------------------------------------------------------------

EXCHANGE = """WITH RECURSIVE endings AS (
        SELECT d.id, d.attempts, 'completed' AS status, NULL::text AS error, 0::float8 AS delay
        FROM unnest(%(completed)s::uuid[], %(completed_attempts)s::int[]) AS d(id, attempts)
        UNION ALL
        SELECT * FROM json_to_recordset(%(endings)s::json)
            AS r(id uuid, attempts int, status text, error text, delay float8)
    ), finished AS (
        UPDATE axa_queue q
        SET status = r.status, error = r.error, updated_at = now(),
            started_at = CASE WHEN r.status = 'queued' THEN NULL ELSE q.started_at END,
            run_at = CASE WHEN r.status = 'queued'
                          THEN now() + make_interval(secs => r.delay) ELSE q.run_at END
        FROM endings r
        WHERE q.id = ANY(ARRAY(SELECT id FROM endings)) AND q.id = r.id
          AND q.attempts = r.attempts AND q.status = (SELECT 'running')
        RETURNING q.id::text AS id, q.attempts
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
        SELECT id FROM (
            SELECT id, priority, run_at, cap,
                   row_number() OVER (PARTITION BY name ORDER BY priority DESC, run_at) AS n
            FROM candidates
        ) c WHERE n <= cap ORDER BY priority DESC, run_at LIMIT %(free)s
    ), claimed AS (
        UPDATE axa_queue q
        SET status = 'running', started_at = clock_timestamp(), updated_at = clock_timestamp(),
            attempts = q.attempts + 1
        WHERE q.id = ANY(ARRAY(SELECT id FROM picked))
        RETURNING q.id::text AS id, q.attempts, q.name, q.args::text AS args, q.max_attempts,
                  q.timeout_ms, q.priority, extract(epoch FROM q.run_at)::float8 AS run_at
    )
    SELECT id, attempts, NULL, NULL, NULL, NULL, NULL, NULL FROM finished
    UNION ALL
    SELECT id, attempts, name, args, max_attempts, timeout_ms, priority, run_at FROM claimed"""
"""In one statement and one commit: record how runs ended (completed, failed, or queued
again after a backoff), each row fenced by its own attempt, and claim up to `free` ready
jobs of the wanted names, highest priority then oldest first, at most `cap` of each.

Rows with a name are the jobs claimed; rows without are the endings recorded (an ending
not returned had lost its claim). The claim walks the priority levels with a recursive
CTE and scans `axa_queue_pick` per (name, level), so delayed jobs and jobs of other names
are never read; it picks in a MATERIALIZED CTE, so no more than `free` rows change, and
updates them by primary key (`id = ANY(ARRAY(...))`), which a generic plan cannot turn
into a hash join over the whole table. Writing endings and claiming together halves the
statements per job: the loop that frees a place writes its ending and fills the place.

Completed runs, nearly every ending, arrive as two array literals (`completed`: ids,
`completed_attempts`: their attempts, in the same order); the other endings and the
wanted names as JSON arrays (`[{"id", "attempts", "status", "error", "delay"}]` and
`[{"name", "cap"}]`). Each is one text parameter: far cheaper for the client to build
than a list per column (psycopg's list dumpers are pure Python) or JSON per ending. Ids
come back as text and `run_at` as epoch seconds, which the client reads and sorts by
more cheaply than `uuid` and `timestamptz`. Endings find their rows by primary key
(`id = ANY(ARRAY(...))` again), and the fence compares the status with
`(SELECT 'running')`, a value the planner cannot match to the partial index of running
jobs: else, whenever its statistics say few jobs run, it scans that index whole (every
running job of every worker, and the dead entries vacuum has not cleared yet), or on a
table of some thousand rows the table.

Fencing: the claim never takes a job whose ending is in this statement, nor one in
`losing` (jobs of this process whose run lost its claim, until its job's fate is
written): an ending refused because recovery queued the job again is never followed
by a new run of it here. The endings are written first (they may wait for a row lock)
and the claims after, stamped with `clock_timestamp()`: a claim is stamped when its
row is written, never with a time from before a wait, so it cannot land stale."""

HEARTBEAT = """WITH beats AS (
        SELECT * FROM unnest(%s::uuid[], %s::int[]) AS r(id, attempts)
    )
    UPDATE axa_queue q SET updated_at = clock_timestamp()
    FROM beats r
    WHERE q.id = ANY(ARRAY(SELECT id FROM beats)) AND q.id = r.id
      AND q.attempts = r.attempts AND q.status = (SELECT 'running')
    RETURNING q.id::text, q.attempts"""
"""Report in for every run of this process at once; a run whose attempt no longer matches
is not returned: it lost its claim. Rows are found by primary key, as `EXCHANGE`'s
endings are, never by scanning every running job of every worker. Stamped with
`clock_timestamp()`, when the row is written, even after waiting for a lock."""

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
        SET status = d.becomes, error = %(error)s, updated_at = clock_timestamp(),
            started_at = CASE WHEN d.becomes = 'queued' THEN NULL ELSE q.started_at END,
            run_at = CASE WHEN d.becomes = 'queued' THEN now() ELSE q.run_at END
        FROM decided d WHERE q.id = d.id AND d.becomes IS NOT NULL
        RETURNING q.status
    )
    SELECT d.status, d.attempts, (SELECT status FROM changed) FROM decided d"""
"""A run of this process lost its claim or gave it up: decide on the row as it is now
(locked) what becomes of the job, and return what was found (status, attempts) and
what it was changed to (NULL: nothing).

- A run whose handler never started (`started` false) changes nothing: it did no work.
- The run's own ending is there (`ending`, `ending_error` under its attempt: an
  exchange whose answer was lost, then sent again): nothing to do.
- Still `running` under the run's attempt: no one took it, its process gave it up (it
  could not report in for `stale_after`), so the job goes back to the queue at once,
  or fails when out of attempts, as stale recovery would have it.
- A run that gave up (`gave_up`: it could not report in for `stale_after`) stopped
  before anyone could take its claim (recovery needs `stale_after` of silence from the
  last report it sent): whatever became of the job since is left as it is.
- `queued`, `running` or `failed` otherwise: another worker or recovery took the claim
  while the run went on, so the job may have run in part or twice and waits for a
  person (`needs_review`); a run holding it now is stopped at its next report.
- `completed`, `cancelled` or already `needs_review`: left as it is (a job another run
  completed stays completed)."""

# --- Housekeeping ----------------------------------------------------------------------

RECOVER_STALE = """UPDATE axa_queue
    SET status = CASE WHEN attempts < COALESCE(max_attempts, %(max)s) THEN 'queued' ELSE 'failed' END,
        error = CASE WHEN attempts < COALESCE(max_attempts, %(max)s) THEN error
                     ELSE 'abandoned by its worker' END,
        started_at = CASE WHEN attempts < COALESCE(max_attempts, %(max)s) THEN NULL
                          ELSE started_at END,
        updated_at = COALESCE(%(now)s::timestamptz, now())
    WHERE status = 'running' AND updated_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
      AND (pg_postmaster_start_time() < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)
           OR updated_at < pg_postmaster_start_time() - make_interval(secs => %(stale)s))
      AND (id, attempts) NOT IN (
          SELECT * FROM unnest(%(held)s::uuid[], %(held_attempts)s::int[]))
    RETURNING id, name, attempts, status"""
"""Recover runs not heard from for the stale period: queued again with attempts left,
else failed, so a crash can never loop for ever.

Never a run the recovering process holds itself (`held`, `held_attempts`), and, within
the stale period after the server started, only runs silent for that long before it
started: a restart cut every worker off, so the silence since says nothing. It compares with `now()`, the statement's start, never
later than when a row is read: a recovery held up by a lock judges as of before its
wait, so it can only find fewer runs stale (claims and heartbeats stamp the time they
write)."""

STALE = """SELECT id, name, attempts,
        CASE WHEN attempts < COALESCE(max_attempts, %(max)s) THEN 'queued' ELSE 'failed' END
            AS status
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
    EXTRACT(EPOCH FROM run_at) AS run_at, EXTRACT(EPOCH FROM started_at) AS started_at,
    EXTRACT(EPOCH FROM created_at) AS created_at, EXTRACT(EPOCH FROM updated_at) AS updated_at
    FROM axa_queue WHERE id = %s"""
"""One job, without its arguments. Times come as epoch seconds (exact numeric), which
any row can be read as: a `timestamptz` PostgreSQL holds but Python's `datetime` cannot
(`infinity`, past year 9999, or year 9999 shown in a session time zone east of UTC),
written by another client, would otherwise fail the read (`jobs.moment` clamps it)."""

JOBS = """SELECT id, name, status, attempts, max_attempts, priority, error, timeout_ms,
    EXTRACT(EPOCH FROM run_at) AS run_at, EXTRACT(EPOCH FROM started_at) AS started_at,
    EXTRACT(EPOCH FROM created_at) AS created_at, EXTRACT(EPOCH FROM updated_at) AS updated_at
    FROM axa_queue
    WHERE (%(state)s::text IS NULL OR status = %(state)s)
      AND (%(name)s::text IS NULL OR name = %(name)s)
    ORDER BY axa_queue.created_at DESC, id LIMIT %(limit)s"""
"""The newest jobs, optionally of one state and name, without their arguments; times
as epoch seconds, as `JOB` reads them, so one odd row never breaks the listing."""

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

PING = "SELECT 1"
"""Whether the database answers."""

# --- Acts ------------------------------------------------------------------------------

CANCEL = """WITH changed AS (
        UPDATE axa_queue SET status = 'cancelled', updated_at = COALESCE(%(now)s::timestamptz, now())
        WHERE id = %(id)s AND status = 'queued'
        RETURNING id, name, attempts
    ), kept AS (
        INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason)
        SELECT id, name, 'cancelled', attempts, %(by)s, %(reason)s FROM changed
        RETURNING act
    )
    SELECT (SELECT act FROM kept) AS act,
        (SELECT status FROM axa_queue WHERE id = %(id)s) AS found"""
"""Cancel a queued job and keep the act, in one statement; any other state changes
nothing and writes no act. Returns the act kept (or NULL) and the state it found."""

RETRY = """WITH target AS (
        SELECT id, status FROM axa_queue
        WHERE id = %(id)s AND status IN ('failed', 'needs_review')
        FOR UPDATE
    ), changed AS (
        UPDATE axa_queue q
        SET status = 'queued', run_at = COALESCE(%(now)s::timestamptz, now()), started_at = NULL,
            updated_at = COALESCE(%(now)s::timestamptz, now()),
            max_attempts = q.attempts + 1
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
Returns the act kept (or NULL) and the state it found."""

ACTS = """SELECT id, job_id, job_name, act, attempts, by, reason, EXTRACT(EPOCH FROM at) AS at,
    db_role FROM axa_job_acts WHERE job_id = %s ORDER BY id"""
"""Every act done to one job, oldest first; its time as epoch seconds, as `JOB` reads
times."""

# --- Schedules -------------------------------------------------------------------------

SCHEDULES_SEEN = """INSERT INTO axa_schedule (name, due_at, interval_ms, seen_at)
    SELECT s.name, COALESCE(s.first_at, COALESCE(%(now)s::timestamptz, now())), s.interval_ms,
           COALESCE(%(now)s::timestamptz, now())
    FROM unnest(%(names)s::text[], %(first_at)s::timestamptz[], %(interval_ms)s::bigint[])
         AS s(name, first_at, interval_ms)
    ON CONFLICT (name) DO UPDATE
    SET seen_at = COALESCE(%(now)s::timestamptz, now()), archived_at = NULL, interval_ms = EXCLUDED.interval_ms
    WHERE axa_schedule.archived_at IS NOT NULL
       OR axa_schedule.interval_ms IS DISTINCT FROM EXCLUDED.interval_ms
       OR axa_schedule.seen_at < COALESCE(%(now)s::timestamptz, now()) - interval '1 minute'"""
"""Make each schedule's row, or say it is still in code: restore it if archived, and note
its interval. `seen_at` moves at most once a minute, so a tick rarely writes."""

SCHEDULES_DUE = """SELECT name FROM axa_schedule
    WHERE name = ANY(%(names)s::text[]) AND archived_at IS NULL AND due_at <= COALESCE(%(now)s::timestamptz, now())"""
"""Which schedules are due, without locking: most ticks stop here."""

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

SCHEDULE_ARCHIVE = """UPDATE axa_schedule SET archived_at = COALESCE(%(now)s::timestamptz, now()), updated_at = COALESCE(%(now)s::timestamptz, now())
    WHERE archived_at IS NULL AND name <> ALL(%(in_code)s::text[])
      AND seen_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(stale)s)"""
"""Archive schedules no live process has in code (unseen for the stale period)."""

SCHEDULES = """SELECT s.name, s.interval_ms, EXTRACT(EPOCH FROM s.due_at) AS due_at, s.last_job,
    EXTRACT(EPOCH FROM s.seen_at) AS seen_at, EXTRACT(EPOCH FROM s.archived_at) AS archived_at,
    EXTRACT(EPOCH FROM s.created_at) AS created_at, q.status AS last_status, q.error AS last_error
    FROM axa_schedule s LEFT JOIN axa_queue q ON q.id = s.last_job ORDER BY s.name"""
"""Every schedule, archived or not, with its last job's state; times as epoch seconds,
as `JOB` reads them."""

# --- Notifications ---------------------------------------------------------------------

LISTEN = "LISTEN axa_queue"
"""Receive wake-ups for new jobs."""

SESSION_SETTINGS = "SET jit = off; SET plan_cache_mode = force_generic_plan"
"""The claim's estimates can tempt the JIT, which costs far more than the query. Set
only on connections that are the queue's own: never behind a transaction pooler, where
they would stay on a server connection other clients then use (see `pooler`)."""

# --- A schema named in every statement ---------------------------------------------------

_TABLE = re.compile(r"(?<![\w.'\"])(?<!LISTEN )(axa_queue|axa_schedule|axa_job_acts)(?![\w.'\"(])")
"""A table named in a statement; not the channel (`'axa_queue'`, `LISTEN axa_queue`),
a setting (`axa_queue.notify`), a `table.column` or a longer name (`axa_queue_ready`)."""

_TABLE_LITERAL = re.compile(
    r"(?<=to_regclass\(')(axa_queue|axa_schedule|axa_job_acts)(?=')"
    r"|(?<=')(axa_queue|axa_schedule|axa_job_acts)(?='::regclass)"
)
"""A table named in a literal that becomes a `regclass`."""

_FUNCTION = re.compile(r"(?<![\w.])(axa_queue_notify|axa_job_acts_refuse|axa_job_acts_role)(?=\()")
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


# --- The demo's sandbox (`axa-queue demo --dsn`) ----------------------------------------
# Templates for `psycopg.sql.SQL(...).format(psycopg.sql.Identifier(name))`: the schema
# name goes in only as an identifier.

DEMO_SCHEMA_CREATE = "CREATE SCHEMA {}"
"""Make the schema the demo runs in, on a database the user gave, so their queue is untouched."""

DEMO_SCHEMA_DROP = "DROP SCHEMA IF EXISTS {} CASCADE"
"""Remove the demo's schema and everything in it when the demo ends."""
