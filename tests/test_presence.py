"""Worker processes record themselves in `axa_workers`: a row at start, refreshed with
the heartbeat, deleted at a clean stop, shown as gone once silent for three heartbeat
intervals, and removed by housekeeping long after a process died; `axa-queue workers`
lists them. The job names no live process handles, with jobs waiting past
`unhandled_after`, are warned about (the worker's log, `counts`)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import sys
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from axa_queue import maintenance
from axa_queue.cli import main
from axa_queue.cli.jobs import NAMES_SAID
from axa_queue.db.calls import run_async
from axa_queue.presence import (
    GONE_AFTER_BEATS,
    Unhandled,
    handled_names,
    unhandled_call,
    workers_call,
    workers_on,
)
from axa_queue.worker.housekeeping import Housekeeping
from conftest import eventually, later, running

WORKER = """
import asyncio, sys
from axa_queue import Queue, QueueOptions

async def main():
    queue = Queue(sys.argv[1], QueueOptions(heartbeat_interval=0.2, poll_interval=0.05))
    queue.handle("Beat", lambda args: None)
    async with queue:
        await queue.run()

asyncio.run(main())
"""
"""A worker process with a short heartbeat (and the default stale_after, an hour)."""


def _worker_row(
    admin: psycopg.Connection[Any], names: list[str], ago: str, beat_ms: int | None
) -> uuid.UUID:
    """Insert a worker process's row last heard from `ago` (an interval)."""
    one = uuid.uuid4()
    admin.execute(
        "INSERT INTO axa_workers (id, host, pid, names, loops, version, seen_at, beat_ms) "
        "VALUES (%s, 'h', 1, %s, 1, 'x', now() - %s::interval, %s)",
        (one, names, ago, beat_ms),
    )
    return one


def _waiting(admin: psycopg.Connection[Any], name: str, ago: str, count: int = 1) -> None:
    """Queue `count` jobs of `name`, due since `ago` (an interval)."""
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, run_at) SELECT gen_random_uuid(), %s, "
        "'{}'::jsonb, now() - %s::interval - g * interval '1 ms' FROM generate_series(1, %s) g",
        (name, ago, count),
    )


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
    assert row["state"] == "live"
    # Gone: its last report (2) is stale; the table says which jobs it left running.
    admin.execute("UPDATE axa_workers SET seen_at = now() - interval '2 hours'")
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, status, attempts, started_at, run_worker, "
        "run_attempt) SELECT gen_random_uuid(), 'Report', '{}', 'running', 1, now(), id, 1 "
        "FROM axa_workers"
    )
    [row] = json.loads(runner.invoke(main, ["workers", "--json"]).output)
    assert (row["state"], row["running"], row["holding"]) == ("gone", 2, 1)
    [line] = [one for one in runner.invoke(main, ["workers"]).output.splitlines() if "web-1" in one]
    assert line.split()[4:6] == ["8", "1"] and "gone" in line, line  # LOOPS, RUNNING
    admin.execute("DELETE FROM axa_workers")
    assert "no worker processes" in runner.invoke(main, ["workers"]).output


async def test_a_worker_process_killed_is_shown_gone_within_three_heartbeats(
    dsn, make_queue, admin
) -> None:
    queue = await make_queue()
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", WORKER, dsn)
    try:

        async def listed() -> list[Any]:
            async with queue.connection() as conn:
                return [w for w in await workers_on(conn) if w.pid == process.pid]

        await eventually(lambda: _listed_once(listed))
        stale = queue.options.stale_after.total_seconds()
        [info] = await listed()
        assert info.beat == pytest.approx(0.2) and info.state(stale) == "live"
        process.send_signal(signal.SIGKILL)  # no clean stop: the row stays
        assert await asyncio.wait_for(process.wait(), 15) == -signal.SIGKILL

        async def gone() -> bool:
            return [w.state(stale) for w in await listed()] == ["gone"]

        await eventually(gone)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    # Judged on the database's clock from its last heartbeat: live until three beats
    # have passed (though stale_after is an hour), gone from then on.
    [dead] = await listed()
    last = admin.execute("SELECT seen_at FROM axa_workers WHERE pid = %s", (process.pid,))
    [(seen_at,)] = last.fetchall()
    async with queue.connection() as conn:
        for beats, state in ((GONE_AFTER_BEATS - 0.5, "live"), (GONE_AFTER_BEATS + 0.1, "gone")):
            at = seen_at + timedelta(seconds=beats * 0.2)
            [moved] = [w for w in await run_async(conn, workers_call(at)) if w.id == dead.id]
            assert moved.state(stale) == state, beats
    assert stale < 3600 and dead.gone_after(stale) == pytest.approx(0.6)


async def _listed_once(listed: Any) -> bool:
    return len(await listed()) == 1


