"""A person's acts on a job, each one statement that changes the job and keeps the
act (`axa_job_acts`), and the acts read back."""

from __future__ import annotations

from .history import HISTORY_COLUMNS_MOVED
from .naming import statement

__all__ = [
    "ACTS",
    "CANCEL",
    "CANCEL_BATCH",
    "MATCHING",
    "MATCHING_MOVED",
    "MISSING",
    "RETRY",
    "RETRY_BATCH",
    "RETRY_MOVED_BATCH",
]


def _joined(*parts: str) -> str:
    """A statement made of named pieces (this module's own, never values)."""
    return "".join(parts)


_CANCELLED = """    ), changed AS (
        UPDATE {axa_queue} q SET status = 'cancelled', updated_at = COALESCE(%(now)s::timestamptz, now())
        FROM target WHERE q.id = target.id
        RETURNING q.id, q.name, q.attempts, q.started_at, target.status AS was,
            CASE WHEN q.run_attempt = q.attempts THEN q.run_worker END AS worker,
            CASE WHEN q.run_attempt = q.attempts THEN q.run_host END AS host,
            CASE WHEN q.run_attempt = q.attempts THEN q.run_pid END AS pid
    ), kept AS (
        INSERT INTO {axa_job_acts} (job_id, job_name, act, attempts, by, reason)
        SELECT id, name, 'cancelled', attempts, %(by)s, %(reason)s FROM changed
        RETURNING act
    ), ended AS (
        INSERT INTO {axa_queue_attempts} AS a (job_id, attempt, worker, host, pid, started_at, ended_at, outcome)
        SELECT id, attempts, worker, host, pid, started_at, COALESCE(%(now)s::timestamptz, now()), 'cancelled'
        FROM changed WHERE was = 'running'
        ON CONFLICT (job_id, attempt) DO UPDATE
        SET ended_at = EXCLUDED.ended_at, outcome = EXCLUDED.outcome
        WHERE a.ended_at IS NULL
"""
"""A cancel's change, act and attempt, for the jobs in `target` (`CANCEL`, one job;
`CANCEL_BATCH`, a batch): each queued or running job `cancelled`, its act kept, a
running one's attempt ended `cancelled` (its row written with the process its claim
stamped on the job, `run_worker`...)."""


_REQUEUED = """    ), changed AS (
        UPDATE {axa_queue} q
        SET status = 'queued', run_at = COALESCE(%(now)s::timestamptz, now()), started_at = NULL,
            updated_at = COALESCE(%(now)s::timestamptz, now()),
            max_attempts = q.attempts + 1,
            unique_key = CASE WHEN target.status = 'failed' AND q.unique_for_ms IS NULL
                              THEN NULL ELSE q.unique_key END
        FROM target WHERE q.id = target.id
        RETURNING q.id, q.name, q.attempts, target.status AS was
"""
"""A retry's change (`changed`), for the jobs in `target` (`RETRY`, one job;
`RETRY_BATCH`, a batch): each failed or in-review job queued again now for one more try
(`max_attempts` one past its attempts, which keep rising, so an old run stays fenced);
a failed one without `unique_for` had freed its unique key, which another job may hold
now, so it is queued again without it."""

_BROUGHT_BACK = """        INSERT INTO {axa_queue} ({columns})
        SELECT id, name, args, 'queued', error, COALESCE(%(now)s::timestamptz, now()), NULL,
            created_at, COALESCE(%(now)s::timestamptz, now()), attempts, attempts + 1, priority,
            timeout_ms, trace_context, result, NULL, unique_for_ms, ahead, given_back,
            run_worker, run_attempt, run_host, run_pid, key
        FROM unmoved
        RETURNING id, name, attempts, 'failed'::text AS was
"""
"""The body of a retry's CTE that brings the failed jobs deleted from the history
(`unmoved`) back to `axa_queue`, queued for one more try as `_REQUEUED` queues one, and
without their unique key (`RETRY`, one job; `RETRY_MOVED_BATCH`, a batch)."""

_RETRY_ACT = """    ), kept AS (
        INSERT INTO {axa_job_acts} (job_id, job_name, act, attempts, by, reason)
        SELECT id, name, CASE was WHEN 'needs_review' THEN 'released' ELSE 'retried' END,
            attempts, %(by)s, %(reason)s
"""
"""A retry's act kept (`kept`), its `FROM` given after it: `released` for a job that
was in review, else `retried`."""

