"""The attempts table's statements (`axa_queue_attempts`, migration 13): the pieces the
exchange adds to keep the runs, the attempts read back, and their retention.

A run's row is written when it ends in any way but a completion, by the statement
that ends it, never by one more round trip: the exchange's endings (`ENDED`),
`MARK_LOST`, `GIVE_BACK`, `GIVE_BACK_GONE`, `RECOVER_STALE`, `CANCEL` and
`CANCEL_BATCH` (their own CTE, in `runs`, `maintenance`, `acts`). A run that is
running, or completed, has no row: the claim stamps its process on its job's row
(`run_worker`, `run_attempt`, `run_host`, `run_pid`, migration 16), which is all its
row would say, and `RUNS` reads it from there, as it reads a run the Rust crate made
(which stamps nothing); the stamp also names the process holding a run still going
(`workers.worker_gone` reads it). The worker's
identity (its `axa_workers` id, host and pid) travels once per statement as
`%(worker)s`, `%(host)s`, `%(pid)s`.

Attempts leave with their job: `PURGE` deletes the attempts of the rows it deletes, in
the same statement, and `ATTEMPTS_DROP` those of the history's days about to be
dropped, in the transaction that drops them (`history.drop_days`). The table is not
partitioned: a job's attempts span the days it was retried over, and its history
partition is chosen by the day it finished, which its first runs cannot know.
"""

from __future__ import annotations

from string import Template

from .naming import statement

__all__ = ["ATTEMPTS", "ATTEMPTS_DROP", "ENDED", "KEPT", "RUNS"]


ENDED = """ended AS (
        INSERT INTO {axa_queue_attempts} AS a
            (job_id, attempt, worker, host, pid, started_at, ended_at, outcome, error_class, error)
        SELECT r.id, r.attempts, %(worker)s::uuid, %(host)s::text, %(pid)s::int,
               (SELECT o.started_at FROM {axa_queue} o WHERE o.id = r.id),
               COALESCE(%(now)s::timestamptz, clock_timestamp()),
               CASE WHEN r.status <> 'queued' THEN r.status
                    WHEN r.max_attempts IS NULL THEN 'retried' WHEN r.slept THEN 'slept'
                    ELSE 'snoozed' END,
               substring(r.error FROM '^([A-Za-z_][A-Za-z0-9_.]*)(?::|$)'), left(r.error, 2000)
        FROM finished f JOIN endings r ON r.id = f.id::uuid AND r.attempts = f.attempts
        WHERE r.status <> 'completed'
        ON CONFLICT (job_id, attempt) DO UPDATE
        SET ended_at = EXCLUDED.ended_at, outcome = EXCLUDED.outcome,
            error_class = EXCLUDED.error_class, error = EXCLUDED.error"""
"""Each ending written (`finished`: only a run that still held its claim) but a
completion gets its run's row: the process that ran it (the worker's identity, sent
once per statement as `%(worker)s`, `%(host)s`, `%(pid)s`), when it started (its job's
`started_at` as this statement's snapshot has it, before `finished` cleared it: a
subquery by primary key, one probe per such ending), when it ended (as it is
written), how (`failed`, `retried`, or `snoozed`: queued again with a new limit;
`slept` likewise, the run having left by `JobContext.sleep`, `slept` in its ending), and
for a failure the error's class (its text before the first colon when that is a Python
name, as `handlers.retries.describe` writes `ValueError: ...`; NULL for a timeout) and
text, at most 2,000 characters (the worker cuts it before).

A completed run writes nothing here: its job's row says all of it (the claim's stamp,
`run_worker` and the rest, its `started_at`, and `updated_at`, when it ended), and
`RUNS` reads it from there. So the run that ends as nearly every run ends costs no row,
and the claim none either: the stamp is written by the claim's own `UPDATE`. A job's
last run is never lost by this: a row is written whenever the job's row goes on to
say something else (queued again, failed, lost, cancelled). An upsert, so a run
claimed by a version that wrote a row at claim (migration 13 alone) has that row
ended."""

