"""Durable steps' statements (`axa_queue_steps`, migration 17): a run's recorded steps
read once, a step recorded fenced by the run's attempt, and their retention.

A job that never calls `JobContext.step` sends none of them: the claim and the exchange
do not read or write the steps table. A job's steps are read by the first `step` of a
run (`STEPS_RECORDED`, one statement, kept for the run), and each step recorded is one
statement (`STEP_RECORD`). `sql.JOB` reads them for `JobInfo.steps`, without their
results.

Steps leave with their job: `PURGE` deletes the steps of the rows it deletes, in the
same statement, and those of the history's days about to be dropped go in bounded
batches first (`STEPS_DROP_BATCH`, each its own short transaction), then, in the
transaction that drops the days, any left (`STEPS_DROP`: normally none). The table is not partitioned,
for the reason the attempts table is not: a job's steps are written on the days it ran,
its history partition is chosen by the day it finished.
"""

from __future__ import annotations

from .naming import statement

__all__ = ["STEPS", "STEPS_DROP", "STEPS_DROP_BATCH", "STEPS_RECORDED", "STEP_RECORD"]

STEPS_RECORDED = statement("""SELECT name, result::text AS result FROM {axa_queue_steps}
    WHERE job_id = %(id)s""")
"""The steps job `id` recorded, with their results (JSON text): read once by a run, on
its first `step`, so a step recorded by an earlier attempt returns its result without
running again. Private like arguments: returned to the job's own handler only."""

STEP_RECORD = statement("""WITH held AS (
        SELECT id FROM {axa_queue}
        WHERE id = %(id)s AND attempts = %(attempt)s AND status = 'running'
        FOR SHARE
    ), kept AS (
        INSERT INTO {axa_queue_steps} (job_id, name, attempt, result, started_at, recorded_at)
        SELECT h.id, %(name)s, %(attempt)s, %(result)s::jsonb,
               COALESCE(%(now)s::timestamptz, clock_timestamp()) - make_interval(secs => %(seconds)s),
               COALESCE(%(now)s::timestamptz, clock_timestamp())
        FROM held h
        ON CONFLICT (job_id, name) DO NOTHING
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM held) AS held, EXISTS (SELECT FROM kept) AS kept""")
"""Record step `name` of job `id` with its function's `result` (JSON text) and how long
it ran (`seconds`, timed by the worker: its start is the recording's time less that),
only while the job's row is `running` under this run's `attempt`: the fence. The row
is share-locked (`held`) until the statement commits, so no ending, recovery or act
changes it meanwhile: a run whose claim recovery took waits for this statement, and
once it has committed a later attempt reads the step (`STEPS_RECORDED`); and a step is
never written once the run lost its claim (`held` false: re-read after the wait, as
READ COMMITTED re-checks a locked row). A heartbeat that meets the lock skips the row
that once (`SKIP LOCKED`). `kept` false with `held` true: the job already has a step of
that name, which no run of it can reach (a run reads every step before it records
one, and refuses a name twice): said as an error, never overwritten. `now` is NULL
but in tests."""

STEPS = """SELECT s.name, s.attempt, EXTRACT(EPOCH FROM s.started_at) AS started_at,
            EXTRACT(EPOCH FROM s.recorded_at) AS recorded_at
        FROM {axa_queue_steps} s WHERE s.job_id = j.id"""
"""A job's steps, given its row as `j`, without their results: what `sql.JOB` shows of
them (`JobInfo.steps`). Times as epoch seconds."""

STEPS_DROP = statement("""DELETE FROM {axa_queue_steps}
    WHERE job_id IN (
        SELECT id FROM {axa_queue_history}
        WHERE updated_at < ((COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s))
                            AT TIME ZONE 'UTC')::date::timestamp AT TIME ZONE 'UTC')""")
"""Delete the steps of the jobs in the history's days `HISTORY_DROP` is about to drop
(the days `sql.ATTEMPTS_DROP` takes, by the same bound), in its transaction, so a drop
given up keeps them; reads those days' partitions only (pruning) and the steps by
primary key."""

STEPS_DROP_BATCH = statement("""WITH jobs AS (
        SELECT id FROM {axa_queue_history}
        WHERE updated_at < ((COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s))
                            AT TIME ZONE 'UTC')::date::timestamp AT TIME ZONE 'UTC'
          AND id > %(after)s::uuid
        ORDER BY id LIMIT %(batch)s
    ), gone AS (
        DELETE FROM {axa_queue_steps} WHERE job_id IN (SELECT id FROM jobs)
    )
    SELECT count(*) AS jobs, max(id::text) AS last FROM jobs""")
"""Delete the steps of the next `batch` jobs, by id after `after`, of the history's days
`HISTORY_DROP` is about to drop (`STEPS_DROP`'s days): one bounded batch, before the
drop, repeated from the `last` id it returns until a batch comes back short. A keyset
walk over the days' id indexes, so each batch reads only its own jobs and the whole
walk reads each once; each deletes by the steps' primary key. The jobs are past
retention: a drop given up after the batches leaves them without their steps, which
nothing but a person's look at an old job reads."""
