"""Migration 9, additive: paused job names (`axa_paused`) and the acts on a name
(`paused`, `resumed`) in the acts table."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration

__all__ = ["MIGRATION_9", "PAUSED_COLUMNS", "RECORD_9", "SETUP_ACT_KINDS", "SETUP_PAUSED"]

SETUP_PAUSED = statement(r"""CREATE TABLE IF NOT EXISTS {axa_paused} (
    name TEXT PRIMARY KEY,
    by TEXT NOT NULL CHECK (length(by) BETWEEN 1 AND 200 AND by !~ '[[:cntrl:]]'),
    reason TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 200 AND reason !~ '[[:cntrl:]]'),
    at TIMESTAMPTZ NOT NULL DEFAULT now()
)""")
"""The job names paused now, one row each: who paused it, why and since when. A row is
made by `PAUSE` and deleted by `RESUME`, each with its act in `axa_job_acts` (the record
of every pause and resume, with the role that wrote it); this table is only the state.
The claim reads it for the names it wants, by primary key."""

SETUP_ACT_KINDS = statement("""DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'axa_job_acts_act_check' AND conrelid = {'axa_job_acts'}::regclass
          AND pg_get_constraintdef(oid) LIKE '%paused%'
    ) THEN
        ALTER TABLE {axa_job_acts} DROP CONSTRAINT IF EXISTS axa_job_acts_act_check;
        ALTER TABLE {axa_job_acts} ADD CONSTRAINT axa_job_acts_act_check
            CHECK (act IN ('cancelled', 'retried', 'released', 'paused', 'resumed')) NOT VALID;
    END IF;
END
$$""")
"""The acts table accepts the acts on a job name (`paused`, `resumed`) beside the acts
on a job: the crate's check of the three acts on a job (`axa_job_acts_act_check`, made
with the table) is made again, under its own name, for all five, in one transaction,
so there is never a moment without a check. NOT VALID: the acts kept are not read again
(every one passes). An act on a name has the nil UUID as its `job_id` and the name as
its `job_name`. The crate reads acts by job id, so it never meets one, and its setup
(`CREATE TABLE IF NOT EXISTS`) leaves the check as it is."""

PAUSED_COLUMNS = ("name", "by", "reason", "at")
"""The columns of `axa_paused`."""

RECORD_9 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (9, 'paused names') ON CONFLICT (version) DO NOTHING""")
"""Migration 9 is applied."""

MIGRATION_9 = Migration(
    9,
    "paused names",
    (SETUP_PAUSED, SETUP_ACT_KINDS),
    RECORD_9,
    Expectations(
        tables=("axa_paused",),
        columns=tuple(("axa_paused", c) for c in PAUSED_COLUMNS),
        constraints=(
            ("axa_paused", "axa_paused_pkey"),
            ("axa_paused", "axa_paused_by_check"),
            ("axa_paused", "axa_paused_reason_check"),
        ),
    ),
)
"""Migration 9 and what it makes sure of."""
