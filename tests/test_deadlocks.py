"""Row locks: a worker's statements never wait on each other in a cycle, so PostgreSQL
never aborts one of them with `deadlock detected` (each costs `deadlock_timeout`)."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

from axa_queue import NewJob
from conftest import eventually, running

JOBS = 100_000
"""Short no-op jobs queued at once: thousands stay queued while the worker runs, so every
exchange claims a full batch ahead and the heartbeat has many runs to beat."""


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
