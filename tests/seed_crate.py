"""The reference crates' own SQL, transcribed, to check our schema against.

These statements are the specification of wire compatibility: the Rust crate
`axa_postgres_job_queue` (seed 000, `lib.rs` lines 215-408) runs exactly these on the
same tables, and axa 0.1.0 (seed 002) made the first `axa_queue` table with `SETUP`
and `SETUP_INDEX` and queued into it with its `ENQUEUE`. Each is copied verbatim; only
sqlx's `$n` placeholders become psycopg's `%(pn)s`, so call one with `params(...)`:

    conn.execute(crate.STATUS, crate.params(job_id))

Nothing here is axa-queue's code: a change to this file is a change to what we claim
to be compatible with.
"""

from __future__ import annotations

import re
from typing import Any


def _pg(text: str) -> str:
    """`text` with sqlx's `$n` placeholders as psycopg's `%(pn)s`."""
    if re.search(r"\$\d", text) is None:
        return text  # no parameters: sent as is, `%` and `$$` included
    assert "%" not in text, "a literal % would need escaping"
    return re.sub(r"\$(\d+)", r"%(p\1)s", text)


def params(*values: Any) -> dict[str, Any]:
    """The values for `$1`, `$2`, ... of a converted statement."""
    return {f"p{n}": value for n, value in enumerate(values, start=1)}


# --- axa_postgres_job_queue (seed 000) ------------------------------------------------

