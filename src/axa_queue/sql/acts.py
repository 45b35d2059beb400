"""A person's acts on a job, each one statement that changes the job and keeps the
act (`axa_job_acts`), and the acts read back."""

from __future__ import annotations

from .history import HISTORY_COLUMNS_MOVED
from .naming import statement

__all__ = ["ACTS", "CANCEL", "RETRY"]

CANCEL = statement("""WITH target AS (
        SELECT id, status FROM {axa_queue}
        WHERE id = %(id)s AND status IN ('queued', 'running')
        FOR UPDATE
    ), changed AS (
        UPDATE {axa_queue} q SET status = 'cancelled', updated_at = COALESCE(%(now)s::timestamptz, now())
        FROM target WHERE q.id = target.id
        RETURNING q.id, q.name, q.attempts, target.status AS was
    ), kept AS (
        INSERT INTO {axa_job_acts} (job_id, job_name, act, attempts, by, reason)
        SELECT id, name, 'cancelled', attempts, %(by)s, %(reason)s FROM changed
        RETURNING act
    ), told AS (
        SELECT pg_notify('axa_queue_done', {'axa_queue'}::regclass::oid::text || ' ' || id::text)
        FROM changed
        UNION ALL
        SELECT pg_notify('axa_queue_cancel', id::text) FROM changed WHERE was = 'running'
    )
    SELECT (SELECT act FROM kept) AS act,
        COALESCE((SELECT status FROM target),
                 (SELECT status FROM {axa_queue} WHERE id = %(id)s),
                 (SELECT status FROM {axa_queue_history} WHERE id = %(id)s LIMIT 1)) AS found,
        (SELECT count(*) FROM told) AS told""")
"""Cancel a queued or running job and keep the act, in one statement; any other state
changes nothing and writes no act. Returns the act kept (or NULL) and the state it
found: the state it cancelled (read locked), else the state of the job it left alone,
moved to the history or not (a moved job is finished: never cancelled). A job cancelled is told to waiters (`DONE_CHANNEL`) when the
caller's transaction commits: always, without the advisory lock `EXCHANGE` asks, which
would be held until the caller's commit and keep new waiters waiting that long.

A running job's row becomes `cancelled` under the same attempt: the run's ending is
then refused by the fence (`status = 'running'`, ours and the crate's alike), its
heartbeat reports it cancelled (`HEARTBEAT`), and `CANCEL_CHANNEL` tells its process
at once, on the caller's commit (NOTIFY is transactional: a rollback tells no one)."""

RETRY = statement(
    """WITH target AS (
        SELECT id, status FROM {axa_queue}
        WHERE id = %(id)s AND status IN ('failed', 'needs_review')
        FOR UPDATE
    ), changed AS (
        UPDATE {axa_queue} q
        SET status = 'queued', run_at = COALESCE(%(now)s::timestamptz, now()), started_at = NULL,
            updated_at = COALESCE(%(now)s::timestamptz, now()),
            max_attempts = q.attempts + 1,
            unique_key = CASE WHEN target.status = 'failed' AND q.unique_for_ms IS NULL
                              THEN NULL ELSE q.unique_key END
        FROM target WHERE q.id = target.id
        RETURNING q.id, q.name, q.attempts, target.status AS was
    ), unmoved AS (
        DELETE FROM {axa_queue_history}
        WHERE id = %(id)s AND status = 'failed' AND NOT EXISTS (SELECT FROM target)
        RETURNING {columns}
    ), back AS (
        INSERT INTO {axa_queue} ({columns})
        SELECT id, name, args, 'queued', error, COALESCE(%(now)s::timestamptz, now()), NULL,
            created_at, COALESCE(%(now)s::timestamptz, now()), attempts, attempts + 1, priority,
            timeout_ms, trace_context, result, NULL, unique_for_ms, ahead, given_back
        FROM unmoved
        RETURNING id, name, attempts, 'failed'::text AS was
    ), kept AS (
        INSERT INTO {axa_job_acts} (job_id, job_name, act, attempts, by, reason)
        SELECT id, name, CASE was WHEN 'needs_review' THEN 'released' ELSE 'retried' END,
            attempts, %(by)s, %(reason)s
        FROM (SELECT * FROM changed UNION ALL SELECT * FROM back) acted
        RETURNING act
    )
    SELECT (SELECT act FROM kept) AS act,
        COALESCE((SELECT status FROM {axa_queue} WHERE id = %(id)s),
                 (SELECT status FROM {axa_queue_history} WHERE id = %(id)s LIMIT 1)) AS found""",
    columns=HISTORY_COLUMNS_MOVED,
)
"""Queue a failed job (act `retried`) or one in review (act `released`) for one more try,
and keep the act, in one statement. Attempts keep rising, so an old run stays fenced.
A failed job without `unique_for` had freed its unique key, which another job may hold
now: it is queued again without it (one in review, or with `unique_for`, still holds
its key and keeps it).

A failed job moved to the history (`unmoved`) comes back to `axa_queue`, queued, in the
same statement: deleted from the history and inserted, its act kept with it. It comes
back without its unique key: a job is moved only once its key is free (its
`unique_for` passed), and another job may hold the key now. A job the history holds
under another state (completed, cancelled) is left there, as it would be in
`axa_queue`. Returns the act kept (or NULL) and the state it found (the statement's
snapshot: the state before the act)."""

ACTS = statement("""SELECT id, job_id, job_name, act, attempts, by, reason, EXTRACT(EPOCH FROM at) AS at,
    db_role FROM {axa_job_acts} WHERE job_id = %s ORDER BY id""")
"""Every act done to one job, oldest first; its time as epoch seconds, as `JOB` reads
times."""
