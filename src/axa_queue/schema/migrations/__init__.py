"""The job queue's schema as ordered migrations, each a list of statements safe to repeat.

The tables are the reference crate's (`axa_queue`, `axa_schedule`, `axa_job_acts`)
with the same columns, types and status strings, so a Rust service using the crate
and a Python service using this package can share one queue. Migration 1 is the
crate's own setup (which also upgrades axa 0.1.0's table in place) and the table that
records which migrations ran (`axa_schema_version`); each later one is what this package
adds, one concern each (indexes, constraints, the history, limits, workflows, ...):
docs/schema.md has a line for each, and each module's docstring says what it makes.

Every migration is additive and idempotent (`IF NOT EXISTS`, `CREATE OR REPLACE`,
guarded `DO` blocks), so it brings any earlier state up to date in place, and the
crate and older workers keep running on the result (docs/schema.md). Each ends by
recording its version, and declares what it makes sure of (`Expectations`), which
setup checks in the catalogs before deciding there is nothing to do.

The migrations are in modules of a few versions each (`v1`, `v2`, `v3_to_v5`,
`v6_to_v8`, `v9`, `v10`, `v11`, `v12`, `v13`, `v14`, `v15`, `v16`, `v17`, `v18`, `v19`, `v20`, `v21`, `v22`, `v23`, `v24`), each statement named and said what it does, each migration declared next
to its statements (`MIGRATION_1`...); `migration` holds what a migration is. Every
statement is named here as well (`migrations.SETUP_QUEUE`). A statement naming a
table or function is a template (`sql.naming`), so `sql.in_schema` makes it in any
schema; a function's body is the same in every schema.
"""

from __future__ import annotations

