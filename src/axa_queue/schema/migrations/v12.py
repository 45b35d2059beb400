"""Migration 12, additive: the indexes that keep `jobs` (the newest jobs) reading a page
however many jobs the tables hold: queued jobs by creation in `axa_queue`, and moved
jobs by creation in the history."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration

__all__ = [
    "MIGRATION_12",
    "RECORD_12",
    "SETUP_HISTORY_CREATED_INDEX",
    "SETUP_QUEUED_CREATED_INDEX",
]

SETUP_QUEUED_CREATED_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_queued_created
    ON {axa_queue} (created_at DESC, id) WHERE status = 'queued'""")
"""Queued jobs newest first, in `jobs`' order (`sql.JOBS`): the newest of a backlog of
millions are the first entries. Partial, so only an enqueue (or a retry) adds an entry,
never a claim, a heartbeat or an ending; running, in review and finished jobs still in
`axa_queue` are few and sorted as read. On a large existing table, create it
`CONCURRENTLY` by hand before upgrading (docs/schema.md)."""

SETUP_HISTORY_CREATED_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_history_created
    ON {axa_queue_history} (created_at DESC, id)""")
"""Moved jobs newest first, in `jobs`' order: each day partition's newest come first,
merged across the days (a page reads about a page of each day). Made on every
partition, and on each made later (`ATTACH PARTITION` builds it)."""

RECORD_12 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (12, 'newest jobs indexes') ON CONFLICT (version) DO NOTHING""")
"""Migration 12 is applied."""

MIGRATION_12 = Migration(
    12,
    "newest jobs indexes",
    (SETUP_QUEUED_CREATED_INDEX, SETUP_HISTORY_CREATED_INDEX),
    RECORD_12,
    Expectations(indexes=("axa_queue_queued_created", "axa_queue_history_created")),
)
"""Migration 12 and what it makes sure of."""