_WOKEN = """    ), woken AS (
        SELECT pg_notify('axa_queue', n.nspname || ' 0')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = {'axa_queue'}::regclass AND EXISTS (SELECT FROM changed)
    )
    """
"""The workers woken once on commit (`CHANNEL`) when a batch queued jobs again
(`changed`), so they are claimed at once."""


CANCEL = statement(
    _joined(
        """WITH target AS (
        SELECT id, status FROM {axa_queue}
        WHERE id = %(id)s AND status IN ('queued', 'running', 'blocked', 'needs_review')
        FOR UPDATE
""",
        _CANCELLED,
        """    ), told AS (
        SELECT pg_notify('axa_queue_done', {'axa_queue'}::regclass::oid::text || ' ' || id::text)
        FROM changed
        UNION ALL
        SELECT pg_notify('axa_queue_cancel', id::text) FROM changed WHERE was = 'running'
    )
    SELECT (SELECT act FROM kept) AS act,
        COALESCE((SELECT status FROM target),
                 (SELECT status FROM {axa_queue} WHERE id = %(id)s),
                 (SELECT status FROM {axa_queue_history} WHERE id = %(id)s LIMIT 1)) AS found,
        (SELECT count(*) FROM told) AS told""",
    )
)
"""Cancel a queued, running, blocked (waiting for its dependencies) or in-review job and
keep the act, in one statement; any other state changes nothing and writes no act. A
job with dependents decides their fate in this same statement (the release triggers,
migration 18: those that say `cancel` are cancelled, those that say `run` released). Returns the act kept (or NULL) and the state it
found: the state it cancelled (read locked), else the state of the job it left alone,
moved to the history or not (a moved job is finished: never cancelled). A job cancelled is told to waiters (`DONE_CHANNEL`) when the
caller's transaction commits: always, without the advisory lock `EXCHANGE` asks, which
would be held until the caller's commit and keep new waiters waiting that long.

A running job's row becomes `cancelled` under the same attempt: the run's ending is
then refused by the fence (`status = 'running'`, ours and the crate's alike), its
heartbeat reports it cancelled (`HEARTBEAT`), and `CANCEL_CHANNEL` tells its process
at once, on the caller's commit (NOTIFY is transactional: a rollback tells no one).
Its run's attempt row is ended `cancelled` (`ended`: the run writes nothing once
stopped), unless something ended it first."""