from .migration import Expectations as Expectations
from .migration import Migration as Migration
from .migration import body_of as body_of
from .v1 import (
    ACTS_COLUMNS as ACTS_COLUMNS,
)
from .v1 import (
    MIGRATION_1 as MIGRATION_1,
)
from .v1 import (
    QUEUE_COLUMNS as QUEUE_COLUMNS,
)
from .v1 import (
    RECORD_1 as RECORD_1,
)
from .v1 import (
    SCHEDULE_COLUMNS as SCHEDULE_COLUMNS,
)
from .v1 import (
    SETUP_ACTS as SETUP_ACTS,
)
from .v1 import (
    SETUP_ACTS_ALWAYS as SETUP_ACTS_ALWAYS,
)
from .v1 import (
    SETUP_ACTS_INDEX as SETUP_ACTS_INDEX,
)
from .v1 import (
    SETUP_ACTS_REFUSE as SETUP_ACTS_REFUSE,
)
from .v1 import (
    SETUP_ACTS_ROWS as SETUP_ACTS_ROWS,
)
from .v1 import (
    SETUP_ACTS_TRUNCATE as SETUP_ACTS_TRUNCATE,
)
from .v1 import (
    SETUP_ATTEMPTS as SETUP_ATTEMPTS,
)
from .v1 import (
    SETUP_CLAIM_INDEX as SETUP_CLAIM_INDEX,
)
from .v1 import (
    SETUP_MAX_ATTEMPTS as SETUP_MAX_ATTEMPTS,
)
from .v1 import (
    SETUP_PRIORITY as SETUP_PRIORITY,
)
from .v1 import (
    SETUP_QUEUE as SETUP_QUEUE,
)
from .v1 import (
    SETUP_READY_INDEX as SETUP_READY_INDEX,
)
from .v1 import (
    SETUP_SCHEDULE as SETUP_SCHEDULE,
)
from .v1 import (
    SETUP_TIMEOUT as SETUP_TIMEOUT,
)
from .v1 import (
    SETUP_VERSION_READ as SETUP_VERSION_READ,
)
from .v1 import (
    SETUP_VERSION_TABLE as SETUP_VERSION_TABLE,
)
from .v2 import (
    MIGRATION_2 as MIGRATION_2,
)
from .v2 import (
    RECORD_2 as RECORD_2,
)
from .v2 import (
    SETUP_ACTS_CODES as SETUP_ACTS_CODES,
)
from .v2 import (
    SETUP_ACTS_ROLE as SETUP_ACTS_ROLE,
)
from .v2 import (
    SETUP_ACTS_ROLE_ALWAYS as SETUP_ACTS_ROLE_ALWAYS,
)
from .v2 import (
    SETUP_ACTS_ROLE_FUNCTION as SETUP_ACTS_ROLE_FUNCTION,
)
from .v2 import (
    SETUP_ACTS_ROLE_TRIGGER as SETUP_ACTS_ROLE_TRIGGER,
)
from .v2 import (
    SETUP_FINISHED_INDEX as SETUP_FINISHED_INDEX,
)
from .v2 import (
    SETUP_NOTIFY_FUNCTION as SETUP_NOTIFY_FUNCTION,
)
from .v2 import (
    SETUP_NOTIFY_TRIGGER as SETUP_NOTIFY_TRIGGER,
)
from .v2 import (
    SETUP_PICK_INDEX as SETUP_PICK_INDEX,
)
from .v2 import (
    SETUP_REVIEW_INDEX as SETUP_REVIEW_INDEX,
)
from .v2 import (
    SETUP_RUNNING_INDEX as SETUP_RUNNING_INDEX,
)
from .v2 import (
    SETUP_STATE_CHECK as SETUP_STATE_CHECK,
)
from .v2 import (
    SETUP_STORAGE as SETUP_STORAGE,
)
from .v3_to_v5 import (
    MIGRATION_3 as MIGRATION_3,
)
from .v3_to_v5 import (
    MIGRATION_4 as MIGRATION_4,
)
from .v3_to_v5 import (
    MIGRATION_5 as MIGRATION_5,
)
from .v3_to_v5 import (
    RECORD_3 as RECORD_3,
)
from .v3_to_v5 import (
    RECORD_4 as RECORD_4,
)
from .v3_to_v5 import (
    RECORD_5 as RECORD_5,
)
from .v3_to_v5 import (
    SETUP_RESULT as SETUP_RESULT,
)
from .v3_to_v5 import (
    SETUP_SCHEDULE_CRON as SETUP_SCHEDULE_CRON,
)
from .v3_to_v5 import (
    SETUP_TRACE_CONTEXT as SETUP_TRACE_CONTEXT,
)
from .v3_to_v5 import (
    SETUP_UNIQUE_FOR as SETUP_UNIQUE_FOR,
)
from .v3_to_v5 import (
    SETUP_UNIQUE_INDEX as SETUP_UNIQUE_INDEX,
)
from .v3_to_v5 import (
    SETUP_UNIQUE_KEY as SETUP_UNIQUE_KEY,
)
from .v3_to_v5 import (
    SETUP_WORKERS as SETUP_WORKERS,
)
from .v3_to_v5 import (
    SETUP_WORKERS_SEEN_INDEX as SETUP_WORKERS_SEEN_INDEX,
)
from .v3_to_v5 import (
    WORKERS_COLUMNS as WORKERS_COLUMNS,
)
from .v6_to_v8 import (
    MIGRATION_6 as MIGRATION_6,
)
from .v6_to_v8 import (
    MIGRATION_7 as MIGRATION_7,
)
from .v6_to_v8 import (
    MIGRATION_8 as MIGRATION_8,
)
from .v6_to_v8 import (
    RATE_SLOTS_COLUMNS as RATE_SLOTS_COLUMNS,
)
from .v6_to_v8 import (
    RECORD_6 as RECORD_6,
)
from .v6_to_v8 import (
    RECORD_7 as RECORD_7,
)
from .v6_to_v8 import (
    RECORD_8 as RECORD_8,
)
from .v6_to_v8 import (
    SETUP_AHEAD as SETUP_AHEAD,
)
from .v6_to_v8 import (
    SETUP_RATE_ROOM_FUNCTION as SETUP_RATE_ROOM_FUNCTION,
)
from .v6_to_v8 import (
    SETUP_RATE_SLOTS as SETUP_RATE_SLOTS,
)
from .v6_to_v8 import (
    SETUP_ROOM_FUNCTION as SETUP_ROOM_FUNCTION,
)
from .v9 import (
    MIGRATION_9 as MIGRATION_9,
)
from .v9 import (
    PAUSED_COLUMNS as PAUSED_COLUMNS,
)
from .v9 import (
    RECORD_9 as RECORD_9,
)
from .v9 import (
    SETUP_ACT_KINDS as SETUP_ACT_KINDS,
)
from .v9 import (
    SETUP_PAUSED as SETUP_PAUSED,
)
from .v10 import (
    HISTORY_COLUMNS as HISTORY_COLUMNS,
)
from .v10 import (
    MIGRATION_10 as MIGRATION_10,
)
from .v10 import (
    RECORD_10 as RECORD_10,
)
from .v10 import (
    SETUP_HISTORY as SETUP_HISTORY,
)
from .v10 import (
    SETUP_HISTORY_DAYS_FUNCTION as SETUP_HISTORY_DAYS_FUNCTION,
)
from .v10 import (
    SETUP_HISTORY_DAYS_PRIVATE as SETUP_HISTORY_DAYS_PRIVATE,
)
from .v10 import (
    SETUP_HISTORY_DROP_FUNCTION as SETUP_HISTORY_DROP_FUNCTION,
)
from .v10 import (
    SETUP_HISTORY_DROP_PRIVATE as SETUP_HISTORY_DROP_PRIVATE,
)
from .v10 import (
    SETUP_HISTORY_FINISHED_INDEX as SETUP_HISTORY_FINISHED_INDEX,
)
from .v10 import (
    SETUP_HISTORY_ID_INDEX as SETUP_HISTORY_ID_INDEX,
)
from .v11 import (
    MIGRATION_11 as MIGRATION_11,
)
from .v11 import (
    RECORD_11 as RECORD_11,
)
from .v11 import (
    SETUP_WORKERS_BEAT as SETUP_WORKERS_BEAT,
)
from .v12 import (
    MIGRATION_12 as MIGRATION_12,
)
from .v12 import (
    RECORD_12 as RECORD_12,
)
from .v12 import (
    SETUP_HISTORY_NAME_INDEX as SETUP_HISTORY_NAME_INDEX,
)
from .v12 import (
    SETUP_HISTORY_STATE_INDEX as SETUP_HISTORY_STATE_INDEX,
)
from .v12 import (
    SETUP_QUEUED_CREATED_INDEX as SETUP_QUEUED_CREATED_INDEX,
)
from .v13 import (
    ATTEMPTS_COLUMNS as ATTEMPTS_COLUMNS,
)
from .v13 import (
    MIGRATION_13 as MIGRATION_13,
)
from .v13 import (
    RECORD_13 as RECORD_13,
)
from .v13 import (
    SETUP_ATTEMPTS_TABLE as SETUP_ATTEMPTS_TABLE,
)
from .v14 import DEPS_COLUMNS as DEPS_COLUMNS
from .v14 import MIGRATION_14 as MIGRATION_14
from .v14 import RECORD_14 as RECORD_14
from .v14 import SETUP_BLOCKED_FUNCTION as SETUP_BLOCKED_FUNCTION
from .v14 import SETUP_BLOCKED_INDEX as SETUP_BLOCKED_INDEX
from .v14 import SETUP_BLOCKED_STATE as SETUP_BLOCKED_STATE
from .v14 import SETUP_BLOCKED_TRIGGER as SETUP_BLOCKED_TRIGGER
from .v14 import SETUP_DEPENDENTS_COLUMN as SETUP_DEPENDENTS_COLUMN
from .v14 import SETUP_DEPS_CHILD_INDEX as SETUP_DEPS_CHILD_INDEX
from .v14 import SETUP_DEPS_TABLE as SETUP_DEPS_TABLE
from .v14 import SETUP_NO_PARENT_FUNCTION as SETUP_NO_PARENT_FUNCTION
from .v14 import SETUP_RELEASE_FUNCTION as SETUP_RELEASE_FUNCTION
from .v14 import SETUP_RELEASE_PATH as SETUP_RELEASE_PATH
from .v14 import SETUP_RELEASE_TRIGGER as SETUP_RELEASE_TRIGGER
from .v14 import SETUP_WORKFLOWS_JOB_INDEX as SETUP_WORKFLOWS_JOB_INDEX
from .v14 import SETUP_WORKFLOWS_TABLE as SETUP_WORKFLOWS_TABLE
from .v14 import WORKFLOWS_COLUMNS as WORKFLOWS_COLUMNS
from .v15 import (
    MIGRATION_15 as MIGRATION_15,
)
from .v15 import (
    RECORD_15 as RECORD_15,
)
from .v15 import (
    SETUP_HISTORY_KEY as SETUP_HISTORY_KEY,
)
from .v15 import (
    SETUP_KEY as SETUP_KEY,
)
from .v15 import (
    SETUP_KEY_ROOM_FUNCTION as SETUP_KEY_ROOM_FUNCTION,
)
from .v15 import (
    SETUP_KEYED_INDEX as SETUP_KEYED_INDEX,
)
from .v15 import (
    SETUP_RUNNING_KEYS_INDEX as SETUP_RUNNING_KEYS_INDEX,
)
from .v16 import (
    MIGRATION_16 as MIGRATION_16,
)
from .v16 import (
    RECORD_16 as RECORD_16,
)
from .v16 import (
    RUN_COLUMNS as RUN_COLUMNS,
)
from .v16 import (
    SETUP_RUN_COLUMNS as SETUP_RUN_COLUMNS,
)
from .v16 import (
    SETUP_RUN_COLUMNS_HISTORY as SETUP_RUN_COLUMNS_HISTORY,
)
from .v17 import (
    MIGRATION_17 as MIGRATION_17,
)
from .v17 import (
    RECORD_17 as RECORD_17,
)
from .v17 import (
    SETUP_SLEPT_OUTCOME as SETUP_SLEPT_OUTCOME,
)
from .v17 import (
    SETUP_STEPS_TABLE as SETUP_STEPS_TABLE,
)
from .v17 import (
    STEPS_COLUMNS as STEPS_COLUMNS,
)
from .v18 import (
    MIGRATION_18 as MIGRATION_18,
)
from .v18 import (
    RECORD_18 as RECORD_18,
)
from .v18 import (
    SETUP_NOTE_ENDING_FUNCTION as SETUP_NOTE_ENDING_FUNCTION,
)
from .v18 import (
    SETUP_NOTE_ENDING_TRIGGER as SETUP_NOTE_ENDING_TRIGGER,
)
from .v18 import (
    SETUP_RELEASE_ALL_FUNCTION as SETUP_RELEASE_ALL_FUNCTION,
)
from .v18 import (
    SETUP_RELEASE_ALL_PATH as SETUP_RELEASE_ALL_PATH,
)
from .v18 import (
    SETUP_RELEASE_ALL_TRIGGER as SETUP_RELEASE_ALL_TRIGGER,
)
from .v19 import (
    MIGRATION_19 as MIGRATION_19,
)
from .v19 import (
    RECORD_19 as RECORD_19,
)
from .v19 import (
    SETUP_PICK_HASH_INDEX as SETUP_PICK_HASH_INDEX,
)
from .v20 import (
    LINKS_KEPT as LINKS_KEPT,
)
from .v20 import (
    MIGRATION_20 as MIGRATION_20,
)
from .v20 import (
    RECORD_20 as RECORD_20,
)
from .v20 import (
    SETUP_NOTE_TRACED_FUNCTION as SETUP_NOTE_TRACED_FUNCTION,
)
from .v20 import (
    SETUP_NOTE_TRACED_TRIGGER as SETUP_NOTE_TRACED_TRIGGER,
)
from .v20 import (
    SETUP_PARENT_TRACE_COLUMN as SETUP_PARENT_TRACE_COLUMN,
)
from .v20 import (
    SETUP_RELEASE_TRACED_FUNCTION as SETUP_RELEASE_TRACED_FUNCTION,
)
from .v20 import (
    SETUP_RELEASE_TRACED_PATH as SETUP_RELEASE_TRACED_PATH,
)
from .v20 import (
    SETUP_RELEASE_TRACED_TRIGGER as SETUP_RELEASE_TRACED_TRIGGER,
)
from .v20 import (
    SETUP_RUN_TRACE_COLUMN as SETUP_RUN_TRACE_COLUMN,
)
from .v21 import (
    MIGRATION_21 as MIGRATION_21,
)
from .v21 import (
    RECORD_21 as RECORD_21,
)
from .v21 import (
    SETUP_BLOCKED_CREATED_INDEX as SETUP_BLOCKED_CREATED_INDEX,
)
from .v22 import MIGRATION_22 as MIGRATION_22
from .v22 import RECORD_22 as RECORD_22
from .v22 import SETUP_NOTE_BATCHED_FUNCTION as SETUP_NOTE_BATCHED_FUNCTION
from .v22 import SETUP_NOTE_BATCHED_TRIGGER as SETUP_NOTE_BATCHED_TRIGGER
from .v22 import SETUP_NOTED_FUNCTION as SETUP_NOTED_FUNCTION
from .v22 import SETUP_RELEASE_BATCHED_FUNCTION as SETUP_RELEASE_BATCHED_FUNCTION
from .v22 import SETUP_RELEASE_BATCHED_PATH as SETUP_RELEASE_BATCHED_PATH
from .v22 import SETUP_RELEASE_BATCHED_TRIGGER as SETUP_RELEASE_BATCHED_TRIGGER
from .v23 import MIGRATION_23 as MIGRATION_23
from .v23 import RECORD_23 as RECORD_23
from .v23 import SETUP_RATE_SLOTS_FREE_FUNCTION as SETUP_RATE_SLOTS_FREE_FUNCTION
from .v24 import MIGRATION_24 as MIGRATION_24
from .v24 import RECORD_24 as RECORD_24
from .v24 import SETUP_DEPS_ROOM as SETUP_DEPS_ROOM
from .v24 import SETUP_NOTE_OCTETS_FUNCTION as SETUP_NOTE_OCTETS_FUNCTION
from .v24 import SETUP_NOTE_OCTETS_TRIGGER as SETUP_NOTE_OCTETS_TRIGGER

