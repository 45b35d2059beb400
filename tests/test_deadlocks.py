"""Row locks: a worker's statements never wait on each other in a cycle, so PostgreSQL
never aborts one of them with `deadlock detected` (each costs `deadlock_timeout`)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
import pytest

from axa_queue import NewJob, sql
from conftest import MovedClock, eventually, lock_waits, running, status_of
from test_fencing import Blocking

JOBS = 50_000
"""Short no-op jobs queued at once: thousands stay queued while the worker runs, so every
exchange claims a full batch ahead and the heartbeat has many runs to beat. (It runs
first, beside the other test process's longest tests: on a loaded machine 100,000 took
the whole of the default 120 s timeout.)"""


def deadlocks(admin: psycopg.Connection[Any]) -> int:
    """The server's count of deadlocks in this database, as the statistics say now
    (a backend reports its own when it goes idle or ends)."""
    admin.execute("SELECT pg_stat_clear_snapshot()")
    row = admin.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.alone
@pytest.mark.timeout(300)
async def test_a_worker_at_full_speed_with_prefetch_and_a_short_heartbeat_never_deadlocks(
    make_queue, admin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="axa_queue")
    queue = await make_queue(workers=16, heartbeat_interval=0.05, stale_after=30)
    done = 0

    @queue.handler("Noop")
    async def noop(args: dict[str, Any]) -> None:
        nonlocal done
        done += 1

    await queue.enqueue_all(NewJob("Noop", {}) for _ in range(JOBS))
    before = deadlocks(admin)
    async with running(queue):
        await eventually(lambda: done >= JOBS, timeout=240)
    await queue.close()  # its sessions end, and report their statistics as they do
    aborted = [
        record.getMessage()
        for record in caplog.records
        if "deadlock" in f"{record.getMessage()} {getattr(record, 'error', '')}".lower()
    ]
    assert aborted == []
    assert deadlocks(admin) == before
    row = admin.execute(
        "SELECT count(*) FILTER (WHERE status = 'completed' AND attempts = 1), count(*) "
        "FROM axa_queue"
    ).fetchone()
    assert row == (JOBS, JOBS)


def beat(admin: psycopg.Connection[Any], *runs: tuple[UUID, int]) -> dict[str, str]:
    """Send `HEARTBEAT` for `runs` (id, attempt) as a worker does; what it said of each:
    beaten, busy or cancelled (a run it does not return lost its claim). A wait for a
    row lock fails it at once."""
    admin.execute("SET lock_timeout = '2s'")
    rows = admin.execute(
        sql.HEARTBEAT,
        {
            "ids": "{" + ",".join(str(job_id) for job_id, _ in runs) + "}",
            "attempts": "{" + ",".join(str(attempts) for _, attempts in runs) + "}",
            "now": None,
        },
    ).fetchall()
    return {str(row[0]): "busy" if row[3] else "cancelled" if row[2] else "beaten" for row in rows}


async def test_a_heartbeat_skips_a_row_another_transaction_holds_and_says_it_is_busy(
    make_queue, admin, dsn
) -> None:
    queue = await make_queue()
    held_id = await queue.enqueue("Held", {})
    free_id = await queue.enqueue("Free", {})
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now(), "
        "updated_at = now() - interval '1 minute'"
    )
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM axa_queue WHERE id = %s FOR UPDATE", (held_id,))
        said = beat(admin, (held_id, 1), (free_id, 1))
        assert said == {str(held_id): "busy", str(free_id): "beaten"}
        stamps = dict(
            admin.execute(
                "SELECT id::text, updated_at > now() - interval '30 seconds' FROM axa_queue"
            ).fetchall()
        )
        assert stamps == {str(held_id): False, str(free_id): True}  # the busy one is not stamped
        # What the holder makes of the row, the next heartbeat finds.
        holder.execute(
            "UPDATE axa_queue SET status = 'queued', started_at = NULL WHERE id = %s", (held_id,)
        )
        assert beat(admin, (held_id, 1)) == {str(held_id): "busy"}
        holder.commit()
    assert beat(admin, (held_id, 1)) == {}, "recovered meanwhile: lost"


async def test_a_heartbeat_finds_a_cancel_it_skipped_at_the_next_beat(
    make_queue, admin, dsn
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Cancelled", {})
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now(), "
        "updated_at = now()"
    )
    with psycopg.connect(dsn) as person:
        person.execute(
            "UPDATE axa_queue SET status = 'cancelled', updated_at = now() WHERE id = %s",
            (job_id,),
        )
        assert beat(admin, (job_id, 1)) == {str(job_id): "busy"}
        person.commit()
    assert beat(admin, (job_id, 1)) == {str(job_id): "cancelled"}


HOLD = [
    "SELECT 1 FROM axa_queue WHERE id = %s FOR UPDATE",  # as a person's CANCEL, MARK_LOST
    "SELECT 1 FROM axa_queue WHERE id = %s FOR NO KEY UPDATE",  # as an UPDATE: the exchange
]
"""Ways another transaction holds a running row."""


@pytest.mark.parametrize("lock", HOLD)
async def test_a_run_whose_row_another_transaction_holds_across_heartbeats_is_not_lost(
    make_queue, admin, dsn, lock: str
) -> None:
    queue = await make_queue(workers=2, heartbeat_interval=0.05, stale_after=30)
    handler = Blocking()
    other = Blocking()
    queue.handle("Held", handler)
    queue.handle("Other", other)
    held_id = await queue.enqueue("Held", {})
    other_id = await queue.enqueue("Other", {})
    async with running(queue):
        await asyncio.wait_for(handler.started.wait(), 15)
        await asyncio.wait_for(other.started.wait(), 15)
        with psycopg.connect(dsn) as holder:
            holder.execute(lock, (held_id,))
            # Two heartbeats went through while the row was held: the other run's row
            # was stamped twice.
            for _ in range(2):
                before = stamp(admin, other_id)
                await eventually(lambda before=before: stamp(admin, other_id) > before)
            assert lock_waits(admin, "beats AS") == 0
            assert not handler.cancelled.is_set()
        handler.release.set()
        other.release.set()
        await eventually(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM axa_queue WHERE status = 'completed' AND attempts = 1"
                ).fetchone()
                == (2,)
            )
        )
    assert handler.calls == 1


def stamp(admin: psycopg.Connection[Any], job_id: UUID) -> datetime:
    row = admin.execute("SELECT updated_at FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    stamped: datetime = row[0]
    return stamped


async def test_a_run_claimed_ahead_whose_proof_finds_its_row_busy_starts_once_it_is_free(
    make_queue, admin, dsn
) -> None:
    # One loop, one job claimed ahead; the worker's clock moves past half of stale_after
    # (as when its event loop is blocked), so the run proves its claim before it starts.
    queue = await make_queue(workers=1, prefetch=1, heartbeat_interval=30, stale_after=60)
    queue.connector.monotonic = clock = MovedClock()
    first = Blocking()
    second = Blocking()
    queue.handle("First", first)
    queue.handle("Second", second)
    await queue.enqueue("First", {}, priority=1)
    second_id = await queue.enqueue("Second", {})
    async with running(queue):
        await asyncio.wait_for(first.started.wait(), 15)
        await eventually(lambda: status_of(admin, second_id) == ("running", None, 1))
        with psycopg.connect(dsn) as holder:
            holder.execute(HOLD[0], (second_id,))
            clock.move(31)
            first.release.set()
            # The proof was answered (busy), not left waiting for the row.
            await eventually(lambda: proofs_answered(admin) > 0)
            assert second.calls == 0, "a handler started before its claim was proved"
        await asyncio.wait_for(second.started.wait(), 15)
        second.release.set()
        await eventually(lambda: status_of(admin, second_id) == ("completed", None, 1))
    assert second.calls == 1


def proofs_answered(admin: psycopg.Connection[Any]) -> int:
    """How many of this test's sessions sent `HEARTBEAT` last and are done with it."""
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%beats AS%%' "
        "AND state = 'idle' AND pid <> pg_backend_pid() "
        "AND application_name = current_setting('application_name')"
    ).fetchone()
    assert row is not None
    return int(row[0])
