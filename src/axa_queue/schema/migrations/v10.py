"""Migration 10, additive: the history table finished jobs are moved to
(`axa_queue_history`), partitioned by day of their finish, and the two functions that
make its partitions ahead and drop those past retention."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration, body_of

__all__ = [
    "HISTORY_COLUMNS",
    "MIGRATION_10",
    "RECORD_10",
    "SETUP_HISTORY",
    "SETUP_HISTORY_DAYS_FUNCTION",
    "SETUP_HISTORY_DAYS_PRIVATE",
    "SETUP_HISTORY_DROP_FUNCTION",
    "SETUP_HISTORY_DROP_PRIVATE",
    "SETUP_HISTORY_FINISHED_INDEX",
    "SETUP_HISTORY_ID_INDEX",
]

SETUP_HISTORY = statement("""CREATE TABLE IF NOT EXISTS {axa_queue_history} (
    id UUID NOT NULL,
    name TEXT NOT NULL,
    args JSONB NOT NULL,
    status TEXT NOT NULL CONSTRAINT axa_queue_history_status
        CHECK (status IN ('completed', 'failed', 'cancelled')),
    error TEXT,
    run_at TIMESTAMPTZ NOT NULL,
    started_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    attempts INTEGER NOT NULL,
    max_attempts INTEGER,
    priority SMALLINT NOT NULL,
    timeout_ms BIGINT,
    trace_context JSONB,
    result JSONB,
    unique_key TEXT,
    unique_for_ms BIGINT,
    ahead INTEGER,
    given_back INTEGER NOT NULL,
    moved_at TIMESTAMPTZ NOT NULL DEFAULT now()
) PARTITION BY RANGE (updated_at)""")
"""Finished jobs (completed, failed, cancelled) moved out of `axa_queue` once they have
been finished for `QueueOptions.keep_recent` (`sql.HISTORY_MOVE`): the same columns,
and when each was moved (`moved_at`). Partitioned by range of `updated_at`, the time the
job finished, one partition per UTC day (`axa_queue_history_YYYYMMDD`), made ahead by
housekeeping (`axa_queue_history_days`) and dropped whole once past retention
(`axa_queue_history_drop`): retention never deletes history rows one by one. No
primary key (a partitioned table's unique index must hold the partition key): a job is
in one table or the other, never both, since every move or move back is one statement.
The Rust crate never reads it: its `job()` finds a job only while it is in `axa_queue`."""

SETUP_HISTORY_ID_INDEX = statement(
    "CREATE INDEX IF NOT EXISTS axa_queue_history_id ON {axa_queue_history} (id)"
)
"""A moved job by id (`job`, `result`, `wait`, `retry`): one probe per partition."""

SETUP_HISTORY_FINISHED_INDEX = statement(
    "CREATE INDEX IF NOT EXISTS axa_queue_history_finished ON {axa_queue_history} (updated_at)"
)
"""Moved jobs by when they finished, for the dashboard's pages and per-minute counts, as
`axa_queue_finished` orders the finished rows still in `axa_queue`."""

SETUP_HISTORY_DAYS_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_history_days}(history regclass, first_day date, last_day date)
RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $${body}$$""",
    body="""
DECLARE
    parent name;
    space name;
    day date;
    part text;
    made integer := 0;
BEGIN
    SELECT c.relname, n.nspname INTO parent, space
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = history AND c.relkind = 'p' AND c.relname = 'axa_queue_history'
          AND pg_has_role(c.relowner, 'USAGE');
    IF parent IS NULL THEN
        RAISE EXCEPTION '% is not a job history table of this role', history;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(history::oid::text || ' partitions', 1635213689));
    day := first_day;
    WHILE day <= last_day LOOP
        part := parent || '_' || to_char(day, 'YYYYMMDD');
        IF to_regclass(format('%I.%I', space, part)) IS NULL THEN
            EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                           space, part, history);
            EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                           history, space, part, day::timestamp AT TIME ZONE 'UTC',
                           (day + 1)::timestamp AT TIME ZONE 'UTC');
            made := made + 1;
        END IF;
        day := day + 1;
    END LOOP;
    RETURN made;
END
""",
)
"""Make the missing day partitions of the history table `history` from `first_day` to
`last_day` (UTC days), and return how many it made. Each is made as a table of its own,
then attached (`ATTACH PARTITION` takes a lock on the history table that lets its
readers and the moves go on, where `CREATE TABLE ... PARTITION OF` would stop them);
one process at a time, under an advisory lock for the table. `SECURITY DEFINER`, so the
least-privilege role of docs/production.md, which may not make tables, can have its
worker make them (`EXECUTE` is granted to that role, not to everyone); it acts only on
a partitioned table named `axa_queue_history` whose owner's rights the owner of the
function has. The body is the same in every schema (placed as it is)."""

