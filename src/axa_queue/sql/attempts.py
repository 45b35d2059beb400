"""The attempts table's statements (`axa_queue_attempts`, migration 13): the pieces the
exchange adds to keep a row per run, the attempts read back, and their retention.

A run's row is written by the statements that claim and end runs today, never by one
more round trip: the exchange's claim makes it (`STARTED`) and its endings end it
(`ENDED`); `MARK_LOST`, `GIVE_BACK`, `GIVE_BACK_GONE`, `RECOVER_STALE`, `CANCEL` and
`CANCEL_BATCH` end the runs they end (their own CTE, in `runs`, `maintenance`, `acts`).
A run not ended names the process that holds it (`workers.worker_gone` reads it). The worker's
identity (its `axa_workers` id, host and pid) travels once per statement as
`%(worker)s`, `%(host)s`, `%(pid)s`. A run the Rust crate made has no row: it is read
from its job's row (`ATTEMPTS`: the job's last attempt, when no row holds it).

Attempts leave with their job: `PURGE` deletes the attempts of the rows it deletes, in
the same statement, and `ATTEMPTS_DROP` those of the history's days about to be
dropped, in the transaction that drops them (`history.drop_days`). The table is not
partitioned: a job's attempts span the days it was retried over, and its history
partition is chosen by the day it finished, which its first runs cannot know.
"""

from __future__ import annotations

from string import Template

from .naming import statement

__all__ = ["ATTEMPTS", "ATTEMPTS_DROP", "ENDED", "KEPT", "RUNS", "STARTED"]


STARTED = """started AS (
        INSERT INTO {axa_queue_attempts} AS a (job_id, attempt, worker, host, pid, started_at)
        SELECT c.id::uuid, c.attempts, %(worker)s::uuid, %(host)s::text, %(pid)s::int,
               COALESCE(%(now)s::timestamptz, clock_timestamp())
        FROM claimed c
        ON CONFLICT (job_id, attempt) DO UPDATE
        SET worker = EXCLUDED.worker, host = EXCLUDED.host, pid = EXCLUDED.pid,
            started_at = EXCLUDED.started_at, ended_at = NULL, outcome = NULL,
            error_class = NULL, error = NULL"""
"""Each run claimed gets its row in `axa_queue_attempts`: the claiming process's id in
`axa_workers` (`worker`), its `host` and `pid` (parameters sent once per statement),
and the claim's time (a run claimed ahead starts later: its row says when it was
claimed, as its job's `started_at` does). A row already there under the same attempt
(only a row written by hand, or a counter set back, makes one) is this run's from now:
the insert never fails the claim."""

ENDED = """ended AS (
        INSERT INTO {axa_queue_attempts} AS a
            (job_id, attempt, worker, host, pid, ended_at, outcome, error_class, error)
        SELECT r.id, r.attempts, %(worker)s::uuid, %(host)s::text, %(pid)s::int,
               COALESCE(%(now)s::timestamptz, clock_timestamp()),
               CASE WHEN r.status <> 'queued' THEN r.status
                    WHEN r.max_attempts IS NULL THEN 'retried' ELSE 'snoozed' END,
               substring(r.error FROM '^([A-Za-z_][A-Za-z0-9_.]*)(?::|$)'), left(r.error, 2000)
        FROM finished f JOIN endings r ON r.id = f.id::uuid AND r.attempts = f.attempts
        ON CONFLICT (job_id, attempt) DO UPDATE
        SET ended_at = EXCLUDED.ended_at, outcome = EXCLUDED.outcome,
            error_class = EXCLUDED.error_class, error = EXCLUDED.error"""
"""Each ending written (`finished`: only a run that still held its claim) ends its
run's row: when (as it is written), how (`completed`, `failed`, `retried`, or
`snoozed`: queued again with a new limit), and for a failure the error's class
(its text before the first colon when that is a Python name, as
`handlers.retries.describe` writes `ValueError: ...`; NULL for a timeout) and text, at most 2,000 characters (the worker cuts it before). An
upsert, so a run claimed before migration 13 (no row) gets one, its start unknown. By
primary key, one index probe per ending; the columns it changes are in no index, so
the new version stays on its page (a HOT update) when the page has room (`fillfactor`)."""

KEPT = (STARTED, ENDED)
"""The pieces `EXCHANGE` and its variants with endings list after `claimed`."""

RUNS = """SELECT a.attempt, a.worker::text AS worker, a.host, a.pid,
            EXTRACT(EPOCH FROM a.started_at) AS started_at, EXTRACT(EPOCH FROM a.ended_at) AS ended_at,
            a.outcome, a.error_class, a.error, false AS derived
        FROM {axa_queue_attempts} a WHERE a.job_id = j.id
        UNION ALL
        SELECT j.attempts, NULL, NULL, NULL, j.started_at,
            CASE WHEN j.status IN ('completed', 'failed', 'cancelled', 'needs_review') THEN j.updated_at END,
            CASE j.status WHEN 'queued' THEN 'retried' WHEN 'needs_review' THEN 'lost'
                          WHEN 'running' THEN NULL ELSE j.status END,
            CASE WHEN j.status IN ('queued', 'failed', 'needs_review')
                 THEN substring(j.error FROM '^([A-Za-z_][A-Za-z0-9_.]*)(?::|$)') END,
            CASE WHEN j.status IN ('queued', 'failed', 'needs_review') THEN left(j.error, 2000) END, true
        WHERE j.attempts > 0 AND NOT EXISTS (
            SELECT FROM {axa_queue_attempts} a WHERE a.job_id = j.id AND a.attempt = j.attempts)"""
"""A job's attempts, given its row as `j` (`id`, `status`, `attempts`, `error`, and
`started_at`, `updated_at` as epoch seconds): the rows kept, and its last attempt read
from the job's own row when no row holds it (`derived`: a run the Rust crate made, or
one from before migration 13), with what that row says (no worker, no earlier runs)."""

ATTEMPTS = statement(
    Template("""SELECT r.* FROM (
        SELECT id, status, attempts, error, EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at FROM {axa_queue} WHERE id = %(id)s
        UNION ALL
        SELECT id, status, attempts, error, EXTRACT(EPOCH FROM started_at),
            EXTRACT(EPOCH FROM updated_at) FROM {axa_queue_history} WHERE id = %(id)s
        LIMIT 1
    ) j CROSS JOIN LATERAL ($runs) r
    ORDER BY r.attempt""").substitute(runs=RUNS)
)
"""Every attempt of one job, oldest first (`RUNS`), from `axa_queue` or the history,
in one snapshot; none for a job that is gone. Times as epoch seconds, as `JOB` reads
them."""

ATTEMPTS_DROP = statement("""DELETE FROM {axa_queue_attempts}
    WHERE job_id IN (
        SELECT id FROM {axa_queue_history}
        WHERE updated_at < ((COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s))
                            AT TIME ZONE 'UTC')::date::timestamp AT TIME ZONE 'UTC')""")
"""Delete the attempts of the jobs in the history's days `HISTORY_DROP` is about to drop
(those before the day `older_than` before `now`: the same days, by the same bound), in
its transaction, so a drop given up keeps both; reads those days' partitions only
(pruning) and the attempts by primary key."""