KEPT = (ENDED,)
"""The pieces `EXCHANGE` and its variants with endings list after `claimed`."""

RUNS = """SELECT a.attempt, a.worker::text AS worker, a.host, a.pid,
            EXTRACT(EPOCH FROM a.started_at) AS started_at, EXTRACT(EPOCH FROM a.ended_at) AS ended_at,
            a.outcome, a.error_class, a.error, false AS derived
        FROM {axa_queue_attempts} a
        WHERE a.job_id = j.id AND (a.attempt <> j.attempts OR a.outcome IS NOT NULL)
        UNION ALL
        SELECT j.attempts,
            COALESCE(CASE WHEN j.run_attempt = j.attempts THEN j.run_worker END, s.worker)::text,
            COALESCE(CASE WHEN j.run_attempt = j.attempts THEN j.run_host END, s.host),
            COALESCE(CASE WHEN j.run_attempt = j.attempts THEN j.run_pid END, s.pid),
            COALESCE(j.started_at, EXTRACT(EPOCH FROM s.started_at)),
            CASE WHEN j.status IN ('completed', 'failed', 'needs_review')
                   OR (j.status = 'cancelled' AND j.started_at IS NOT NULL) THEN j.updated_at END,
            CASE WHEN j.status = 'queued' OR (j.status = 'cancelled' AND j.started_at IS NULL)
                      THEN 'retried'
                 WHEN j.status = 'needs_review' THEN 'lost'
                 WHEN j.status = 'running' THEN NULL ELSE j.status END,
            CASE WHEN j.status IN ('queued', 'failed', 'needs_review')
                   OR (j.status = 'cancelled' AND j.started_at IS NULL)
                 THEN substring(left(j.error, 2000) FROM '^([A-Za-z_][A-Za-z0-9_.]{{0,199}})(?::|$)') END,
            CASE WHEN j.status IN ('queued', 'failed', 'needs_review')
                   OR (j.status = 'cancelled' AND j.started_at IS NULL) THEN left(j.error, 2000) END,
            j.run_attempt IS DISTINCT FROM j.attempts AND s.attempt IS NULL
        FROM (SELECT) one
        LEFT JOIN {axa_queue_attempts} s ON s.job_id = j.id AND s.attempt = j.attempts
        WHERE j.attempts > 0 AND s.outcome IS NULL"""
"""A job's attempts, given its row as `j` (`id`, `status`, `attempts`, `error`,
`started_at` and `updated_at` as epoch seconds, and the claim's stamp: `run_worker`,
`run_attempt`, `run_host`, `run_pid`): the rows kept, and its last attempt read
from the job's own row whenever no row has ended it (a run that is running, or
completed: the exchange writes no row for either; a run the Rust crate made; one
from before migration 13). The claim's stamp names that run's process when it
belongs to that attempt (`run_attempt`: the crate's claim raises `attempts` and leaves
the stamp, which then speaks of an earlier run); a row a claim wrote under migration
13 (no outcome yet) fills what the job's row does not. `derived` says the run's
process is unknown: what is shown is all its job's row says (no worker, no earlier
runs). A job cancelled while it waited to run again (no start: a retry or a backoff
cleared it) was not cancelled in that run: the run's outcome is `retried`, its error
the one the row kept, its end unknown. The error's class is read from the row's error
as the exchange reads it from an ending's, bounded as another client's row may not
be: a name of at most 200 characters before a colon, else none."""

ATTEMPTS = statement(
    Template("""SELECT r.* FROM (
        SELECT id, status, attempts, error, EXTRACT(EPOCH FROM started_at) AS started_at,
            EXTRACT(EPOCH FROM updated_at) AS updated_at, run_worker, run_attempt, run_host, run_pid
        FROM {axa_queue} WHERE id = %(id)s
        UNION ALL
        SELECT id, status, attempts, error, EXTRACT(EPOCH FROM started_at),
            EXTRACT(EPOCH FROM updated_at), run_worker, run_attempt, run_host, run_pid
        FROM {axa_queue_history} WHERE id = %(id)s
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
