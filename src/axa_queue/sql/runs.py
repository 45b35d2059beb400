"""A run's statements after its claim (the claim and the endings are `exchange`'s):
reporting in, giving back runs claimed ahead, deciding a lost run's job, and failing
jobs no claim can take."""

from __future__ import annotations

from .history import HISTORY_COLUMNS_MOVED
from .naming import statement

__all__ = ["FAIL_UNCLAIMABLE", "GIVE_BACK", "HEARTBEAT", "MARK_LOST", "ROWS_FREE"]

GIVE_BACK = statement("""WITH back AS (
        UPDATE {axa_queue} q
        SET status = 'queued', ahead = NULL, started_at = NULL,
            run_at = COALESCE(%(now)s::timestamptz, now()),
            updated_at = COALESCE(%(now)s::timestamptz, clock_timestamp()),
            max_attempts = LEAST(r.max_attempts + 1, 2147483647), given_back = q.given_back + 1
        FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(limits)s::bigint[])
            AS r(id, attempts, max_attempts)
        WHERE q.id = ANY(%(ids)s::uuid[]) AND q.id = r.id AND q.attempts = r.attempts
          AND q.ahead = r.attempts AND q.status = (SELECT 'running')
        RETURNING q.id, q.attempts
    ), ended AS (
        INSERT INTO {axa_queue_attempts} AS a (job_id, attempt, worker, host, pid, ended_at, outcome)
        SELECT id, attempts, %(worker)s::uuid, %(host)s::text, %(pid)s::int,
            COALESCE(%(now)s::timestamptz, clock_timestamp()), 'given back'
        FROM back
        ON CONFLICT (job_id, attempt) DO UPDATE
        SET ended_at = EXCLUDED.ended_at, outcome = EXCLUDED.outcome
    )
    SELECT id::text AS id FROM back""")
"""A stopping worker lets go of runs it claimed ahead and never started (the grace
period over): queue them again at once, each with its attempt given back, rather than
leave them to stale recovery. Fenced by the attempt and by `ahead` (never a run whose
start was marked, nor one given back or claimed again since). `limits` is each run's
limit as its worker read it (the job's `max_attempts`, else its handler's or the
worker's), raised by one, as stale recovery raises it, but never past the most an
`integer` holds (so a job at the limit of 2147483647 cannot fail the statement for the
others); `attempts` is never lowered (it fences every run). Counted in `given_back`,
and the run's attempt row ended `given back` (`ended`; the worker's identity as the
exchange sends it).

It may wait for its rows' locks, holding those it took, but the statements that may
hold them wait for no lock meanwhile (`HEARTBEAT` and `RECOVER_STALE` skip locked
rows, `MARK_LOST` and `CANCEL` lock one row), and the exchange never locks them: a run
that never started has no ending and no start mark to write. So no cycle of waits."""

FAIL_UNCLAIMABLE = statement("""WITH failed AS (
        UPDATE {axa_queue}
        SET status = 'failed', error = %(error)s,
            updated_at = COALESCE(%(now)s::timestamptz, now())
        WHERE status = 'queued' AND name = %(name)s AND attempts >= 2147483647
        RETURNING id, attempts
    ), told AS (
        SELECT pg_notify('axa_queue_done', {'axa_queue'}::regclass::oid::text || ' ' || id::text)
        FROM failed
    )
    SELECT id::text AS id, attempts FROM failed WHERE (SELECT count(*) FROM told) >= 0""")
"""Fail the queued jobs of one name whose attempts are at the most an `integer` holds:
the claim adds one to a job's attempts, so `EXCHANGE` fails on such a row, for every
name it claims. No run of ours gets there (it would take two billion runs); a row
written so by another client does. Sent only after a claim of that name alone has
failed (`Exchange` finds the name by claiming the names apart), never on the way of
a claim; returns the jobs failed, told to waiters (`DONE_CHANNEL`; rare, so always)."""

