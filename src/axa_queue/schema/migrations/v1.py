"""Migration 1: the crate's own setup, in the crate's order (which also upgrades axa
0.1.0's table in place), and the table recording which migrations ran
(`axa_schema_version`)."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = [
    "ACTS_COLUMNS",
    "MIGRATION_1",
    "QUEUE_COLUMNS",
    "RECORD_1",
    "SCHEDULE_COLUMNS",
    "SETUP_ACTS",
    "SETUP_ACTS_ALWAYS",
    "SETUP_ACTS_INDEX",
    "SETUP_ACTS_REFUSE",
    "SETUP_ACTS_ROWS",
    "SETUP_ACTS_TRUNCATE",
    "SETUP_ATTEMPTS",
    "SETUP_CLAIM_INDEX",
    "SETUP_MAX_ATTEMPTS",
    "SETUP_PRIORITY",
    "SETUP_QUEUE",
    "SETUP_READY_INDEX",
    "SETUP_SCHEDULE",
    "SETUP_TIMEOUT",
    "SETUP_VERSION_READ",
    "SETUP_VERSION_TABLE",
]

# --- Migration 1: the crate's statements, in the crate's order, and the version table ---

SETUP_QUEUE = statement("""CREATE TABLE IF NOT EXISTS {axa_queue} (
    id UUID PRIMARY KEY,
    name TEXT NOT NULL,
    args JSONB NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    error TEXT,
    run_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)""")
"""The jobs table as axa 0.1.0 made it; later statements bring it up to date."""

SETUP_ATTEMPTS = statement(
    "ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS attempts INTEGER NOT NULL DEFAULT 0"
)
"""Runs so far; each claim adds one, and it fences every later write of that run."""

SETUP_MAX_ATTEMPTS = statement(
    "ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS max_attempts INTEGER"
)
"""A job's own limit on tries, or NULL for the worker's default."""

SETUP_READY_INDEX = statement(
    "CREATE INDEX IF NOT EXISTS axa_queue_ready ON {axa_queue} (run_at) WHERE status = 'queued'"
)
"""Queued jobs by due time (axa 0.1.0's claim index)."""

SETUP_PRIORITY = statement(
    "ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS priority SMALLINT NOT NULL DEFAULT 0"
)
"""Higher runs first."""

SETUP_TIMEOUT = statement("ALTER TABLE {axa_queue} ADD COLUMN IF NOT EXISTS timeout_ms BIGINT")
"""A job's own time limit per run, or NULL for none."""

SETUP_CLAIM_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_claim
    ON {axa_queue} (priority DESC, run_at) WHERE status = 'queued'""")
"""Queued jobs in claim order; small, because finished rows are not in it."""

SETUP_SCHEDULE = statement("""CREATE TABLE IF NOT EXISTS {axa_schedule} (
    name TEXT PRIMARY KEY,
    due_at TIMESTAMPTZ NOT NULL,
    last_job UUID,
    interval_ms BIGINT,
    seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    archived_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
)""")
"""One row per recurring schedule: when it is next due and the last job it queued."""

SETUP_ACTS = statement("""CREATE TABLE IF NOT EXISTS {axa_job_acts} (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id UUID NOT NULL,
    job_name TEXT NOT NULL,
    act TEXT NOT NULL CHECK (act IN ('cancelled', 'retried', 'released')),
    attempts INTEGER NOT NULL,
    by TEXT NOT NULL CHECK (length(by) BETWEEN 1 AND 200 AND by !~ '[[:cntrl:]]'),
    reason TEXT NOT NULL CHECK (length(reason) BETWEEN 1 AND 200 AND reason !~ '[[:cntrl:]]'),
    at TIMESTAMPTZ NOT NULL DEFAULT now()
)""")
"""A person's acts on jobs: a record, only ever inserted into, with no foreign key so it
outlives the job's row."""

SETUP_ACTS_INDEX = statement(
    "CREATE INDEX IF NOT EXISTS axa_job_acts_job ON {axa_job_acts} (job_id, id)"
)
"""A job's acts in order."""

SETUP_ACTS_REFUSE = statement(
    """CREATE OR REPLACE FUNCTION {axa_job_acts_refuse}() RETURNS trigger
LANGUAGE plpgsql AS $${body}$$""",
    body="""
BEGIN
    RAISE EXCEPTION '% on % is refused: acts on jobs are only ever added to',
        TG_OP, TG_TABLE_NAME;
END
""",
)
"""Refuses whatever fired it, whoever sent it."""

SETUP_ACTS_ROWS = statement("""CREATE OR REPLACE TRIGGER axa_job_acts_refuse
    BEFORE UPDATE OR DELETE ON {axa_job_acts}
    FOR EACH ROW EXECUTE FUNCTION {axa_job_acts_refuse}()""")
"""No act is ever changed or deleted."""

SETUP_ACTS_TRUNCATE = statement("""CREATE OR REPLACE TRIGGER axa_job_acts_refuse_truncate
    BEFORE TRUNCATE ON {axa_job_acts}
    FOR EACH STATEMENT EXECUTE FUNCTION {axa_job_acts_refuse}()""")
"""Nor is the table emptied."""

SETUP_ACTS_ALWAYS = statement("""ALTER TABLE {axa_job_acts}
    ENABLE ALWAYS TRIGGER axa_job_acts_refuse,
    ENABLE ALWAYS TRIGGER axa_job_acts_refuse_truncate""")
"""The refusals fire even with `session_replication_role = replica`."""

SETUP_VERSION_TABLE = statement("""CREATE TABLE IF NOT EXISTS {axa_schema_version} (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)""")
"""One row per migration applied, so `check` can tell a database older than the code;
the crate and older workers never read it."""

SETUP_VERSION_READ = statement("GRANT SELECT ON {axa_schema_version} TO PUBLIC")
"""Every role may read the versions (no private value in them), so `check` works for a
worker's role with only the grants docs/production.md gives."""

RECORD_1 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (1, 'the crate''s tables') ON CONFLICT (version) DO NOTHING""")
"""Migration 1 is applied."""

QUEUE_COLUMNS = (
    "id", "name", "args", "status", "error", "run_at", "started_at", "created_at",
    "updated_at", "attempts", "max_attempts", "priority", "timeout_ms",
)  # fmt: skip
"""The jobs table's columns (`CHECK_QUEUE` selects them)."""

SCHEDULE_COLUMNS = (
    "name", "due_at", "last_job", "interval_ms", "seen_at", "archived_at", "created_at",
    "updated_at",
)  # fmt: skip
"""The schedule table's columns (`CHECK_SCHEDULE` selects them)."""

ACTS_COLUMNS = ("id", "job_id", "job_name", "act", "attempts", "by", "reason", "at")
"""The acts table's columns as the crate makes it; migration 2 adds `db_role`."""

MIGRATION_1 = Migration(
    1,
    "the crate's tables",
    (
        SETUP_QUEUE,
        SETUP_ATTEMPTS,
        SETUP_MAX_ATTEMPTS,
        SETUP_READY_INDEX,
        SETUP_PRIORITY,
        SETUP_TIMEOUT,
        SETUP_CLAIM_INDEX,
        SETUP_SCHEDULE,
        SETUP_ACTS,
        SETUP_ACTS_INDEX,
        SETUP_ACTS_REFUSE,
        SETUP_ACTS_ROWS,
        SETUP_ACTS_TRUNCATE,
        SETUP_ACTS_ALWAYS,
        SETUP_VERSION_TABLE,
        SETUP_VERSION_READ,
    ),
    RECORD_1,
    Expectations(
        tables=("axa_queue", "axa_schedule", "axa_job_acts"),
        columns=(
            *(("axa_queue", c) for c in QUEUE_COLUMNS),
            *(("axa_schedule", c) for c in SCHEDULE_COLUMNS),
            *(("axa_job_acts", c) for c in ACTS_COLUMNS),
        ),
        indexes=("axa_queue_ready", "axa_queue_claim", "axa_job_acts_job"),
        constraints=(
            ("axa_queue", "axa_queue_pkey"),
            ("axa_schedule", "axa_schedule_pkey"),
            ("axa_job_acts", "axa_job_acts_pkey"),
            ("axa_job_acts", "axa_job_acts_act_check"),
            ("axa_job_acts", "axa_job_acts_by_check"),
            ("axa_job_acts", "axa_job_acts_reason_check"),
        ),
        functions=(("axa_job_acts_refuse", body_of(SETUP_ACTS_REFUSE)),),
        triggers=(
            ("axa_job_acts", "axa_job_acts_refuse", True),
            ("axa_job_acts", "axa_job_acts_refuse_truncate", True),
        ),
    ),
)
"""Migration 1 and what it makes sure of."""
