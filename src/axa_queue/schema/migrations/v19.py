"""Migration 19, additive: the claim's per-name index as narrow as `axa_queue_claim`
(`axa_queue_pick_hash`), so a claim walking dead entries under a held snapshot reads
no more index pages than a claim of one index does."""

from __future__ import annotations

from ...sql.naming import statement
from .migration import Expectations, Migration

__all__ = ["MIGRATION_19", "RECORD_19", "SETUP_PICK_HASH_INDEX"]

SETUP_PICK_HASH_INDEX = statement("""CREATE INDEX IF NOT EXISTS axa_queue_pick_hash
    ON {axa_queue} (hashtext(name), priority DESC, run_at) WHERE status = 'queued'""")
"""Queued jobs by the name's 32-bit hash, then in claim order: the claim's walk of a
name's priority levels (`sql.exchange`'s `levels`). An entry is 24 bytes, as in
`axa_queue_claim`, against `axa_queue_pick`'s 32 or more (the name itself): a walk over
entries vacuum cannot remove yet reads as many index pages as the single-index claim
does. `hashtext` is the one PostgreSQL's hash indexes and `pg_upgrade` keep stable.
Two names of one hash share a part (the claim then reads the other's entries and
filters them by name); partial, so only an enqueue (or a retry) adds an entry. On a
large existing table, create it `CONCURRENTLY` by hand before upgrading
(docs/schema.md)."""

RECORD_19 = statement("""INSERT INTO {axa_schema_version} (version, name)
    VALUES (19, 'narrow claim index') ON CONFLICT (version) DO NOTHING""")
"""Migration 19 is applied."""

MIGRATION_19 = Migration(
    19,
    "narrow claim index",
    (SETUP_PICK_HASH_INDEX,),
    RECORD_19,
    Expectations(indexes=("axa_queue_pick_hash",)),
)
"""Migration 19 and what it makes sure of."""
