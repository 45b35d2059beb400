"""The statements for tests: `drain()`'s (how many jobs are ready, making the waiting
ones due, the runs sent to review), and `axa_queue.testing`'s."""

from __future__ import annotations

from .naming import statement

__all__ = ["DRAIN_DUE_NOW", "DRAIN_READY", "DRAIN_REVIEW", "END_SESSIONS", "ENQUEUED"]

DRAIN_READY = statement("""SELECT count(*) AS ready FROM {axa_queue}
    WHERE status = 'queued' AND name = ANY(%(names)s::text[]) AND run_at <= now()""")
"""How many jobs of the drained names are ready: a drain ends when, its worker idle,
none is. Due is judged by `now()`, as `EXCHANGE`'s claim judges it."""

DRAIN_DUE_NOW = statement("""UPDATE {axa_queue} SET run_at = now(), updated_at = COALESCE(%(now)s::timestamptz, now())
    WHERE status = 'queued' AND name = ANY(%(names)s::text[]) AND run_at > now()
    RETURNING id""")
"""Make every waiting job of the drained names due now (`drain(include_delayed=True)`:
a retry's backoff and a delayed job are not waited for); returns the jobs moved."""

DRAIN_REVIEW = statement("""SELECT count(*) AS needs_review FROM {axa_queue}
    WHERE id = ANY(%(ids)s::uuid[]) AND status = 'needs_review'""")
"""How many of the jobs whose runs lost their claim during a drain now wait for review."""

ENQUEUED = statement("""SELECT id, name, args, status, priority, attempts, max_attempts, timeout_ms,
    EXTRACT(EPOCH FROM run_at) AS run_at, EXTRACT(EPOCH FROM created_at) AS created_at
    FROM (
        SELECT id, name, args, status, priority, attempts, max_attempts, timeout_ms, run_at,
            created_at FROM {axa_queue}
        UNION ALL
        SELECT id, name, args, status, priority, attempts, max_attempts, timeout_ms, run_at,
            created_at FROM {axa_queue_history}
    ) jobs WHERE %(name)s::text IS NULL OR name = %(name)s
    ORDER BY jobs.created_at, id""")
"""Every stored job (or every one of a name), moved to the history or not, oldest
first, with its arguments: the one
statement that returns them to the caller, for tests (`axa_queue.testing.enqueued`);
times as epoch seconds, as `JOB` reads them."""

END_SESSIONS = """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND application_name = %(name)s"""
"""End the sessions a test left open on its schema (`axa_queue.testing.fresh_schema`
names them after it), so the schema can be dropped."""