RETRY = statement(
    _joined(
        """WITH target AS (
        SELECT id, status FROM {axa_queue}
        WHERE id = %(id)s AND status IN ('failed', 'needs_review')
        FOR UPDATE
""",
        _REQUEUED,
        """    ), unmoved AS (
        DELETE FROM {axa_queue_history}
        WHERE id = %(id)s AND status = 'failed' AND NOT EXISTS (SELECT FROM target)
        RETURNING {columns}
    ), back AS (
""",
        _BROUGHT_BACK,
        _RETRY_ACT,
        """        FROM (SELECT * FROM changed UNION ALL SELECT * FROM back) acted
        RETURNING act
    )
    SELECT (SELECT act FROM kept) AS act,
        COALESCE((SELECT status FROM {axa_queue} WHERE id = %(id)s),
                 (SELECT status FROM {axa_queue_history} WHERE id = %(id)s LIMIT 1)) AS found""",
    ),
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

_FILTERED = """
          AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
          AND (%(name)s::text IS NULL OR name = %(name)s::text)
          AND (%(state)s::text IS NULL OR status = %(state)s::text)
          AND (%(error_like)s::text IS NULL OR error LIKE %(error_like)s::text)
          AND (%(changed_after)s::timestamptz IS NULL OR updated_at >= %(changed_after)s::timestamptz)
          AND (%(changed_before)s::timestamptz IS NULL OR updated_at < %(changed_before)s::timestamptz)
"""
"""A bulk act's filter, each part applying when given (NULL: any): the ids, the name, the
state, the error's pattern and when the job last changed."""


BULK_SCOPE = 10_000
"""The most ids a bulk act's batch looks at (`_matched`): ten batches' worth."""


def _matched(table: str) -> str:
    """`scope`: the next `BULK_SCOPE` ids of `table` (`{axa_queue}`, or
    `{axa_queue_history}` for the jobs moved there) after the last batch's end (`after`;
    the nil UUID first), walked in the primary key's order; `seen`: the jobs among them
    that a bulk act's filter (`_FILTERED`) matches, at most `batch`, in id order. Read
    with the statement's snapshot, unlocked: the rows the act applies to are locked next
    (`target`), and checked again when locked.

    Each batch reads at most `BULK_SCOPE` rows, whatever the plan. The queue's sessions
    plan generically (`plan_cache_mode`), and a generic plan cannot tell how many rows
    the filter's `IS NULL OR` parts match: asked for the first `batch` matches after
    `after` with no bound, it read and sorted every row after `after`, for each batch
    (100,000 failed jobs retried in 19 s, 200,000 in two minutes). The scope's bound is a
    constant, so its walk of the key is planned as one whatever the parameters. Given
    `ids`, the scope is those of them the table holds (found by the key), not the
    table's next ids: a few jobs named among millions take one batch."""
    return _joined(
        "scope AS MATERIALIZED (\n        (SELECT id FROM ",
        table,
        "\n         WHERE %(ids)s::uuid[] IS NULL AND id > %(after)s::uuid ORDER BY id LIMIT ",
        str(BULK_SCOPE),
        ")\n        UNION ALL\n        (SELECT id FROM ",
        table,
        "\n         WHERE id = ANY(%(ids)s::uuid[]) AND id > %(after)s::uuid ORDER BY id LIMIT ",
        str(BULK_SCOPE),
        ")\n    ), reach AS (\n        SELECT id FROM scope ORDER BY id DESC LIMIT 1",
        "\n    ), seen AS MATERIALIZED (\n        SELECT id, status FROM ",
        table,
        "\n        WHERE id > %(after)s::uuid AND id <= (SELECT id FROM reach)",
        _FILTERED,
        "        ORDER BY id LIMIT %(batch)s\n    )",
    )


_MATCHED = _matched("{axa_queue}")
"""The next batch of `axa_queue`'s jobs a bulk act's filter matches (`_matched`)."""

_BATCH_READ = _joined(
    """SELECT CASE
            WHEN (SELECT count(*) FROM seen) >= %(batch)s
                THEN (SELECT id::text FROM seen ORDER BY id DESC LIMIT 1)
            WHEN (SELECT count(*) FROM scope) >= """,
    str(BULK_SCOPE),
    """
                THEN (SELECT id::text FROM reach)
        END AS next,
        (SELECT count(*) FROM seen) AS seen,
        (SELECT count(*) FROM changed) AS changed,
        (SELECT COALESCE(json_object_agg(status, n), '{{}}')::text FROM (
            SELECT s.status, count(*) AS n FROM seen s
            WHERE NOT EXISTS (SELECT FROM changed c WHERE c.id = s.id) GROUP BY s.status) left_alone
        ) AS left_alone""",
)
"""What a batch did: where the next starts (`next`: after the batch's last match when it
took `batch`, else after the scope's last id; NULL: the table has no more), how many jobs
it matched and changed, and how many it left alone by the state each was in (a JSON
object, read with the statement's snapshot)."""


CANCEL_BATCH = statement(
    _joined(
        "WITH ",
        _MATCHED,
        """, target AS (
        SELECT id, status FROM {axa_queue}
        WHERE id = ANY(ARRAY(SELECT id FROM seen))
          AND status IN ('queued', 'running', 'blocked', 'needs_review')
        FOR UPDATE
""",
        _CANCELLED,
        """    ), told AS (
        SELECT pg_notify('axa_queue_done', {'axa_queue'}::regclass::oid::text || ' *')
        WHERE EXISTS (SELECT FROM changed)
        UNION ALL
        SELECT pg_notify('axa_queue_cancel', id::text) FROM changed WHERE was = 'running'
    )
    """,
        _BATCH_READ,
        """,
        (SELECT count(*) FROM told) AS told""",
    )
)
"""`cancel` of every queued, running, blocked or in-review job of the next batch a filter matches, each
with its act, in one statement (`cancel_all` sends one per batch, in the caller's
transaction): each job changed exactly as `CANCEL` changes one, each running one's
process told at once (`CANCEL_CHANNEL`), and the waiters told once for the batch
(`DONE_CHANNEL`'s `<oid> *`: look at every job waited for), not once per job."""

RETRY_BATCH = statement(
    _joined(
        "WITH ",
        _MATCHED,
        """, target AS (
        SELECT id, status FROM {axa_queue}
        WHERE id = ANY(ARRAY(SELECT id FROM seen)) AND status = ANY(%(applies)s::text[])
        FOR UPDATE
""",
        _REQUEUED,
        _RETRY_ACT,
        """        FROM changed
        RETURNING act
""",
        _WOKEN,
        _BATCH_READ,
        """,
        (SELECT count(*) FROM woken) AS woken""",
    )
)
"""`retry` of every job of the next batch a filter matches whose state is in `applies`
(`retry_all`: `failed`, act `retried`; `release_all`: `needs_review`, act `released`),
each with its act, in one statement per batch, each job changed exactly as `RETRY`
changes one; the workers are woken once on commit (`CHANNEL`), so the jobs queued again
are claimed at once."""


def _matching(table: str) -> str:
    """A bulk act's dry run over `table` (`{axa_queue}`, or `{axa_queue_history}`): see
    `MATCHING`."""
    return _joined(
        """SELECT COALESCE(sum(n) FILTER (WHERE status = ANY(%(applies)s::text[])), 0) AS applies,
        COALESCE(sum(n), 0) AS matched,
        COALESCE(json_object_agg(status, n) FILTER (WHERE status <> ALL(%(applies)s::text[])), '{{}}')::text
            AS left_alone
    FROM (
        SELECT status, count(*) AS n FROM (
            SELECT status FROM """,
        table,
        """
            WHERE (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
              AND (%(name)s::text IS NULL OR name = %(name)s::text)
              AND (%(state)s::text IS NULL OR status = %(state)s::text)
              AND (%(error_like)s::text IS NULL OR error LIKE %(error_like)s::text)
              AND (%(changed_after)s::timestamptz IS NULL OR updated_at >= %(changed_after)s::timestamptz)
              AND (%(changed_before)s::timestamptz IS NULL OR updated_at < %(changed_before)s::timestamptz)
            ORDER BY id LIMIT %(limit)s
        ) matched_jobs GROUP BY status
    ) by_state""",
    )


MATCHING = statement(_matching("{axa_queue}"))
"""A bulk act's dry run: of the jobs its filter matches (at most `limit`, in id order),
how many it would change (their state in `applies`), how many in all, and how many it
would leave alone by state, without locking or changing anything."""

RETRY_MOVED_BATCH = statement(
    _joined(
        "WITH ",
        _matched("{axa_queue_history}"),
        """, unmoved AS (
        DELETE FROM {axa_queue_history}
        WHERE id = ANY(ARRAY(SELECT id FROM seen WHERE status = 'failed')) AND status = 'failed'
        RETURNING {columns}
    ), changed AS (
""",
        _BROUGHT_BACK,
        """    ), kept AS (
        INSERT INTO {axa_job_acts} (job_id, job_name, act, attempts, by, reason)
        SELECT id, name, 'retried', attempts, %(by)s, %(reason)s FROM changed
        RETURNING act
""",
        _WOKEN,
        _BATCH_READ,
        """,
        (SELECT count(*) FROM woken) AS woken""",
    ),
    columns=HISTORY_COLUMNS_MOVED,
)
"""`retry_all`'s batch of the jobs moved to the history (`axa_queue_history`): each
failed one a filter matches comes back to `axa_queue`, queued, with its act, as `RETRY`
brings back one (without its unique key: another job may hold it now); the others (a
completed or cancelled job) are left where they are and counted by their state."""

MATCHING_MOVED = statement(_matching("{axa_queue_history}"))
"""`MATCHING` over the jobs moved to the history, for `retry_all`'s dry run."""

MISSING = statement("""SELECT count(*) AS missing FROM (SELECT DISTINCT id FROM unnest(%(ids)s::uuid[]) AS i(id)) i
    WHERE NOT EXISTS (SELECT FROM {axa_queue} q WHERE q.id = i.id)
      AND NOT EXISTS (SELECT FROM {axa_queue_history} h WHERE h.id = i.id)""")
"""How many of the ids a bulk act was given no job has, in `axa_queue` or the history
(each looked up by its primary key, and per day partition by `axa_queue_history_id`)."""
