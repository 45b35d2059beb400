"""Migration 2: what this package adds to the crate's tables, all additive: partial
indexes, CHECK constraints marked NOT VALID, the role of each act, storage settings
and the statement-level trigger that sends one notification per INSERT."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = [
    "MIGRATION_2",
    "RECORD_2",
    "SETUP_ACTS_CODES",
    "SETUP_ACTS_ROLE",
    "SETUP_ACTS_ROLE_ALWAYS",
    "SETUP_ACTS_ROLE_FUNCTION",
    "SETUP_ACTS_ROLE_TRIGGER",
    "SETUP_FINISHED_INDEX",
    "SETUP_NOTIFY_FUNCTION",
    "SETUP_NOTIFY_TRIGGER",
    "SETUP_PICK_INDEX",
    "SETUP_REVIEW_INDEX",
    "SETUP_RUNNING_INDEX",
    "SETUP_STATE_CHECK",
    "SETUP_STORAGE",
]

# --- Migration 2: what this package adds, all additive -----------------------------------

SETUP_RUNNING_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_running
    ON {axa_queue} (updated_at) WHERE status = 'running'""")
"""Running jobs by last report, so stale recovery reads only running rows."""

SETUP_FINISHED_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_finished
    ON {axa_queue} (updated_at) WHERE status IN ('completed', 'failed', 'cancelled')""")
"""Finished jobs by age, so retention deletes in small batches without a table scan."""

SETUP_PICK_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_pick
    ON {axa_queue} (name, priority DESC, run_at) WHERE status = 'queued'""")
"""Queued jobs by name in claim order, so a worker reads only the names it handles, at
exactly the priority level it wants; on a large existing table, create it CONCURRENTLY
first (setup then skips it)."""

SETUP_REVIEW_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_review
    ON {axa_queue} (updated_at) WHERE status = 'needs_review'""")
"""Jobs waiting for a person, for review screens."""

SETUP_STATE_CHECK = statement("""DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'axa_queue_state_valid' AND conrelid = {'axa_queue'}::regclass
    ) THEN
        ALTER TABLE {axa_queue} ADD CONSTRAINT axa_queue_state_valid CHECK (
            status IN ('queued', 'running', 'completed', 'failed', 'cancelled', 'needs_review')
            AND attempts >= 0
            AND (status <> 'running' OR started_at IS NOT NULL)
        ) NOT VALID;
    END IF;
END
$$""")
"""The table refuses unknown states, and a running job without a start; NOT VALID so
rows already there are not rescanned (an old table may hold anything)."""

SETUP_ACTS_ROLE = statement("""DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = {'axa_job_acts'}::regclass AND attname = 'db_role' AND NOT attisdropped
    ) THEN
        ALTER TABLE {axa_job_acts} ADD COLUMN IF NOT EXISTS db_role TEXT,
            ALTER COLUMN db_role SET DEFAULT current_user;
    END IF;
END
$$""")
"""Each act keeps the database role that inserted it (`current_user`), whoever's
statement it was, the Rust crate's included. Acts kept before the column was added
have none (NULL), rather than the role that ran setup; added once, so later setups take
no lock."""

SETUP_ACTS_ROLE_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_job_acts_role}() RETURNS trigger
LANGUAGE plpgsql AS $${body}$$""",
    body="""
BEGIN
    NEW.db_role := current_user;
    RETURN NEW;
END
""",
)
"""Sets an act's role to the role inserting it, whatever the INSERT said."""

SETUP_ACTS_ROLE_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_job_acts_role
    BEFORE INSERT ON {axa_job_acts}
    FOR EACH ROW EXECUTE FUNCTION {axa_job_acts_role}()""")
"""No insert chooses its own `db_role`: a role that may insert acts can write any `by`,
but not another role's name."""

SETUP_ACTS_ROLE_ALWAYS = statement(
    "ALTER TABLE {axa_job_acts} ENABLE ALWAYS TRIGGER axa_job_acts_role"
)
"""It fires even with `session_replication_role = replica`."""

SETUP_ACTS_CODES = statement(r"""DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'axa_job_acts_codes_visible' AND conrelid = {'axa_job_acts'}::regclass
    ) THEN
        ALTER TABLE {axa_job_acts} ADD CONSTRAINT axa_job_acts_codes_visible CHECK (
            by !~ '^ | $|[\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]'
            AND reason !~ '^ | $|[\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]'
        ) NOT VALID;
    END IF;
END
$$""")
"""The table refuses a `by` or `reason` with a space first or last (so a blank one) or
with an invisible character PostgreSQL's `[[:cntrl:]]` lets through: zero-width and
bidi controls (U+200B..U+200F, U+202A..U+202E, U+2066..U+2069), line and paragraph
separators, the BOM, soft hyphen and tag characters. `acts.check_code` refuses all this
and more before anything is sent; this keeps acts other clients insert visible too. NOT
VALID, so acts already kept are not rescanned (and they may never be changed)."""