__all__ = ["MIGRATIONS", "SETUP_STATEMENTS", "VERSION", "Expectations", "Migration"]

MIGRATIONS: tuple[Migration, ...] = (
    MIGRATION_1,
    MIGRATION_2,
    MIGRATION_3,
    MIGRATION_4,
    MIGRATION_5,
    MIGRATION_6,
    MIGRATION_7,
    MIGRATION_8,
    MIGRATION_9,
    MIGRATION_10,
    MIGRATION_11,
    MIGRATION_12,
    MIGRATION_13,
    MIGRATION_14,
    MIGRATION_15,
    MIGRATION_16,
    MIGRATION_17,
    MIGRATION_18,
    MIGRATION_19,
    MIGRATION_20,
    MIGRATION_21,
    MIGRATION_22,
    MIGRATION_23,
    MIGRATION_24,
)
"""Every migration, oldest first; a release adds one at the end (docs/schema.md)."""

VERSION = MIGRATIONS[-1].version
"""The schema version this code needs: its newest migration."""

SETUP_STATEMENTS: tuple[str, ...] = tuple(s for m in MIGRATIONS for s in m.all_statements())
"""The ordered statements that make or update the tables: every migration in order, each
followed by the statement recording its version; each safe to repeat, and the first
fourteen are the crate's own. Needs PostgreSQL 14 or later. Run them in one transaction
holding `pg_advisory_xact_lock(SETUP_LOCK)`, as `Queue.setup` does."""