def test_a_row_without_a_heartbeat_interval_is_judged_by_stale_after(dsn, admin) -> None:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    assert runner.invoke(main, ["setup"]).exit_code == 0
    _worker_row(admin, ["Old"], "10 minutes", None)  # an older version's row
    _worker_row(admin, ["Killed"], "10 seconds", 1000)
    _worker_row(admin, ["Fine"], "1 second", 1000)
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = {w.names[0]: w for w in workers_on(conn)}
    assert {name: w.state(3600) for name, w in found.items()} == {
        "Old": "live",
        "Killed": "gone",
        "Fine": "live",
    }
    assert found["Old"].state(300) == "gone"
    assert handled_names(found.values(), 3600) == {"Old", "Fine"}
    table = runner.invoke(main, ["workers"])
    assert table.exit_code == 0, table.output
    assert "STATE" in table.output and table.output.count("gone") == 1


def test_jobs_waiting_past_the_threshold_under_a_name_no_live_worker_handles_are_unhandled(
    dsn, admin
) -> None:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    assert runner.invoke(main, ["setup"]).exit_code == 0
    _worker_row(admin, ["Known"], "1 second", 60_000)
    _worker_row(admin, ["Knwon2"], "10 minutes", 1000)  # gone: it handles nothing now
    _waiting(admin, "Known", "20 minutes", 3)  # handled, however long it waits
    _waiting(admin, "Knwon2", "20 minutes", 2)
    _waiting(admin, "Knwon2", "1 minute")  # not waiting long enough to count
    _waiting(admin, "Fresh", "1 minute")  # nobody handles it, but not for long yet
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, status, run_at) VALUES "
        "(gen_random_uuid(), 'Done', '{}', 'completed', now() - interval '1 day')"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        workers = workers_on(conn)
        handled = handled_names(workers, 3600)
        assert handled == {"Known"}
        [found] = run_sync_call(conn, unhandled_call(handled, 600))
        assert (found.name, found.jobs) == ("Knwon2", 2) and found.oldest >= 1200
        assert [u.name for u in run_sync_call(conn, unhandled_call(handled, 0))] == [
            "Fresh",
            "Knwon2",
        ]
        assert run_sync_call(conn, unhandled_call({"Known", "Knwon2", "Fresh"}, 0)) == []

    shown = runner.invoke(main, ["counts", "--by-name"])
    assert shown.exit_code == 0, shown.output
    assert "HANDLED" in shown.output
    rows = {line.split()[0]: line.split()[-1] for line in shown.output.splitlines()[1:5]}
    assert rows == {"Done": "no", "Fresh": "no", "Known": "yes", "Knwon2": "no"}
    assert "warning: Knwon2 has 2 jobs waiting for more than 10.0 min" in shown.output
    assert "Fresh has" not in shown.output
    as_json = json.loads(runner.invoke(main, ["counts", "--by-name", "--json"]).output)
    assert as_json["Knwon2"]["handled"] is False and as_json["Knwon2"]["unhandled_jobs"] == 2
    assert as_json["Known"]["handled"] is True and as_json["Known"]["ready"] == 3
    totals = runner.invoke(main, ["counts"])
    assert "warning: Knwon2 has 2 jobs" in totals.output


def test_counts_names_the_first_twenty_paused_and_unhandled_names_and_counts_the_rest(
    dsn, admin
) -> None:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    assert runner.invoke(main, ["setup"]).exit_code == 0
    for n in range(25):  # 25 names nobody handles, the last ones with the most jobs
        _waiting(admin, f"Lost{n:02}", "20 minutes", 1 + n)
    for n in range(30):
        assert (
            runner.invoke(
                main, ["pause", f"Held{n:02}", "--by", "ops:a", "--reason", "R"]
            ).exit_code
            == 0
        )
    lines = runner.invoke(main, ["counts"]).output.splitlines()
    [paused] = [line for line in lines if line.startswith("paused")]
    assert paused.count("Held") == NAMES_SAID and "Held19" in paused and "Held20" not in paused
    assert paused.endswith("and 10 more (axa-queue paused lists them)")
    warned = [line for line in lines if line.startswith("warning: Lost")]
    # The names with the most jobs waiting first, each on its line; the rest in one.
    assert len(warned) == NAMES_SAID and warned[0].startswith("warning: Lost24 has 25 jobs")
    assert "warning: 5 more names have jobs waiting for more than 10.0 min" in lines[-1]
    assert "(15 jobs;" in lines[-1]  # Lost00 to Lost04: 1 + 2 + 3 + 4 + 5
    as_json = json.loads(runner.invoke(main, ["counts", "--by-name", "--json"]).output)
    assert sum(1 for one in as_json.values() if one["unhandled_jobs"]) == 25


def run_sync_call(conn: psycopg.Connection[Any], call: Any) -> list[Unhandled]:
    from axa_queue.db.calls import run_sync

    found: list[Unhandled] = run_sync(conn, call)
    return found


