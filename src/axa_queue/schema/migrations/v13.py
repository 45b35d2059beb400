"""Migration 13, additive: the attempts table (`axa_queue_attempts`), one row per run
of a job: when it started and ended, how it ended, its error, and the worker process
that ran it."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration

__all__ = ["ATTEMPTS_COLUMNS", "MIGRATION_13", "RECORD_13", "SETUP_ATTEMPTS_TABLE"]

SETUP_ATTEMPTS_TABLE = statement("""CREATE TABLE IF NOT EXISTS {axa_queue_attempts} (
    job_id UUID NOT NULL,
    attempt INTEGER NOT NULL,
    worker UUID,
    host TEXT,
    pid INTEGER,
    started_at TIMESTAMPTZ,
    ended_at TIMESTAMPTZ,
    outcome TEXT CONSTRAINT axa_queue_attempts_outcome CHECK (outcome IN (
        'completed', 'failed', 'retried', 'snoozed', 'cancelled', 'lost', 'abandoned',
        'given back')),
    error_class TEXT,
    error TEXT,
    PRIMARY KEY (job_id, attempt)
) WITH (fillfactor = 80)""")
"""Every run of a job, by (job, attempt): the row is made by the claim (`EXCHANGE`'s
`started`: the process's id in `axa_workers`, its host and pid, the claim's time) and
ended by the statement that ends the run (`EXCHANGE`'s `ended`, `MARK_LOST`,
`GIVE_BACK`, `RECOVER_STALE`, `CANCEL`): when, how (`outcome`), and for a failure the
error's class and text (at most 2,000 characters). Never the arguments. No foreign key
to `axa_queue`: a job moves to the history and back, and its attempts stay here; they
are deleted with their job by retention (`PURGE`, and `ATTEMPTS_DROP` before the
history's days are dropped). The Rust crate never writes it: a run it made is read from
its job's row (`ATTEMPTS`). `fillfactor` 80 leaves room on each page for a run's ending
to be written next to its start (a HOT update: no index touched)."""

ATTEMPTS_COLUMNS = (
    "job_id", "attempt", "worker", "host", "pid", "started_at", "ended_at", "outcome",
    "error_class", "error",
)  # fmt: skip
"""The attempts table's columns."""

RECORD_13 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (13, 'attempts kept') ON CONFLICT (version) DO NOTHING""")
"""Migration 13 is applied."""

MIGRATION_13 = Migration(
    13,
    "attempts kept",
    (SETUP_ATTEMPTS_TABLE,),
    RECORD_13,
    Expectations(
        tables=("axa_queue_attempts",),
        columns=tuple(("axa_queue_attempts", c) for c in ATTEMPTS_COLUMNS),
        constraints=(
            ("axa_queue_attempts", "axa_queue_attempts_pkey"),
            ("axa_queue_attempts", "axa_queue_attempts_outcome"),
        ),
        storage=(("axa_queue_attempts", ("fillfactor=80",)),),
    ),
)
"""Migration 13 and what it makes sure of."""
