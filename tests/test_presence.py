"""Worker processes record themselves in `axa_workers`: a row at start, refreshed with
the heartbeat, deleted at a clean stop, and removed by housekeeping long after a
process died; `axa-queue workers` lists them."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from typing import Any

import psycopg
from click.testing import CliRunner

from axa_queue import maintenance
from axa_queue.cli import main
from axa_queue.presence import workers_on
from conftest import eventually, later, running


def _rows(admin: psycopg.Connection[Any]) -> list[Any]:
    return admin.execute("SELECT host, pid, names, loops, running FROM axa_workers").fetchall()


async def test_a_running_worker_has_a_row_with_its_names_loops_and_jobs_in_progress(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=3)
    started = asyncio.Event()
    release = asyncio.Event()

    @queue.handler("Slow")
    async def slow(args: Any) -> None:
        started.set()
        await release.wait()

    queue.handle("Other", lambda args: None)
    await queue.enqueue("Slow", {})
    async with running(queue):
        await started.wait()
        await eventually(lambda: [r[4] for r in _rows(admin)] == [1])
        [(host, pid, names, loops, _)] = _rows(admin)
        assert (host, pid, names, loops) == (
            socket.gethostname(),
            os.getpid(),
            ["Other", "Slow"],
            3,
        )
        async with queue.connection() as conn:
            [info] = await workers_on(conn)
        assert info.live(queue.options.stale_after.total_seconds()) and info.running == 1
        release.set()
        await eventually(lambda: [r[4] for r in _rows(admin)] == [0])
    assert _rows(admin) == []  # a clean stop removes it


async def test_the_heartbeat_brings_back_a_row_removed_while_the_worker_ran(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.handle("J", lambda args: None)
    async with running(queue):
        await eventually(lambda: len(_rows(admin)) == 1)
        admin.execute("DELETE FROM axa_workers")
        await eventually(lambda: len(_rows(admin)) == 1)


async def test_housekeeping_removes_the_rows_of_processes_silent_for_an_hour(
    make_queue, admin
) -> None:
    queue = await make_queue()
    dead, recent = uuid.uuid4(), uuid.uuid4()
    for one, ago in ((dead, "2 hours"), (recent, "10 minutes")):
        admin.execute(
            "INSERT INTO axa_workers (id, host, pid, names, loops, version, seen_at) "
            "VALUES (%s, 'h', 1, '{}', 1, 'x', now() - %s::interval)",
            (one, ago),
        )
    async with queue.connection() as conn:
        assert await maintenance.forget_workers(conn) == 1
        assert await maintenance.forget_workers(conn, now=later(admin, 3600)) == 1
    assert _rows(admin) == []


def test_the_workers_command_lists_processes_as_a_table_and_as_json(dsn, admin) -> None:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    assert runner.invoke(main, ["setup"]).exit_code == 0
    admin.execute(
        "INSERT INTO axa_workers (id, host, pid, names, loops, running, version) "
        "VALUES (%s, 'web-1', 4242, '{Report,Mail}', 8, 2, '0.1.0')",
        (uuid.uuid4(),),
    )
    table = runner.invoke(main, ["workers"])
    assert table.exit_code == 0, table.output
    assert "web-1" in table.output and "4242" in table.output and "Report, Mail" in table.output
    found = runner.invoke(main, ["workers", "--json"])
    [row] = json.loads(found.output)
    assert row["host"] == "web-1" and row["names"] == ["Report", "Mail"] and row["running"] == 2
    admin.execute("DELETE FROM axa_workers")
    assert "no worker processes" in runner.invoke(main, ["workers"]).output
