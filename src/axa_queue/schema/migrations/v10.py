"""Migration 10, additive: paused job names (`axa_paused`) and the acts on a name
(`paused`, `resumed`) in the acts table."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration

__all__ = ["MIGRATION_10", "PAUSED_COLUMNS", "RECORD_10", "SETUP_ACT_KINDS", "SETUP_PAUSED"]

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
        WHERE conname = 'axa_job_acts_act_known' AND conrelid = {'axa_job_acts'}::regclass
    ) THEN
        ALTER TABLE {axa_job_acts} DROP CONSTRAINT IF EXISTS axa_job_acts_act_check;
        ALTER TABLE {axa_job_acts} ADD CONSTRAINT axa_job_acts_act_known
            CHECK (act IN ('cancelled', 'retried', 'released', 'paused', 'resumed')) NOT VALID;
    END IF;
END
$$""")
"""The acts table accepts the acts on a job name (`paused`, `resumed`) beside the acts
on a job: the crate's check of the three acts on a job (`axa_job_acts_act_check`, made
with the table) gives way to one of all five, in one transaction, so there is never a
moment without a check. NOT VALID: the acts kept are not read again (every one passes).
An act on a name has the nil UUID as its `job_id` and the name as its `job_name`. The
crate reads acts by job id, so it never meets one."""

PAUSED_COLUMNS = ("name", "by", "reason", "at")
"""The columns of `axa_paused`."""

RECORD_10 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (10, 'paused names') ON CONFLICT (version) DO NOTHING""")
"""Migration 10 is applied."""

MIGRATION_10 = Migration(
    10,
    "paused names",
    (SETUP_PAUSED, SETUP_ACT_KINDS),
    RECORD_10,
    Expectations(
        tables=("axa_paused",),
        columns=tuple(("axa_paused", c) for c in PAUSED_COLUMNS),
        constraints=(("axa_job_acts", "axa_job_acts_act_known"),),
    ),
)
"""Migration 10 and what it makes sure of."""