HEARTBEAT = statement("""WITH beats AS (
        SELECT * FROM unnest(%(ids)s::uuid[], %(attempts)s::int[]) AS r(id, attempts)
    ), held AS MATERIALIZED (
        SELECT q.id FROM {axa_queue} q JOIN beats r ON q.id = r.id
        WHERE q.id = ANY(ARRAY(SELECT id FROM beats))
          AND q.attempts = r.attempts AND q.status = (SELECT 'running')
        FOR NO KEY UPDATE OF q SKIP LOCKED
    ), beaten AS (
        UPDATE {axa_queue} q SET updated_at = COALESCE(%(now)s::timestamptz, clock_timestamp())
        WHERE q.id = ANY(ARRAY(SELECT id FROM held))
        RETURNING q.id::text AS id, q.attempts
    )
    SELECT id, attempts, false AS cancelled, false AS busy FROM beaten
    UNION ALL
    SELECT q.id::text, q.attempts, q.status = 'cancelled', q.status = 'running'
    FROM {axa_queue} q JOIN beats r ON q.id = r.id AND q.attempts = r.attempts
    WHERE q.id = ANY(ARRAY(SELECT id FROM beats)) AND q.status IN ('cancelled', 'running')
      AND q.id <> ALL(ARRAY(SELECT id FROM held))""")
"""Report in for every run of this process at once; a run whose attempt no longer matches
is not returned: it lost its claim. Rows are found by primary key, as `EXCHANGE`'s
endings are, never by scanning every running job of every worker. Stamped with
`clock_timestamp()`, when the row is written.

It never waits for a row lock: `held` locks the rows still `running` under their
attempt with `FOR NO KEY UPDATE SKIP LOCKED` (the lock the `UPDATE` takes; a key-share
lock does not stop it), and only those are stamped (`busy` false, `cancelled` false).
A row another statement holds now (the exchange recording its ending or marking its
start, a person's `CANCEL`, `MARK_LOST`, stale recovery, `GIVE_BACK`) is skipped and,
when the statement's snapshot shows it still `running` under the attempt, returned
`busy`: still ours as far as anyone can tell, not stamped this time, neither lost nor
forgotten; the next heartbeat stamps it, or finds what its holder made of it (a run
really lost is found lost at the next heartbeat, at the latest). A row locked whose
newest version is no longer the run's (the lock follows the row to its newest
version and checks it again) is skipped, and `busy` by the snapshot too: the same.
A busy run's claim is not renewed; a row busy at every heartbeat for `stale_after`
(a person holding a transaction open on it) can be recovered as stale like any
unrenewed claim.

Why it never waits: the exchange locks a run's rows in two passes (`finished`, then
`marked`), this statement in one, each in the order its plan meets the rows (the
order of the ids sent, or of the index), which nothing keeps alike; a heartbeat that
waited could hold a row the exchange wants while waiting for one the exchange holds,
a cycle PostgreSQL breaks by aborting one of them after `deadlock_timeout` (measured
with `bench/deadlocks.py`, 16 loops and a 50 ms heartbeat: 3 to 8 in 30 s, with
prefetch and without). A statement that waits for no lock is in no cycle; it holds
its rows only until its own commit, an instant later.

A run whose job a person cancelled under its attempt (`CANCEL`) comes back with
`cancelled` true: its process stops it without writing anything (the fallback of
`CANCEL_CHANNEL`). The last branch reads the statement's snapshot: a cancel committed
while the statement ran is not seen there, so the run is busy (its row locked or
changed since), and the next heartbeat, or `MARK_LOST` (which reads the row locked)
for a run lost meanwhile, finds it cancelled."""

