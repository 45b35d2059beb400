"""Migration 17, additive: durable steps. The steps table (`axa_queue_steps`), one row
per step a job's handler recorded (`JobContext.step`), and `slept` among the outcomes
of the attempts table (a run that left its loop by `JobContext.sleep`)."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration

__all__ = [
    "MIGRATION_17",
    "RECORD_17",
    "SETUP_SLEPT_OUTCOME",
    "SETUP_STEPS_TABLE",
    "STEPS_COLUMNS",
]

SETUP_STEPS_TABLE = statement("""CREATE TABLE IF NOT EXISTS {axa_queue_steps} (
    job_id UUID NOT NULL,
    name TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    result JSONB,
    started_at TIMESTAMPTZ NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (job_id, name)
)""")
"""Each step a job recorded, by (job, name): the attempt whose run recorded it, what its
function returned (JSON; private like the job's arguments: read only by the job's own
later runs), when its function started and when its result was written. Written only
by `sql.STEP_RECORD`, fenced by the run's attempt; never updated. No foreign key to
`axa_queue`: a job moves to the history and back, and its steps stay here, deleted with
it by retention (`PURGE`, and `STEPS_DROP` before the history's days are dropped), as
its attempts are. The Rust crate never reads or writes it."""

SETUP_SLEPT_OUTCOME = statement("""DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'axa_queue_attempts_outcome' AND conrelid = {'axa_queue_attempts'}::regclass
          AND pg_get_constraintdef(oid) LIKE '%slept%'
    ) THEN
        ALTER TABLE {axa_queue_attempts} DROP CONSTRAINT IF EXISTS axa_queue_attempts_outcome,
            ADD CONSTRAINT axa_queue_attempts_outcome CHECK (outcome IN (
                'completed', 'failed', 'retried', 'snoozed', 'slept', 'cancelled', 'lost',
                'abandoned', 'given back')) NOT VALID;
    END IF;
END
$$""")
"""The attempts' check of outcomes (migration 13's) made again with `slept`, once (a
check cannot be changed in place: dropped and added, `NOT VALID`, so the rows kept are
not rescanned, in one `ALTER`)."""

STEPS_COLUMNS = ("job_id", "name", "attempt", "result", "started_at", "recorded_at")
"""The steps table's columns."""

RECORD_17 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (17, 'durable steps') ON CONFLICT (version) DO NOTHING""")
"""Migration 17 is applied."""

MIGRATION_17 = Migration(
    17,
    "durable steps",
    (SETUP_STEPS_TABLE, SETUP_SLEPT_OUTCOME),
    RECORD_17,
    Expectations(
        tables=("axa_queue_steps",),
        columns=tuple(("axa_queue_steps", c) for c in STEPS_COLUMNS),
        constraints=(("axa_queue_steps", "axa_queue_steps_pkey"),),
    ),
)
"""Migration 17 and what it makes sure of."""
