"""Migration 12, additive: the indexes that keep `jobs` (the newest jobs) reading a page
however many jobs the tables hold: queued jobs by creation in `axa_queue`, and moved
jobs by state, and by name and state, and creation in the history."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration

__all__ = [
    "MIGRATION_12",
    "RECORD_12",
    "SETUP_HISTORY_NAME_INDEX",
    "SETUP_HISTORY_STATE_INDEX",
    "SETUP_QUEUED_CREATED_INDEX",
]

SETUP_QUEUED_CREATED_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_queued_created
    ON {axa_queue} (name, created_at DESC, id) WHERE status = 'queued'""")
"""Queued jobs by name, newest first, in `jobs`' order (`sql.JOBS`): each name's newest
of a backlog of millions are its first entries, and the names are found by skipping
from one to the next. Partial, so only an enqueue (or a retry) adds an entry,
never a claim, a heartbeat or an ending; running, in review and finished jobs still in
`axa_queue` are few and sorted as read. On a large existing table, create it
`CONCURRENTLY` by hand before upgrading (docs/schema.md)."""

SETUP_HISTORY_STATE_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_history_status_created
    ON {axa_queue_history} (status, created_at DESC, id)""")
"""Moved jobs of each finished state newest first, in `jobs`' order: a page of any state,
or of all three merged, reads about a page of each day partition. Made on every
partition, and on each made later (`ATTACH PARTITION` builds it)."""

SETUP_HISTORY_NAME_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_history_name_created
    ON {axa_queue_history} (name, status, created_at DESC, id)""")
"""Moved jobs of one name (and state) newest first, for `jobs(name=...)`: a name with few
moved jobs among millions costs what a common one does."""

RECORD_12 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (12, 'newest jobs indexes') ON CONFLICT (version) DO NOTHING""")
"""Migration 12 is applied."""

MIGRATION_12 = Migration(
    12,
    "newest jobs indexes",
    (SETUP_QUEUED_CREATED_INDEX, SETUP_HISTORY_STATE_INDEX, SETUP_HISTORY_NAME_INDEX),
    RECORD_12,
    Expectations(
        indexes=(
            "axa_queue_queued_created",
            "axa_queue_history_status_created",
            "axa_queue_history_name_created",
        )
    ),
)
"""Migration 12 and what it makes sure of."""