def test_the_unhandled_names_are_found_without_reading_the_handled_backlog(dsn, admin) -> None:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    assert runner.invoke(main, ["setup"]).exit_code == 0
    _waiting(admin, "Busy", "1 hour", 50_000)
    _waiting(admin, "Knwon2", "1 hour", 3)
    admin.execute("ANALYZE axa_queue")
    call = unhandled_call({"Busy"}, 600)
    plan = "\n".join(
        row[0]
        for row in admin.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + call.query, call.params
        ).fetchall()
    )
    assert "axa_queue_pick" in plan and "Seq Scan" not in plan, plan
    # Never every name's jobs in claim order, other names' filtered out (a plan the
    # statistics chose now and then before the count's order began with the name).
    assert "axa_queue_claim" not in plan, plan
    top = next(line for line in plan.splitlines() if "Buffers:" in line)  # the whole plan's
    touched = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top))
    pages = admin.execute(
        "SELECT relpages FROM pg_class WHERE oid = 'axa_queue_pick'::regclass"
    ).fetchone()
    # A few probes per name, where counting the handled name's backlog reads its index.
    assert pages is not None and 0 < touched < pages[0] / 4, (pages, plan)


async def test_each_worker_warns_once_per_name_nobody_handles_until_it_is_handled_again(
    make_queue, admin, caplog
) -> None:
    rounds = {"n": 0}
    warn = Housekeeping.warn_unhandled

    async def counted(self: Housekeeping) -> Any:
        found = await warn(self)
        rounds["n"] += 1
        return found

    queue = await make_queue(unhandled_after=60, maintenance_interval=0.05)
    queue.handle("Known", lambda args: None)
    _waiting(admin, "Knwon2", "5 minutes", 2)
    _waiting(admin, "Knwon3", "10 seconds")  # under the threshold
    _waiting(admin, "Known", "5 minutes", 50)  # its own: never warned of, row written or not
    caplog.set_level(logging.WARNING, logger="axa_queue.worker")

    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "jobs", None) is not None]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Housekeeping, "warn_unhandled", counted)
        async with running(queue):
            await eventually(lambda: rounds["n"] >= 3)
            [line] = warnings()
            assert line.job == "Knwon2" and line.jobs == 2  # type: ignore[attr-defined]
            assert "'Knwon2'" in line.getMessage() and "no live worker" in line.getMessage()
            helper = _worker_row(admin, ["Knwon2"], "0 seconds", 3_600_000)
            seen = rounds["n"]
            await eventually(lambda: rounds["n"] >= seen + 2)
            assert len(warnings()) == 1
            admin.execute("DELETE FROM axa_workers WHERE id = %s", (helper,))
            await eventually(lambda: len(warnings()) == 2)
            seen = rounds["n"]
            await eventually(lambda: rounds["n"] >= seen + 2)
            assert len(warnings()) == 2


def test_a_failed_heartbeat_presence_write_or_give_back_is_tried_again_within_seconds() -> None:
    from axa_queue.worker.tasks import BEAT_RETRY_MAX, beat_retry

    waits: list[float] = []
    retry: float | None = None
    for _ in range(6):
        retry = beat_retry(retry, 60.0)
        waits.append(retry)
    assert waits == [0.5, 1.0, 2.0, 4.0, BEAT_RETRY_MAX, BEAT_RETRY_MAX]
    assert beat_retry(None, 0.1) == beat_retry(0.1, 0.1) == 0.1  # never past the interval


async def test_a_process_whose_presence_writes_failed_is_recorded_again_long_before_its_next_beat(
    make_queue, admin, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from axa_queue import sql
    from axa_queue.worker.connections import Connections

    queue = await make_queue(heartbeat_interval=60, stale_after=300)  # next beat: a minute
    tries = 0
    third = asyncio.Event()
    real_on_side = Connections.on_side

    async def on_side(self: Connections, statement: str, params: Any) -> list[Any]:
        nonlocal tries
        if statement == sql.WORKER_SEEN:
            tries += 1
            if tries <= 2:  # an outage, for two tries
                raise psycopg.OperationalError("the server is down")
            third.set()
        return await real_on_side(self, statement, params)

    monkeypatch.setattr(Connections, "on_side", on_side)
    with caplog.at_level(logging.INFO, logger="axa_queue.worker"):
        async with running(queue):
            await asyncio.wait_for(third.wait(), 30)  # a guard: the retries are seconds apart
            await eventually(
                lambda: admin.execute("SELECT count(*) FROM axa_workers").fetchone()[0] == 1
            )
    said = [r.getMessage() for r in caplog.records if "axa_workers" in r.getMessage()]
    assert sum(line.startswith("could not record this worker process") for line in said) == 1
    assert (
        sum(line.startswith("recorded this worker process in axa_workers again") for line in said)
        == 1
    )
