"""Paused job names (`axa_paused`): a person's pause and resume of a name, each kept as
an act in `axa_job_acts` in the same statement, and the names paused now. The claim's
side (a paused name is never claimed) is in `exchange` (`_UNPAUSED`)."""

from __future__ import annotations

from .naming import statement

__all__ = ["NAME_ACTS", "PAUSE", "PAUSED", "RESUME"]

PAUSE = statement("""WITH paused AS (
        INSERT INTO {axa_paused} (name, by, reason, at)
        VALUES (%(name)s, %(by)s, %(reason)s, COALESCE(%(now)s::timestamptz, now()))
        ON CONFLICT (name) DO NOTHING
        RETURNING name
    ), kept AS (
        INSERT INTO {axa_job_acts} (job_id, job_name, act, attempts, by, reason)
        SELECT '00000000-0000-0000-0000-000000000000'::uuid, name, 'paused', 0, %(by)s, %(reason)s
        FROM paused
        RETURNING act
    )
    SELECT (SELECT act FROM kept) AS act""")
"""Pause the name and keep the act (`paused`), in one statement, in the caller's
transaction. A name paused already changes nothing and keeps no act (NULL): a pause
racing another waits for it to commit (the primary key) and then does nothing. No row
of `axa_queue` is read or written: the jobs stay queued, running ones run on."""

RESUME = statement("""WITH resumed AS (
        DELETE FROM {axa_paused} WHERE name = %(name)s
        RETURNING name
    ), kept AS (
        INSERT INTO {axa_job_acts} (job_id, job_name, act, attempts, by, reason)
        SELECT '00000000-0000-0000-0000-000000000000'::uuid, name, 'resumed', 0, %(by)s, %(reason)s
        FROM resumed
        RETURNING act
    ), woken AS (
        SELECT pg_notify('axa_queue', n.nspname || ' 0')
        FROM resumed, pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = {'axa_queue'}::regclass
    )
    SELECT (SELECT act FROM kept) AS act, (SELECT count(*) FROM woken) AS woken""")
"""Resume the name and keep the act (`resumed`), in one statement, in the caller's
transaction; a name not paused changes nothing and keeps no act (NULL). Workers are
woken on commit (`CHANNEL`'s payload: the table's schema, and 0 seconds), so its
queued jobs are claimed at once rather than at the next poll."""

PAUSED = statement("""SELECT name, by, reason, EXTRACT(EPOCH FROM at) AS at
    FROM {axa_paused} ORDER BY name""")
"""Every paused name, with who paused it, why and since when (epoch seconds, as `JOB`
reads times); a small table, a row per paused name."""

NAME_ACTS = statement("""SELECT id, job_id, job_name, act, attempts, by, reason, EXTRACT(EPOCH FROM at) AS at,
    db_role FROM {axa_job_acts}
    WHERE job_id = '00000000-0000-0000-0000-000000000000'::uuid AND job_name = %s ORDER BY id""")
"""Every act on one job name (its pauses and resumes), oldest first, through the acts'
index on (job_id, id): the nil job's entries, filtered by name."""
