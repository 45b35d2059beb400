"""The hot table's indexes after a long transaction: an index of `axa_queue` grown past
twice a fresh build's size is rebuilt (`REINDEX INDEX CONCURRENTLY`) by housekeeping or
`axa-queue reindex`; a fresh one never is; none while a snapshot is held; only by the
table's owner."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from axa_queue import QueueOptions, maintenance
from axa_queue.cli import main
from axa_queue.schema import indexes
from conftest import acting_role

QUEUED = 40_000
"""Jobs that pass through the table: enough for the indexes over every queued job to
grow past a megabyte (`indexes.REINDEX_MIN_BYTES`)."""


def sizes(admin: psycopg.Connection[Any]) -> dict[str, int]:
    """The size of each index of `axa_queue`, by name."""
    rows = admin.execute(
        """SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'axa_queue'::regclass"""
    ).fetchall()
    return {name: int(size) for name, size in rows}


def pass_through(admin: psycopg.Connection[Any], count: int = QUEUED) -> None:
    """`count` jobs queued, then gone (as if run, ended and moved to the history), then
    vacuumed: what a held snapshot leaves once it ends, every index's pages emptied
    but kept."""
    admin.execute(
        """INSERT INTO axa_queue (id, name, args, status, created_at, updated_at, run_at)
        SELECT gen_random_uuid(), 'Passing', '{}', 'queued', now(), now(),
               now() + g * interval '1 ms'
        FROM generate_series(1, %(count)s) g""",
        {"count": count},
    )
    admin.execute("DELETE FROM axa_queue WHERE name = 'Passing'")
    admin.execute("VACUUM ANALYZE axa_queue")


def live(admin: psycopg.Connection[Any], count: int) -> None:
    """`count` jobs waiting, analyzed: a table as it is in steady use."""
    admin.execute(
        """INSERT INTO axa_queue (id, name, args, status, created_at, updated_at, run_at)
        SELECT gen_random_uuid(), 'Live', '{}', 'queued', now(), now(),
               now() + g * interval '1 ms'
        FROM generate_series(1, %(count)s) g""",
        {"count": count},
    )
    admin.execute("VACUUM ANALYZE axa_queue")


async def test_an_index_emptied_after_a_held_snapshot_is_rebuilt_to_a_fresh_builds_size(
    make_queue, admin
) -> None:
    queue = await make_queue()
    live(admin, 2_000)
    pass_through(admin)
    before = sizes(admin)
    found = await queue.rebuild_indexes(dry_run=True)
    bloated = {one.index for one in found}
    assert {"axa_queue_pkey", "axa_queue_claim", "axa_queue_pick"} <= bloated
    assert sizes(admin) == before  # a dry run changes nothing
    done = await queue.rebuild_indexes()
    assert {one.index for one in done} == bloated
    after = sizes(admin)
    for one in done:
        assert one.skipped is None and one.after == after[one.index]
        # As small as the estimate of a fresh build says (to its inner pages), and
        # far from being taken for bloated again.
        assert after[one.index] <= one.fresh_bytes * 1.1 + 2 * 8192
        assert one.fresh_bytes < one.bytes / indexes.REINDEX_FACTOR
    # The queue's 2,000 live jobs are all still found through the rebuilt indexes.
    counts = await queue.counts()
    assert counts.ready + counts.waiting == 2_000
    assert await queue.rebuild_indexes() == []  # rebuilt once, then left alone


async def test_indexes_in_steady_use_are_never_taken_for_bloated(make_queue, admin) -> None:
    queue = await make_queue()
    live(admin, QUEUED)  # the ids come in random order: the primary key's pages split
    assert await queue.rebuild_indexes(dry_run=True) == []


async def test_no_index_is_rebuilt_while_a_snapshot_has_been_held_for_a_minute(
    make_queue, admin, dsn, monkeypatch
) -> None:
    queue = await make_queue()
    pass_through(admin)
    before = sizes(admin)
    monkeypatch.setattr(indexes, "HELD_SNAPSHOT", 0.0)  # a minute, in a test's time
    with psycopg.connect(dsn) as report:
        report.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM axa_queue").fetchone()
        found = await queue.rebuild_indexes()
        assert found and all(one.skipped and "snapshot" in one.skipped for one in found)
        assert all(one.after is None for one in found)
    assert sizes(admin) == before


async def test_a_rebuild_that_waits_past_its_timeout_leaves_the_index_and_its_copy_goes_next(
    make_queue, admin, dsn, monkeypatch
) -> None:
    queue = await make_queue()
    pass_through(admin)
    # A snapshot that began after the check (as if a report started a moment later):
    # the rebuild waits for it for its lock_timeout, gives up, and leaves an invalid copy.
    monkeypatch.setattr(indexes, "HELD_SNAPSHOT", float("inf"))
    # The timeout shortened (2 s as shipped): the rebuild and the copy's drop wait it out.
    monkeypatch.setattr("axa_queue.sql.REINDEX_WAIT", "SET lock_timeout = '200ms'")
    with psycopg.connect(dsn) as report:
        report.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM axa_queue").fetchone()
        found = await queue.rebuild_indexes()
        assert found and all(one.after is None and one.skipped for one in found)
    copies = admin.execute(
        """SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'axa_queue'::regclass AND NOT i.indisvalid"""
    ).fetchone()
    assert copies == (1,)  # the report still holds its lock: the copy's drop waited too
    # The report ended: the next round drops any copy left and rebuilds.
    done = await queue.rebuild_indexes()
    assert done and all(one.after is not None for one in done)
    left = admin.execute(
        """SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'axa_queue'::regclass AND (NOT i.indisvalid OR c.relname LIKE '%ccnew%')"""
    ).fetchone()
    assert left == (0,)


async def test_a_role_that_does_not_own_the_table_finds_nothing_to_rebuild(
    make_queue, admin, dsn, schema
) -> None:
    await make_queue()
    pass_through(admin)
    with acting_role(admin, dsn, worker_of=schema) as (_, worker_dsn):
        async with await psycopg.AsyncConnection.connect(worker_dsn, autocommit=True) as conn:
            assert await indexes.rebuild(conn) == []


async def test_housekeeping_rebuilds_a_bloated_index_unless_turned_off(
    make_queue, admin, caplog
) -> None:
    off = await make_queue(rebuild_indexes=False)
    pass_through(admin)
    before = sizes(admin)
    assert await maintenance.run_once(off.pool, off.options, []) is None
    assert sizes(admin) == before
    on = await make_queue()
    with caplog.at_level("INFO", logger="axa_queue.maintenance"):
        assert await maintenance.run_once(on.pool, on.options, []) is None
    assert sizes(admin)["axa_queue_pick"] < before["axa_queue_pick"]
    assert "rebuilt a bloated index of axa_queue: axa_queue_pick" in caplog.text


def test_the_option_is_on_by_default() -> None:
    assert QueueOptions().rebuild_indexes is True


@pytest.mark.parametrize("dry_run", [True, False])
def test_axa_queue_reindex_lists_and_rebuilds_the_bloated_indexes(admin, dsn, dry_run) -> None:
    assert CliRunner().invoke(main, ["setup", "--dsn", dsn]).exit_code == 0
    pass_through(admin)
    before = sizes(admin)
    args = ["reindex", "--json", "--dsn", dsn] + (["--dry-run"] if dry_run else [])
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    found = {one["index"]: one for one in json.loads(result.output)}
    assert "axa_queue_pick" in found
    assert found["axa_queue_pick"]["bytes"] == before["axa_queue_pick"]
    if dry_run:
        assert sizes(admin) == before
        assert found["axa_queue_pick"]["after"] is None
    else:
        assert found["axa_queue_pick"]["after"] == sizes(admin)["axa_queue_pick"]
        shown = CliRunner().invoke(main, ["reindex", "--dsn", dsn])
        assert shown.exit_code == 0 and "0 bloated indexes of axa_queue found" in shown.output