MARK_LOST = statement(
    """WITH hot AS (
        SELECT id, status, attempts, error, max_attempts, started_at, false AS moved FROM {axa_queue}
        WHERE id = %(id)s FOR UPDATE
    ), found AS (
        SELECT * FROM hot
        UNION ALL
        (SELECT id, status, attempts, error, max_attempts, started_at, true FROM {axa_queue_history}
         WHERE id = %(id)s AND NOT EXISTS (SELECT FROM hot) LIMIT 1)
    ), decided AS (
        SELECT id, status, attempts, moved, CASE
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
        UPDATE {axa_queue} q
        SET status = d.becomes, error = %(error)s, updated_at = COALESCE(%(now)s::timestamptz, clock_timestamp()),
            started_at = CASE WHEN d.becomes = 'queued' THEN NULL ELSE q.started_at END,
            run_at = CASE WHEN d.becomes = 'queued' THEN COALESCE(%(now)s::timestamptz, now()) ELSE q.run_at END,
            unique_key = CASE WHEN d.status = 'failed' AND q.unique_for_ms IS NULL
                              THEN NULL ELSE q.unique_key END
        FROM decided d WHERE q.id = d.id AND NOT d.moved AND d.becomes IS NOT NULL
        RETURNING q.id, q.status
    ), unmoved AS (
        DELETE FROM {axa_queue_history}
        WHERE id = %(id)s AND status = 'failed'
          AND EXISTS (SELECT FROM decided WHERE moved AND becomes = 'needs_review')
        RETURNING {columns}
    ), back AS (
        INSERT INTO {axa_queue} ({columns})
        SELECT id, name, args, 'needs_review', %(error)s, run_at, started_at, created_at,
            COALESCE(%(now)s::timestamptz, clock_timestamp()), attempts, max_attempts, priority,
            timeout_ms, trace_context, result, NULL, unique_for_ms, ahead, given_back,
            run_worker, run_attempt, run_host, run_pid, key
        FROM unmoved
        RETURNING id, status
    ), ended AS (
        INSERT INTO {axa_queue_attempts} AS a
            (job_id, attempt, worker, host, pid, started_at, ended_at, outcome, error_class, error)
        SELECT %(id)s::uuid, %(attempts)s::int, %(worker)s::uuid, %(host)s::text, %(pid)s::int,
            (SELECT started_at FROM found WHERE attempts = %(attempts)s),
            COALESCE(%(now)s::timestamptz, clock_timestamp()), 'lost', NULL, left(%(error)s, 2000)
        WHERE EXISTS (SELECT FROM found WHERE NOT (attempts = %(attempts)s AND status = 'completed'))
        ON CONFLICT (job_id, attempt) DO UPDATE
        SET ended_at = EXCLUDED.ended_at, outcome = EXCLUDED.outcome, error = EXCLUDED.error
        WHERE a.ended_at IS NULL
    ), told AS (
        SELECT pg_notify('axa_queue_done', {'axa_queue'}::regclass::oid::text || ' ' || id::text)
        FROM (SELECT * FROM changed UNION ALL SELECT * FROM back) c
        WHERE status IN ('failed', 'needs_review')
    )
    SELECT d.status, d.attempts,
        COALESCE((SELECT status FROM changed), (SELECT status FROM back)) AS became,
        (SELECT count(*) FROM told) AS told
    FROM decided d""",
    columns=HISTORY_COLUMNS_MOVED,
)
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

A job already moved to the history (finished, `keep_recent` ago) is found there when
it is not in `axa_queue`, and decided alike: a failed one comes back to `axa_queue` in
review (deleted from the history and inserted, without its unique key, free since
before it moved), a completed or cancelled one is left there; the run learns what it
found (a job a person cancelled under its attempt is told apart from a lost one).

The run's attempt row is ended `lost`, with `error` (why it stopped), unless it is
ended already (its own ending, written by an exchange whose answer was lost; stale
recovery's), or its job is completed under its attempt (its own completion, which
writes no row: the job's row says it): `ended`, with the worker's identity as the
exchange sends it and the run's start from the job's row.

A job it fails or sends to review is told to waiters (`DONE_CHANNEL`), always: this
statement is rare, so it does not ask whether anyone waits.

It locks one row (`found`, waiting for it if another statement holds it) and no other:
while it waits it holds nothing another statement waits for, and once it holds the row
it waits for no other, so no cycle of waits passes through it."""

ROWS_FREE = statement("""SELECT id::text AS id FROM {axa_queue}
    WHERE id = ANY(%(ids)s::uuid[])
    FOR NO KEY UPDATE SKIP LOCKED""")
"""Which of these jobs' rows no other transaction holds now: each locked, as the
exchange's ending would lock it, or skipped (never waited for). Sent on the exchange's
connection, outside a transaction, so the locks go with the statement; only after an
exchange waited too long for a row (`worker.held`), never on the way of every run."""