SETUP_STORAGE = statement("""DO $$
BEGIN
    IF NOT coalesce((SELECT reloptions FROM pg_class WHERE oid = {'axa_queue'}::regclass)
                    @> ARRAY['fillfactor=80', 'autovacuum_vacuum_scale_factor=0.02',
                             'autovacuum_analyze_scale_factor=0.02'], false) THEN
        ALTER TABLE {axa_queue} SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
                                   autovacuum_analyze_scale_factor = 0.02);
    END IF;
END
$$""")
"""Room on each page for a row's new versions (claims, endings, heartbeats) to stay on
its page, and vacuum that keeps up with a hot table; set once, so later setups take no
lock. (Heartbeats are not HOT updates: `updated_at` keys the partial indexes that stale
recovery and retention read.)"""

SETUP_NOTIFY_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_notify}() RETURNS trigger
LANGUAGE plpgsql AS $${body}$$""",
    body="""
DECLARE
    earliest TIMESTAMPTZ;
BEGIN
    IF current_setting('axa_queue.notify', true) IS DISTINCT FROM 'off' THEN
        SELECT min(run_at) INTO earliest FROM axa_queue_inserted WHERE status = 'queued';
        IF earliest IS NOT NULL THEN
            PERFORM pg_notify('axa_queue', TG_TABLE_SCHEMA || ' '
                || greatest(EXTRACT(EPOCH FROM earliest) - EXTRACT(EPOCH FROM now()),
                            0)::float8::text);
        END IF;
    END IF;
    RETURN NULL;
END
""",
)
"""One notification per INSERT statement, however many rows, saying when the earliest
new job is due; `SET axa_queue.notify = off` silences it for a session. The delay is a
difference of epoch seconds, so a `run_at` of `infinity` (another client's) is no
error before PostgreSQL 17, where timestamps at infinity cannot be subtracted."""

SETUP_NOTIFY_TRIGGER = statement("""CREATE OR REPLACE TRIGGER axa_queue_notify
    AFTER INSERT ON {axa_queue} REFERENCING NEW TABLE AS axa_queue_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {axa_queue_notify}()""")
"""Wakes workers for jobs queued by anyone, the Rust crate included."""

RECORD_2 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (2, 'axa-queue''s additions') ON CONFLICT (version) DO NOTHING""")
"""Migration 2 is applied."""

MIGRATION_2 = Migration(
    2,
    "axa-queue's additions",
    (
        SETUP_RUNNING_INDEX,
        SETUP_FINISHED_INDEX,
        SETUP_REVIEW_INDEX,
        SETUP_PICK_INDEX,
        SETUP_STATE_CHECK,
        SETUP_ACTS_ROLE,
        SETUP_ACTS_ROLE_FUNCTION,
        SETUP_ACTS_ROLE_TRIGGER,
        SETUP_ACTS_ROLE_ALWAYS,
        SETUP_ACTS_CODES,
        SETUP_STORAGE,
        SETUP_NOTIFY_FUNCTION,
        SETUP_NOTIFY_TRIGGER,
    ),
    RECORD_2,
    Expectations(
        columns=(("axa_job_acts", "db_role"),),
        indexes=(
            "axa_queue_running",
            "axa_queue_finished",
            "axa_queue_review",
            "axa_queue_pick",
        ),
        constraints=(
            ("axa_queue", "axa_queue_state_valid"),
            ("axa_job_acts", "axa_job_acts_codes_visible"),
        ),
        functions=(
            ("axa_job_acts_role", body_of(SETUP_ACTS_ROLE_FUNCTION)),
            ("axa_queue_notify", body_of(SETUP_NOTIFY_FUNCTION)),
        ),
        triggers=(
            ("axa_job_acts", "axa_job_acts_role", True),
            ("axa_queue", "axa_queue_notify", False),
        ),
        storage=(
            (
                "axa_queue",
                (
                    "fillfactor=80",
                    "autovacuum_vacuum_scale_factor=0.02",
                    "autovacuum_analyze_scale_factor=0.02",
                ),
            ),
        ),
    ),
)
"""Migration 2 and what it makes sure of."""
