"""Migration 16, additive: who runs a job's run, on its own row (`run_worker`,
`run_attempt`, `run_host`, `run_pid` in `axa_queue` and `axa_queue_history`), written by
the claim's own `UPDATE`, so a run costs no row of `axa_queue_attempts` until it ends
in any way but completed."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration

__all__ = [
    "MIGRATION_16",
    "RECORD_16",
    "RUN_COLUMNS",
    "SETUP_RUN_COLUMNS",
    "SETUP_RUN_COLUMNS_HISTORY",
]

RUN_COLUMNS = ("run_worker", "run_attempt", "run_host", "run_pid")
"""The columns naming a job's last run's process: its id in `axa_workers`, the attempt
they belong to, its host and pid."""

SETUP_RUN_COLUMNS = statement("""ALTER TABLE {axa_queue}
    ADD COLUMN IF NOT EXISTS run_worker UUID,
    ADD COLUMN IF NOT EXISTS run_attempt INTEGER,
    ADD COLUMN IF NOT EXISTS run_host TEXT,
    ADD COLUMN IF NOT EXISTS run_pid INTEGER""")
"""The claim stamps each job it takes with the claiming process (`run_worker`, its id in
`axa_workers`, `run_host`, `run_pid`) and the attempt they belong to (`run_attempt`).
They say who runs or ran the job's attempt `run_attempt`, and nothing about another:
the Rust crate's claim raises `attempts` and leaves them, so a run it made is told apart
(`run_attempt <> attempts`). No default and no index: adding them rewrites nothing, and
the claim's `UPDATE` writes a new version of the row anyway (no other write per run)."""

SETUP_RUN_COLUMNS_HISTORY = statement("""ALTER TABLE {axa_queue_history}
    ADD COLUMN IF NOT EXISTS run_worker UUID,
    ADD COLUMN IF NOT EXISTS run_attempt INTEGER,
    ADD COLUMN IF NOT EXISTS run_host TEXT,
    ADD COLUMN IF NOT EXISTS run_pid INTEGER""")
"""The same columns in the history (every day partition takes them), which a move
carries (`history.HISTORY_COLUMNS_MOVED`), so a finished job's last run keeps its
process there."""

RECORD_16 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (16, 'runs on their jobs') ON CONFLICT (version) DO NOTHING""")
"""Migration 16 is applied."""

MIGRATION_16 = Migration(
    16,
    "runs on their jobs",
    (SETUP_RUN_COLUMNS, SETUP_RUN_COLUMNS_HISTORY),
    RECORD_16,
    Expectations(
        columns=tuple(
            (table, c) for table in ("axa_queue", "axa_queue_history") for c in RUN_COLUMNS
        ),
    ),
)
"""Migration 16 and what it makes sure of."""