SETUP_HISTORY_DROP_FUNCTION = statement(
    """CREATE OR REPLACE FUNCTION {axa_queue_history_drop}(history regclass, before_day date)
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $${body}$$""",
    body="""
DECLARE
    parent name;
    part regclass;
    held bigint;
    gone bigint := 0;
BEGIN
    SELECT c.relname INTO parent FROM pg_class c
        WHERE c.oid = history AND c.relkind = 'p' AND c.relname = 'axa_queue_history'
          AND pg_has_role(c.relowner, 'USAGE');
    IF parent IS NULL THEN
        RAISE EXCEPTION '% is not a job history table of this role', history;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(history::oid::text || ' partitions', 1635213689));
    FOR part IN
        SELECT i.inhrelid::regclass FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = history AND left(c.relname, length(parent) + 1) = parent || '_'
          AND substr(c.relname, length(parent) + 2) ~ '^[0-9]{8}$'
          AND substr(c.relname, length(parent) + 2) < to_char(before_day, 'YYYYMMDD')
        ORDER BY c.relname
    LOOP
        EXECUTE format('SELECT count(*) FROM %s', part) INTO held;
        EXECUTE format('DROP TABLE %s', part);
        gone := gone + held;
    END LOOP;
    RETURN gone;
END
""",
)
"""Drop the day partitions of the history table `history` of days before `before_day`
(UTC), every row of which finished before that day began, and return how many jobs
they held (counted before each is dropped). Retention drops whole days: a moved job is
kept from `retention` to `retention` and a day. Under the same advisory lock as
`axa_queue_history_days`, `SECURITY DEFINER` and checked the same way."""

SETUP_HISTORY_DAYS_PRIVATE = statement(
    "REVOKE ALL ON FUNCTION {axa_queue_history_days}(regclass, date, date) FROM PUBLIC"
)
"""Only the owner, and the roles it grants `EXECUTE` to (docs/production.md), make
partitions."""

SETUP_HISTORY_DROP_PRIVATE = statement(
    "REVOKE ALL ON FUNCTION {axa_queue_history_drop}(regclass, date) FROM PUBLIC"
)
"""Only the owner, and the roles it grants `EXECUTE` to, drop history."""

RECORD_10 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (10, 'job history') ON CONFLICT (version) DO NOTHING""")
"""Migration 10 is applied."""

HISTORY_COLUMNS = (
    "id", "name", "args", "status", "error", "run_at", "started_at", "created_at",
    "updated_at", "attempts", "max_attempts", "priority", "timeout_ms", "trace_context",
    "result", "unique_key", "unique_for_ms", "ahead", "given_back", "moved_at",
)  # fmt: skip
"""The history table's columns: the jobs table's of migrations 1 to 8, and `moved_at`."""

MIGRATION_10 = Migration(
    10,
    "job history",
    (
        SETUP_HISTORY,
        SETUP_HISTORY_ID_INDEX,
        SETUP_HISTORY_FINISHED_INDEX,
        SETUP_HISTORY_DAYS_FUNCTION,
        SETUP_HISTORY_DROP_FUNCTION,
        SETUP_HISTORY_DAYS_PRIVATE,
        SETUP_HISTORY_DROP_PRIVATE,
    ),
    RECORD_10,
    Expectations(
        tables=("axa_queue_history",),
        columns=tuple(("axa_queue_history", c) for c in HISTORY_COLUMNS),
        indexes=("axa_queue_history_id", "axa_queue_history_finished"),
        constraints=(("axa_queue_history", "axa_queue_history_status"),),
        functions=(
            ("axa_queue_history_days(regclass,date,date)", body_of(SETUP_HISTORY_DAYS_FUNCTION)),
            ("axa_queue_history_drop(regclass,date)", body_of(SETUP_HISTORY_DROP_FUNCTION)),
        ),
    ),
)
"""Migration 10 and what it makes sure of."""
