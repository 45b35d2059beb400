"""Migrations 3 to 5, all additive: trace contexts, results and the worker processes'
table (3), a cron schedule's expression and zone (4), unique keys (5)."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration

__all__ = [
    "MIGRATION_3",
    "MIGRATION_4",
    "MIGRATION_5",
    "RECORD_3",
    "RECORD_4",
    "RECORD_5",
    "SETUP_RESULT",
    "SETUP_SCHEDULE_CRON",
    "SETUP_TRACE_CONTEXT",
    "SETUP_UNIQUE_FOR",
    "SETUP_UNIQUE_INDEX",
    "SETUP_UNIQUE_KEY",
    "SETUP_WORKERS",
    "SETUP_WORKERS_SEEN_INDEX",
    "WORKERS_COLUMNS",
]

# --- Migration 3: trace context, results, worker processes (all additive) ---------------

SETUP_TRACE_CONTEXT = statement(
    "ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS trace_context JSONB"
)
"""The W3C trace context (`traceparent`, `tracestate`) of the span a job was queued in,
as a JSON object, or NULL (no tracing, or another client's job, the Rust crate's
included). Kept apart from the arguments, which stay the job's own."""

SETUP_RESULT = statement("ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS result JSONB")
"""A completed run's return value as JSON, or NULL. Private like the arguments: never
logged or shown; removed with the job by retention."""

SETUP_WORKERS = statement("""CREATE TABLE IF NOT EXISTS {axa_workers} (
    id UUID PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    names TEXT[] NOT NULL,
    loops INTEGER NOT NULL,
    running INTEGER NOT NULL DEFAULT 0,
    version TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    seen_at TIMESTAMPTZ NOT NULL DEFAULT now()
)""")
"""The worker processes running now: one row each, written when a worker starts,
refreshed with its heartbeat (`seen_at`, `running`: its jobs in progress) and deleted
when it stops; a row not seen for a while is a process that died (readers judge by
`seen_at`). The Rust crate's workers do not write here."""

SETUP_WORKERS_SEEN_INDEX = statement(
    "CREATE INDEX IF NOT EXISTS axa_workers_seen ON {axa_workers} (seen_at)"
)
"""Workers by their last heartbeat, to list live ones and remove long-dead rows."""

RECORD_3 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (3, 'trace context, results, workers') ON CONFLICT (version) DO NOTHING""")
"""Migration 3 is applied."""

WORKERS_COLUMNS = (
    "id", "host", "pid", "names", "loops", "running", "version", "started_at", "seen_at",
)  # fmt: skip
"""The worker processes table's columns (migration 3)."""

MIGRATION_3 = Migration(
    3,
    "trace context, results, workers",
    (SETUP_TRACE_CONTEXT, SETUP_RESULT, SETUP_WORKERS, SETUP_WORKERS_SEEN_INDEX),
    RECORD_3,
    Expectations(
        tables=("axa_workers",),
        columns=(
            ("axa_queue", "trace_context"),
            ("axa_queue", "result"),
            *(("axa_workers", c) for c in WORKERS_COLUMNS),
        ),
        indexes=("axa_workers_seen",),
        constraints=(("axa_workers", "axa_workers_pkey"),),
    ),
)
"""Migration 3 and what it makes sure of."""

# --- Migration 4: cron schedules (additive) ---------------------------------------------

SETUP_SCHEDULE_CRON = statement("""ALTER TABLE {axa_schedule} ADD COLUMN IF NOT EXISTS cron TEXT,
    ADD COLUMN IF NOT EXISTS timezone TEXT""")
"""A cron schedule's expression and the IANA zone it is read in, or NULL for a schedule
by interval (every schedule the crate makes). A cron row's `interval_ms` is NULL, which
the crate reads as no interval; the crate's workers tick only the schedules in their
own code, by name, so they leave a cron row alone (docs/design.md)."""

RECORD_4 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (4, 'cron schedules') ON CONFLICT (version) DO NOTHING""")
"""Migration 4 is applied."""

MIGRATION_4 = Migration(
    4,
    "cron schedules",
    (SETUP_SCHEDULE_CRON,),
    RECORD_4,
    Expectations(columns=(("axa_schedule", "cron"), ("axa_schedule", "timezone"))),
)
"""Migration 4 and what it makes sure of."""

# --- Migration 5: unique jobs (all additive) ---------------------------------------------

SETUP_UNIQUE_KEY = statement("ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS unique_key TEXT")
"""A job's unique key (`NewJob.unique_key`), or NULL: at most one job holding a key is
queued, running or in review at a time (`axa_queue_unique`). Not private: shown by
`JobInfo`, the CLI and the dashboard. The Rust crate never sets it."""

SETUP_UNIQUE_FOR = statement(
    "ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS unique_for_ms BIGINT"
)
"""How long, in milliseconds, a finished job keeps holding its key after it finished
(`NewJob.unique_for`, counted from its `updated_at`), or NULL: its key is free once it
finishes."""

SETUP_UNIQUE_INDEX = statement("""CREATE UNIQUE INDEX IF NOT EXISTS axa_queue_unique ON {axa_queue} (unique_key)
    WHERE unique_key IS NOT NULL
      AND (status IN ('queued', 'running', 'needs_review') OR unique_for_ms IS NOT NULL)""")
"""At most one holder of each key: every job not finished, and every finished one with
a `unique_for`, until an enqueue of its key finds its time passed and clears its key
(`sql.ENQUEUE_UNIQUE`), or retention deletes it. A partial index cannot read the clock,
so a finished job's time is judged by the statement that wants its key. The predicate
is the status alone for jobs without `unique_for`, so a job finished by any client (the
Rust crate's workers included) frees its key in the same write; on a large table,
create it CONCURRENTLY first (setup then skips it)."""

RECORD_5 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (5, 'unique jobs') ON CONFLICT (version) DO NOTHING""")
"""Migration 5 is applied."""

MIGRATION_5 = Migration(
    5,
    "unique jobs",
    (SETUP_UNIQUE_KEY, SETUP_UNIQUE_FOR, SETUP_UNIQUE_INDEX),
    RECORD_5,
    Expectations(
        columns=(("axa_queue", "unique_key"), ("axa_queue", "unique_for_ms")),
        indexes=("axa_queue_unique",),
    ),
)
"""Migration 5 and what it makes sure of."""
