"""The indexes of the hot table, `axa_queue`, rebuilt when bloated.

A B-tree never gives back the pages it grew to. While a long transaction (a report,
a forgotten `BEGIN`) holds back vacuum, every job that passes through `axa_queue`
leaves its entries in each index; once vacuum may remove them the pages are empty and
reused, but the index keeps its size, and the claims and counts that walk it keep
reading them. Housekeeping (`maintenance.run_once`, every `maintenance_interval`, unless
`QueueOptions.rebuild_indexes` is off) rebuilds such an index with `REINDEX INDEX
CONCURRENTLY`, as River's reindexer does on a schedule, here only once it is bloated.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from .. import sql
from ..db.calls import by_name

__all__ = [
    "HELD_SNAPSHOT",
    "REINDEX_FACTOR",
    "REINDEX_MIN_BYTES",
    "Rebuilt",
    "log_rebuilt",
    "rebuild",
]

log = logging.getLogger("axa_queue.maintenance")


REINDEX_FACTOR = 2.0
"""An index of `axa_queue` is rebuilt once it takes more than this many times what a
fresh build would (`sql.INDEX_SIZES`)..."""

REINDEX_MIN_BYTES = 1 << 20
"""...and at least this many bytes more: a small index is cheap to scan however empty
its pages."""


HELD_SNAPSHOT = 60.0
"""Seconds another session of the database may have held a snapshot before a round
rebuilds nothing: the rebuild would wait for that transaction to end (bounded by
`sql.REINDEX_WAIT`), and the report may go on for long."""


@dataclass(frozen=True)
class Rebuilt:
    """An index of `axa_queue` that `rebuild` rebuilt, or would (`dry_run`), or
    found bloated and left (`skipped` says why)."""

    index: str
    bytes: int
    """Its size before."""
    fresh_bytes: int
    """What a fresh build of it would take (the estimate of `sql.INDEX_SIZES`)."""
    after: int | None = None
    """Its size after the rebuild (`None`: not rebuilt)."""
    skipped: str | None = None
    """Why it was left as it is, if it was."""


async def rebuild(conn: psycopg.AsyncConnection[Any], *, dry_run: bool = False) -> list[Rebuilt]:
    """Rebuild (`REINDEX INDEX CONCURRENTLY`) each index of `axa_queue` grown past
    `REINDEX_FACTOR` times what a fresh build would take (and `REINDEX_MIN_BYTES`
    more): after vacuum was held back (a long transaction), a B-tree keeps the pages it
    grew to, and every claim and count walks them (`sql.INDEX_SIZES`). Jobs are queued,
    claimed and ended as usual meanwhile. `conn` must be in autocommit mode.

    One process at a time (`sql.REINDEX_LOCK`); none while another session of the
    database has held a snapshot for a minute (the rebuild would wait for it, and hold
    vacuum off the table meanwhile); a wait past `sql.REINDEX_WAIT`'s gives up until
    the next round. A copy a stopped rebuild left behind (invalid, `..._ccnew`) is
    dropped first. Only the table's owner may rebuild its indexes: for another role
    this finds nothing to do. Returns the bloated indexes, each rebuilt (or, with
    `dry_run`, not) or skipped with the reason."""
    async with conn.cursor(row_factory=by_name) as cursor:
        await cursor.execute(sql.INDEX_SIZES)
        found = await cursor.fetchall()
    if not found or not found[0].owned:
        return []
    held = found[0].oldest_snapshot
    leftovers = [r for r in found if not r.valid and "_ccnew" in r.index]
    bloated = [
        Rebuilt(r.index, r.bytes, r.fresh_bytes)
        for r in found
        if r.valid
        and r.fresh_bytes is not None
        and r.bytes > REINDEX_FACTOR * r.fresh_bytes
        and r.bytes - r.fresh_bytes >= REINDEX_MIN_BYTES
    ]
    if dry_run or not (bloated or leftovers):
        return bloated
    if held is not None and held >= HELD_SNAPSHOT:
        why = f"a snapshot has been held for {held:.0f} s"
        return [dataclasses.replace(one, skipped=why) for one in bloated]
    locked = await (await conn.execute(sql.REINDEX_LOCK)).fetchone()
    if not locked or not locked[0]:
        return [dataclasses.replace(one, skipped="another process rebuilds") for one in bloated]
    schema = found[0].schema
    left: dict[str, str] = {}
    try:
        await conn.execute(sql.REINDEX_WAIT)
        for leftover in leftovers:
            await _drop(conn, schema, leftover.index)
        for one in bloated:
            if left:  # a transaction is in the way: the next round tries again
                left[one.index] = "a lock or a snapshot was held"
                continue
            try:
                await conn.execute(sql.reindex(schema, one.index))
            except psycopg.errors.LockNotAvailable:
                left[one.index] = "a lock or a snapshot was held"
                await _drop(conn, schema, f"{one.index}_ccnew")
    finally:
        await conn.execute(sql.REINDEX_WAIT_RESET)
        await conn.execute(sql.REINDEX_UNLOCK)
    async with conn.cursor(row_factory=by_name) as cursor:
        await cursor.execute(sql.INDEX_SIZES)
        after = {r.index: r.bytes for r in await cursor.fetchall()}
    return [
        dataclasses.replace(one, skipped=left[one.index])
        if one.index in left
        else dataclasses.replace(one, after=after.get(one.index))
        for one in bloated
    ]


async def _drop(conn: psycopg.AsyncConnection[Any], schema: str, index: str) -> None:
    """Drop the invalid copy `index` a stopped rebuild left, if it is there; when a lock
    is held past the timeout, the next round tries again (it is listed as invalid)."""
    try:
        await conn.execute(sql.drop_index(schema, index))
    except psycopg.errors.LockNotAvailable:
        log.info("left an invalid index copy for the next round: %s", index)


def log_rebuilt(rebuilt: list[Rebuilt]) -> None:
    """Log each index rebuilt, or found bloated and left."""
    for one in rebuilt:
        if one.after is not None:
            log.info(
                "rebuilt a bloated index of axa_queue: %s, %d kB -> %d kB",
                one.index,
                one.bytes // 1024,
                one.after // 1024,
                extra={"index": one.index, "bytes": one.bytes, "after": one.after},
            )
        elif one.skipped is not None:
            log.info(
                "left a bloated index of axa_queue for the next round: %s, %d kB (%s)",
                one.index,
                one.bytes // 1024,
                one.skipped,
                extra={"index": one.index, "bytes": one.bytes, "skipped": one.skipped},
            )
