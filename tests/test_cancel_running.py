"""Cancelling a running job: the act commits in the caller's transaction, the process
running it learns at once (or at its next heartbeat), its handler stops, and whatever
the run does afterwards is refused: the job stays `cancelled`."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import psycopg
from click.testing import CliRunner

import seed_crate as crate
from axa_queue import ActKind, JobState, acts_on, cancel, current_job, sql
from axa_queue.cli import main
from axa_queue.worker import decisions
from conftest import eventually, running, status_of

SLOW_BEAT = dict(heartbeat_interval=30, stale_after=60)
"""No heartbeat during the test: what stops the run is the notification."""


async def listening(admin: psycopg.Connection[Any]) -> None:
    """Wait until this test's worker listens for cancels (a worker that has just
    started may claim a job before its notification connection is up)."""

    def up() -> bool:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s "
            "AND application_name = current_setting('application_name')",
            (sql.LISTEN,),  # sent after `LISTEN_CANCEL`
        ).fetchone()
        return row is not None and row[0] > 0

    await eventually(up)


def result_of(admin: psycopg.Connection[Any], job_id: Any) -> Any:
    row = admin.execute("SELECT result FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]


async def test_cancelling_a_running_async_job_cancels_its_handler_at_once_and_it_stays_cancelled(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue(**SLOW_BEAT)
    started, seen = asyncio.Event(), asyncio.Event()
    outcomes: list[str] = []
    queue.observe(lambda name, outcome, seconds: outcomes.append(outcome))

    @queue.handler("Long")
    async def long(args: Any) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.set()
            raise

    job_id = await queue.enqueue("Long", {})
    caplog.set_level("INFO", logger="axa_queue.worker")
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        await listening(admin)
        async with queue.connection() as conn:
            result = await cancel(conn, job_id, "ops:alice", "customer_asked")
        assert result and result.kind is ActKind.CANCELLED and result.found is JobState.RUNNING
        await asyncio.wait_for(seen.wait(), 15)  # the heartbeat is 30 s away
        await eventually(lambda: outcomes == ["cancelled"])
    assert status_of(admin, job_id) == ("cancelled", None, 1)
    [act] = await queue.acts(job_id)
    assert (act.kind, act.attempts, act.by, act.reason) == (
        ActKind.CANCELLED,
        1,
        "ops:alice",
        "customer_asked",
    )
    assert any("cancelled by a person" in r.getMessage() for r in caplog.records)
    assert not any("review" in r.getMessage() for r in caplog.records)


async def test_a_sync_handler_sees_current_job_cancelled_and_what_it_returns_is_not_recorded(
    make_queue, admin
) -> None:
    queue = await make_queue(**SLOW_BEAT)
    started, stopped = threading.Event(), threading.Event()
    flags: list[bool] = []

    @queue.handler("Crunch")
    def crunch(args: Any) -> str:
        job = current_job()
        flags.append(job.cancelled)
        started.set()
        while not job.cancelled:  # a long handler polling its flag between steps
            stopped.wait(0.01)
        flags.append(job.cancelled)
        stopped.set()
        return "finished anyway"

    job_id = await queue.enqueue("Crunch", {})
    async with running(queue):
        await asyncio.to_thread(started.wait, 15)
        await listening(admin)
        async with queue.connection() as conn:
            assert await cancel(conn, job_id, "ops:alice", "stop")
        assert await asyncio.to_thread(stopped.wait, 15)
    assert flags == [False, True]
    assert status_of(admin, job_id) == ("cancelled", None, 1)
    assert result_of(admin, job_id) is None


class Said(logging.Handler):
    """Sets `event` once the worker logs a message starting with `start`."""

    def __init__(self, start: str) -> None:
        super().__init__(logging.DEBUG)
        self.start = start
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.start):
            self.event.set()


async def test_a_stop_waits_for_a_cancelled_sync_handler_so_its_cleanup_is_done_when_run_returns(
    make_queue, admin
) -> None:
    queue = await make_queue(**SLOW_BEAT)
    started = threading.Event()
    order: list[str] = []
    outcomes: list[str] = []
    queue.observe(lambda name, outcome, seconds: outcomes.append(outcome))
    job_id = await queue.enqueue("Export", {})
    # The cleanup goes on only once the stop says it waits for it: without the wait,
    # run() would return first.
    waiting = Said(f"stopping: waiting for the sync handler of job Export {job_id} (attempt 1)")

    @queue.handler("Export")
    def export(args: Any) -> str:
        job = current_job()
        started.set()
        while not job.cancelled:  # a long handler polling its flag between steps
            waiting.event.wait(0.01)
        told = waiting.event.wait(15)
        order.append(f"cleaned up (after the stop said it waits: {told})")
        return "partial"

    worker_log = logging.getLogger("axa_queue.worker")
    worker_log.addHandler(waiting)
    previous = worker_log.level
    worker_log.setLevel(logging.INFO)
    stop = asyncio.Event()
    worker = asyncio.create_task(queue.run(stop))
    try:
        assert await asyncio.to_thread(started.wait, 15)
        await listening(admin)
        async with queue.connection() as conn:
            assert await cancel(conn, job_id, "ops:alice", "stop")
        await eventually(lambda: outcomes == ["cancelled"])  # the run is over, not its thread
        stop.set()
        await asyncio.wait_for(worker, 30)
        order.append("run() returned")
    finally:
        worker_log.removeHandler(waiting)
        worker_log.setLevel(previous)
        waiting.event.set()
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
    assert order == ["cleaned up (after the stop said it waits: True)", "run() returned"]
    assert status_of(admin, job_id) == ("cancelled", None, 1)
    assert result_of(admin, job_id) is None


async def test_a_cancelled_sync_handler_still_running_after_the_grace_is_logged_by_name_and_id(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue(shutdown_grace=0.2, **SLOW_BEAT)
    started, release = threading.Event(), threading.Event()
    outcomes: list[str] = []
    queue.observe(lambda name, outcome, seconds: outcomes.append(outcome))

    @queue.handler("Stuck")
    def stuck(args: Any) -> None:
        started.set()
        release.wait(30)  # never looks at current_job().cancelled

    job_id = await queue.enqueue("Stuck", {})
    caplog.set_level(logging.INFO, logger="axa_queue.worker")
    try:
        async with running(queue):
            assert await asyncio.to_thread(started.wait, 15)
            await listening(admin)
            async with queue.connection() as conn:
                assert await cancel(conn, job_id, "ops:alice", "stop")
            await eventually(lambda: outcomes == ["cancelled"])
        left = [r for r in caplog.records if r.getMessage().startswith("stopped without")]
    finally:
        release.set()
    assert [r.getMessage() for r in left] == [
        f"stopped without the sync handler of job Stuck {job_id} (attempt 1), still running "
        "in its thread (a thread cannot be interrupted; it ends when the handler returns, or "
        "with the process)"
    ]
    assert (left[0].job_id, left[0].job, left[0].attempt) == (str(job_id), "Stuck", 1)
    assert left[0].levelno == logging.WARNING


async def test_a_cancel_rolled_back_with_the_callers_transaction_leaves_the_run_going_to_its_end(
    make_queue, admin, dsn
) -> None:
    queue = await make_queue(**SLOW_BEAT)
    started, release = asyncio.Event(), asyncio.Event()
    cancelled: list[bool] = []

    @queue.handler("Long")
    async def long(args: Any) -> str:
        started.set()
        await release.wait()
        cancelled.append(current_job().cancelled)
        return "done"

    job_id = await queue.enqueue("Long", {})
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            assert await cancel(conn, job_id, "ops:alice", "changed_my_mind")
            await conn.rollback()
        release.set()
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert cancelled == [False]
    assert result_of(admin, job_id) == "done"
    assert await queue.acts(job_id) == []


async def test_without_notifications_the_heartbeat_stops_a_cancelled_run(make_queue, admin) -> None:
    queue = await make_queue(listen=False, heartbeat_interval=0.1)
    started, seen = asyncio.Event(), asyncio.Event()

    @queue.handler("Long")
    async def long(args: Any) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.set()
            raise

    job_id = await queue.enqueue("Long", {})
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        async with queue.connection() as conn:
            assert await cancel(conn, job_id, "ops:alice", "stop")
        await asyncio.wait_for(seen.wait(), 15)
    assert status_of(admin, job_id) == ("cancelled", None, 1)


async def test_a_run_that_swallows_the_cancellation_and_returns_has_nothing_recorded(
    make_queue, admin
) -> None:
    queue = await make_queue(**SLOW_BEAT)
    started, seen = asyncio.Event(), asyncio.Event()
    outcomes: list[str] = []
    queue.observe(lambda name, outcome, seconds: outcomes.append(outcome))

    @queue.handler("Stubborn")
    async def stubborn(args: Any) -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.set()
        return "kept going"

    job_id = await queue.enqueue("Stubborn", {})
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        await listening(admin)
        async with queue.connection() as conn:
            assert await cancel(conn, job_id, "ops:alice", "stop")
        await asyncio.wait_for(seen.wait(), 15)
        await eventually(lambda: outcomes == ["cancelled"])
    assert status_of(admin, job_id) == ("cancelled", None, 1)
    assert result_of(admin, job_id) is None


async def test_a_cancel_committed_after_the_handler_ended_has_its_ending_refused(
    make_queue, admin
) -> None:
    """The ending waits in the exchange while the cancel holds the row; once the cancel
    commits, the fence refuses it and the lost-claim path leaves the job cancelled."""
    queue = await make_queue(**SLOW_BEAT)
    outcomes: list[str] = []
    queue.observe(lambda name, outcome, seconds: outcomes.append(outcome))
    started, release = asyncio.Event(), asyncio.Event()

    @queue.handler("Quick")
    async def quick(args: Any) -> str:
        started.set()
        await release.wait()
        return "done"

    job_id = await queue.enqueue("Quick", {})
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        holder = psycopg.connect(admin.info.dsn)
        try:
            assert cancel(holder, job_id, "ops:alice", "late")  # row locked, not committed
            release.set()  # the run ends; its ending waits for the row lock
            await eventually(lambda: locked_out(admin) > 0)
            holder.commit()
        finally:
            holder.close()
        await eventually(lambda: outcomes == ["cancelled"])
    assert status_of(admin, job_id) == ("cancelled", None, 1)
    assert result_of(admin, job_id) is None


def locked_out(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND pid <> pg_backend_pid() AND application_name = current_setting('application_name')"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_fate_of_a_run_whose_job_was_cancelled_under_its_attempt_is_not_a_review_case() -> None:
    level, message = decisions.fate(
        started=True,
        attempts=2,
        ending="completed",
        status="cancelled",
        found_attempts=2,
        became=None,
    )
    assert level == logging.INFO and "cancelled" in message and "review" not in message


async def test_a_crate_worker_runs_a_job_we_cancelled_to_its_end_and_its_ending_is_refused(
    make_queue, admin
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Report", {"id": 1})
    [claimed] = admin.execute(crate.CLAIM, crate.params(["Report"])).fetchall()
    assert claimed[0] == job_id
    async with queue.connection() as conn:
        result = await cancel(conn, job_id, "ops:alice", "customer_asked")
    assert result and result.found is JobState.RUNNING
    assert admin.execute(crate.HEARTBEAT, crate.params(job_id, 1)).rowcount == 0
    assert admin.execute(crate.FINISH, crate.params(job_id, 1, "completed", None)).rowcount == 0
    assert admin.execute(crate.RETRY, crate.params(job_id, 1, "boom", 1.0)).rowcount == 0
    assert admin.execute(crate.MARK_LOST, crate.params(job_id, "lost")).rowcount == 0
    assert status_of(admin, job_id) == ("cancelled", None, 1)
    assert [a.kind for a in acts_on(admin, job_id)] == [ActKind.CANCELLED]


async def test_the_cli_cancels_a_running_job_and_says_its_process_was_told(
    make_queue, admin, dsn
) -> None:
    queue = await make_queue(**SLOW_BEAT)
    started, seen = asyncio.Event(), asyncio.Event()

    @queue.handler("Long")
    async def long(args: Any) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.set()
            raise

    job_id = await queue.enqueue("Long", {})
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    args = ["cancel", str(job_id), "--by", "alice", "--reason", "T-1"]
    async with running(queue):
        await asyncio.wait_for(started.wait(), 15)
        await listening(admin)
        done = await asyncio.to_thread(runner.invoke, main, args, prog_name="axa-queue")
        assert done.exit_code == 0, done.output
        assert f"cancelled job {job_id}; the process running it was told" in done.stdout
        await asyncio.wait_for(seen.wait(), 15)
    assert status_of(admin, job_id) == ("cancelled", None, 1)
