"""Migration 11, additive: each worker process's heartbeat interval in `axa_workers`
(`beat_ms`), so readers call a process gone once it has missed a few beats."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration

__all__ = ["MIGRATION_11", "RECORD_11", "SETUP_WORKERS_BEAT"]

SETUP_WORKERS_BEAT = statement("ALTER TABLE {axa_workers} ADD COLUMN IF NOT EXISTS beat_ms BIGINT")
"""How often the process refreshes its row, in milliseconds, written by `WORKER_SEEN`:
a process silent for `presence.GONE_AFTER_BEATS` of them is shown as gone. NULL in the
rows of processes running an older version, which readers judge by `stale_after` as
before. A small table, and a column without a default: adding it rewrites nothing."""

RECORD_11 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (11, 'worker heartbeat intervals') ON CONFLICT (version) DO NOTHING""")
"""Migration 11 is applied."""

MIGRATION_11 = Migration(
    11,
    "worker heartbeat intervals",
    (SETUP_WORKERS_BEAT,),
    RECORD_11,
    Expectations(columns=(("axa_workers", "beat_ms"),)),
)
"""Migration 11 and what it makes sure of."""