SETUP = _pg(
    """CREATE TABLE IF NOT EXISTS axa_queue (
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
)

SETUP_INDEX = _pg(
    """CREATE INDEX IF NOT EXISTS axa_queue_ready ON axa_queue (run_at) WHERE status = 'queued'"""
)

SETUP_ATTEMPTS = _pg(
    """ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS attempts INTEGER NOT NULL DEFAULT 0"""
)
"""Tables created by axa 0.1.0 have no `attempts` column."""

SETUP_MAX_ATTEMPTS = _pg("""ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS max_attempts INTEGER""")
"""A job's own limit on tries, when it has one."""

SETUP_PRIORITY = _pg(
    """ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS priority SMALLINT NOT NULL DEFAULT 0"""
)
"""Higher runs first. Tables created before axa-postgres-job-queue have none."""

SETUP_TIMEOUT = _pg("""ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS timeout_ms BIGINT""")
"""A job's own time limit, when it has one."""

SETUP_CLAIM_INDEX = _pg(
    """CREATE INDEX IF NOT EXISTS axa_queue_claim
    ON axa_queue (priority DESC, run_at) WHERE status = 'queued'"""
)

SETUP_SCHEDULE = _pg(
    """CREATE TABLE IF NOT EXISTS axa_schedule (
    name TEXT PRIMARY KEY,
    due_at TIMESTAMPTZ NOT NULL,
    last_job UUID,
    interval_ms BIGINT,
    seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    archived_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
)

SETUP_ACTS = _pg(
    """CREATE TABLE IF NOT EXISTS axa_job_acts (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id UUID NOT NULL,
    job_name TEXT NOT NULL,
    act TEXT NOT NULL CHECK (act IN ('cancelled', 'retried', 'released')),
    attempts INTEGER NOT NULL,
    by TEXT NOT NULL CHECK (length(by) BETWEEN 1 AND 200 AND by !~ '[[:cntrl:]]'),
    reason TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 200 AND reason !~ '[[:cntrl:]]'),
    at TIMESTAMPTZ NOT NULL DEFAULT now()
)"""
)
"""A person's acts on jobs. This table is a record (P-7): it is only ever inserted into, and its triggers refuse every change. A job row is state, and retention deletes it, so an act names its job by id with no foreign key, and keeps the job's name and attempts as they were when the act was done."""

SETUP_ACTS_INDEX = _pg(
    """CREATE INDEX IF NOT EXISTS axa_job_acts_job ON axa_job_acts (job_id, id)"""
)

SETUP_ACTS_REFUSE = _pg(
    """CREATE OR REPLACE FUNCTION axa_job_acts_refuse() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on % is refused: acts on jobs are only ever added to',
        TG_OP, TG_TABLE_NAME;
END
$$"""
)
"""Refuses whatever fired it, whoever sent it."""

SETUP_ACTS_ROWS = _pg(
    """CREATE OR REPLACE TRIGGER axa_job_acts_refuse
    BEFORE UPDATE OR DELETE ON axa_job_acts
    FOR EACH ROW EXECUTE FUNCTION axa_job_acts_refuse()"""
)

SETUP_ACTS_TRUNCATE = _pg(
    """CREATE OR REPLACE TRIGGER axa_job_acts_refuse_truncate
    BEFORE TRUNCATE ON axa_job_acts
    FOR EACH STATEMENT EXECUTE FUNCTION axa_job_acts_refuse()"""
)

SETUP_ACTS_ALWAYS = _pg(
    """ALTER TABLE axa_job_acts
    ENABLE ALWAYS TRIGGER axa_job_acts_refuse,
    ENABLE ALWAYS TRIGGER axa_job_acts_refuse_truncate"""
)
"""`ENABLE ALWAYS` keeps the refusals on when `session_replication_role` is `replica`, which otherwise turns triggers off."""

MISSING_TRIGGERS = _pg(
    """SELECT want FROM unnest($1::text[]) AS want
    WHERE NOT EXISTS (
        SELECT 1 FROM pg_trigger t
        WHERE t.tgrelid = to_regclass('axa_job_acts') AND t.tgname = want
          AND t.tgenabled::text = 'A'
    )"""
)

ENQUEUE = _pg(
    """INSERT INTO axa_queue
    (id, name, args, max_attempts, priority, run_at, timeout_ms)
    VALUES ($1, $2, $3, $4, $5, COALESCE($6, now() + make_interval(secs => $7)), $8)"""
)

CLAIM = _pg(
    """UPDATE axa_queue
    SET status = 'running', started_at = now(), updated_at = now(), attempts = attempts + 1
    WHERE id = (
        SELECT id FROM axa_queue
        WHERE status = 'queued' AND run_at <= now() AND name = ANY($1)
        ORDER BY priority DESC, run_at
        FOR UPDATE SKIP LOCKED
        LIMIT 1
    )
    RETURNING id, name, args, attempts, max_attempts, timeout_ms"""
)

HEARTBEAT = _pg(
    """UPDATE axa_queue SET updated_at = now()
    WHERE id = $1 AND attempts = $2 AND status = 'running'"""
)
"""`attempts` identifies this run of the job, so a run that was given up on finds no row here and changes nothing."""

FINISH = _pg(
    """UPDATE axa_queue SET status = $3, error = $4, updated_at = now()
    WHERE id = $1 AND attempts = $2 AND status = 'running'"""
)

RETRY = _pg(
    """UPDATE axa_queue
    SET status = 'queued', error = $3, started_at = NULL, updated_at = now(),
        run_at = now() + make_interval(secs => $4)
    WHERE id = $1 AND attempts = $2 AND status = 'running'"""
)

REQUEUE_STALE = _pg(
    """UPDATE axa_queue
    SET status = 'queued', started_at = NULL, updated_at = now()
    WHERE status = 'running' AND updated_at < now() - make_interval(mins => $1)
      AND attempts < COALESCE(max_attempts, $2)"""
)

FAIL_STALE = _pg(
    """UPDATE axa_queue
    SET status = 'failed', error = 'abandoned by its worker', updated_at = now()
    WHERE status = 'running' AND updated_at < now() - make_interval(mins => $1)
      AND attempts >= COALESCE(max_attempts, $2)"""
)

PURGE = _pg(
    """DELETE FROM axa_queue
    WHERE status IN ('completed', 'failed', 'cancelled')
      AND updated_at < now() - make_interval(days => $1)"""
)

STATUS = _pg(
    """SELECT id, name, status, attempts, max_attempts, priority, error,
    timeout_ms, run_at, started_at, created_at, updated_at FROM axa_queue WHERE id = $1"""
)

MARK_LOST = _pg(
    """UPDATE axa_queue SET status = 'needs_review', error = $2, updated_at = now()
    WHERE id = $1 AND status IN ('queued', 'running', 'failed')"""
)
"""A run that lost its claim stops, and its job waits for a person. Another run may hold the row by now, and this stops that one too, at its next report. A row already completed is left alone."""

CANCEL = _pg(
    """WITH changed AS (
        UPDATE axa_queue SET status = 'cancelled', updated_at = now()
        WHERE id = $1 AND status = 'queued'
        RETURNING id, name, attempts
    )
    INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason)
    SELECT id, name, 'cancelled', attempts, $2, $3 FROM changed"""
)
"""Cancel a queued job and keep the act, in one statement. A job in any other state changes nothing and writes no act."""

RETRY_FAILED = _pg(
    """WITH target AS (
        SELECT id, status FROM axa_queue
        WHERE id = $1 AND status IN ('failed', 'needs_review')
        FOR UPDATE
    ), changed AS (
        UPDATE axa_queue q
        SET status = 'queued', run_at = now(), started_at = NULL, updated_at = now(),
            max_attempts = q.attempts + 1
        FROM target WHERE q.id = target.id
        RETURNING q.id, q.name, q.attempts, target.status AS was
    )
    INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason)
    SELECT id, name, CASE was WHEN 'needs_review' THEN 'released' ELSE 'retried' END,
        attempts, $2, $3
    FROM changed"""
)
"""A retried job gets one more try. `attempts` keeps rising, as it identifies each run, so a run given up on still cannot write over the new one. The act is `released` for a job in review and `retried` for a failed one, and is kept in the same statement."""

ACTS = _pg(
    """SELECT id, job_id, job_name, act, attempts, by, reason, at
    FROM axa_job_acts WHERE job_id = $1 ORDER BY id"""
)

COUNTS = _pg(
    """SELECT
    count(*) FILTER (WHERE status = 'queued' AND run_at <= now()) AS ready,
    count(*) FILTER (WHERE status = 'queued' AND run_at > now()) AS waiting,
    count(*) FILTER (WHERE status = 'running') AS running,
    count(*) FILTER (WHERE status = 'completed') AS completed,
    count(*) FILTER (WHERE status = 'failed') AS failed,
    count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
    count(*) FILTER (WHERE status = 'needs_review') AS needs_review,
    EXTRACT(EPOCH FROM now() - min(run_at) FILTER (WHERE status = 'queued' AND run_at <= now()))::float8 AS oldest
    FROM axa_queue"""
)

SCHEDULE_CREATE = _pg(
    """INSERT INTO axa_schedule (name, due_at, interval_ms)
    VALUES ($1, COALESCE($2, now()), $3)
    ON CONFLICT (name) DO UPDATE
    SET seen_at = now(), archived_at = NULL, interval_ms = EXCLUDED.interval_ms
    WHERE axa_schedule.archived_at IS NOT NULL
       OR axa_schedule.interval_ms IS DISTINCT FROM EXCLUDED.interval_ms
       OR axa_schedule.seen_at < now() - interval '1 minute'"""
)
"""Make the row, or say this schedule is still in code: restore it if it was archived, and note the interval. `seen_at` moves at most once a minute, so a tick does not write each poll."""

SCHEDULE_LOCK = _pg(
    """SELECT last_job, due_at <= now() AS due FROM axa_schedule
    WHERE name = $1 AND archived_at IS NULL FOR UPDATE SKIP LOCKED"""
)

SCHEDULE_ARCHIVE = _pg(
    """UPDATE axa_schedule SET archived_at = now(), updated_at = now()
    WHERE archived_at IS NULL AND name <> ALL($1)
      AND seen_at < now() - make_interval(mins => $2)"""
)
"""Archive schedules no live process has in code. A row any process still ticks is seen within a minute, so one unseen for `stale_minutes` is in none, and an old replica in a rolling deploy keeps its schedules until it stops."""

SCHEDULES = _pg(
    """SELECT s.name, s.interval_ms, s.due_at, s.last_job, s.seen_at,
    s.archived_at, s.created_at, q.status AS last_status, q.error AS last_error
    FROM axa_schedule s LEFT JOIN axa_queue q ON q.id = s.last_job ORDER BY s.name"""
)

SCHEDULE_BUSY = _pg(
    """SELECT EXISTS (SELECT 1 FROM axa_queue
    WHERE id = $1 AND status IN ('queued', 'running'))"""
)

SCHEDULE_ADVANCE = _pg(
    """UPDATE axa_schedule
    SET due_at = due_at + make_interval(secs => $2)
            * (floor(EXTRACT(EPOCH FROM now() - due_at)::float8 / $2) + 1),
        last_job = COALESCE($3, last_job), updated_at = now()
    WHERE name = $1"""
)
"""The next due time after now, a whole number of intervals from the last, on the database's clock. One expression gives no drift, one catch-up, and no stacking."""

ACTS_TRIGGERS = ["axa_job_acts_refuse", "axa_job_acts_refuse_truncate"]
"""The refusing triggers the crate's `check` requires, each set to fire always."""

SETUP_LOCK = 0x0061_7861_5F71
"""Advisory lock key for table setup: `axa_q` as bytes."""

SETUP_STATEMENTS = (
    SETUP,
    SETUP_ATTEMPTS,
    SETUP_MAX_ATTEMPTS,
    SETUP_INDEX,
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
)
"""The crate's 14 statements that make the tables, in its order."""

# --- axa 0.1.0 (seed 002) -------------------------------------------------------------

V010_SETUP = _pg(
    """CREATE TABLE IF NOT EXISTS axa_queue (
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
)

V010_SETUP_INDEX = _pg(
    """CREATE INDEX IF NOT EXISTS axa_queue_ready ON axa_queue (run_at) WHERE status = 'queued'"""
)

V010_SETUP_STATEMENTS = (V010_SETUP, V010_SETUP_INDEX)
"""What `Queue::connect` of axa 0.1.0 ran: the first jobs table."""

V010_ENQUEUE = _pg("""INSERT INTO axa_queue (id, name, args) VALUES ($1, $2, $3)""")
"""How axa 0.1.0 queued a job: no attempts, priority, delay or limits."""
