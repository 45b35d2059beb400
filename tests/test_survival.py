"""A worker outlives what its background services raise, a handler's own
`CancelledError` is a failure like any other, and one signal always stops a worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from axa_queue import NewJob, Schedule, maintenance
from axa_queue.metrics import HealthCheck
from axa_queue.schedules import schedule as schedules
from conftest import eventually, running, status_of

SECRET = "hunter2-never-logged"


def fail_one_schedule(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make the schedule `name` raise as an unstorable argument would (a TypeError
    naming the job, never the value), whatever validation registration does."""
    real = schedules.tick_one

    async def tick_one(
        conn: psycopg.AsyncConnection[Any], schedule: Schedule, now: Any = None, found: Any = None
    ) -> Any:
        if schedule.name == name:
            raise TypeError(f"the arguments of job {schedule.job.name!r} cannot be queued")
        return await real(conn, schedule, now, found)

    monkeypatch.setattr(schedules, "tick_one", tick_one)


async def health(queue: Any, stuck_after: float) -> tuple[bool, str]:
    check = HealthCheck(queue, asyncio.get_running_loop(), stuck_after=stuck_after)
    return await asyncio.to_thread(check)


async def test_a_schedule_that_raises_is_logged_without_its_arguments_and_jobs_keep_running(
    make_queue, admin, monkeypatch, caplog
) -> None:
    queue = await make_queue()
    ran: list[Any] = []
    queue.handle("Report", ran.append)
    queue.schedule(Schedule.every("broken", 3600, NewJob("Report", {"token": SECRET})))
    queue.schedule(Schedule.every("fine", 3600, NewJob("Report", {"n": 1})))
    fail_one_schedule(monkeypatch, "broken")
    with caplog.at_level(logging.INFO, logger="axa_queue"):
        async with running(queue):
            await eventually(lambda: ran == [{"n": 1}])  # the other schedule still ticks
            job_id = await queue.enqueue("Report", {"n": 2})
            await eventually(lambda: status_of(admin, job_id)[0] == "completed")
            await eventually(lambda: queue.worker is not None)
            await eventually(lambda: queue.worker.trouble(0.2) is not None)
            ok, why = await health(queue, stuck_after=0.2)
            assert not ok
            assert why.startswith("schedules failing for ")
            assert "schedule 'broken': TypeError: the arguments of job 'Report'" in why
            assert queue.worker.stuck_for() > 0  # the gauge a supervisor's /health reads
    failures = [r for r in caplog.records if r.getMessage().startswith("a schedule could not")]
    assert len(failures) == 1, "logged once, not every poll"
    assert failures[0].__dict__["schedule"] == "broken"
    assert failures[0].__dict__["error"].startswith("TypeError: ")
    assert SECRET not in caplog.text


async def test_tick_schedules_ticks_every_other_schedule_before_raising_what_one_raised(
    make_queue, admin, monkeypatch
) -> None:
    queue = await make_queue()
    queue.schedule(Schedule.every("broken", 3600, NewJob("Report", {})))
    queue.schedule(Schedule.every("fine", 3600, NewJob("Report", {"n": 1})))
    fail_one_schedule(monkeypatch, "broken")
    with pytest.raises(TypeError, match="cannot be queued"):
        await queue.tick_schedules()
    rows = admin.execute("SELECT args FROM axa_queue WHERE name = 'Report'").fetchall()
    assert rows == [({"n": 1},)]


async def test_housekeeping_that_raises_anything_is_reported_and_tried_again(
    make_queue, admin, monkeypatch
) -> None:
    queue = await make_queue(maintenance_interval=0.1)
    passes: list[int] = []
    real = maintenance.run_once

    async def run_once(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        if len(passes) < 4:
            raise RuntimeError("housekeeping broke")
        return await real(*args, **kwargs)

    monkeypatch.setattr(maintenance, "run_once", run_once)
    queue.handle("Report", lambda args: None)
    async with running(queue):
        await eventually(lambda: queue.worker is not None)
        await eventually(lambda: queue.worker.trouble(0.0) is not None)
        why = queue.worker.trouble(0.0)
        assert why is not None and why.startswith("maintenance failing for "), why
        assert "RuntimeError: housekeeping broke" in why
        job_id = await queue.enqueue("Report", {})
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
        await eventually(lambda: len(passes) >= 5)  # tried again, and it went through
        assert queue.worker.trouble(0.0) is None


async def test_a_listener_that_raises_anything_falls_back_to_polling_and_is_reported(
    make_queue, admin, monkeypatch
) -> None:
    queue = await make_queue()

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the listener broke")

    monkeypatch.setattr(psycopg.AsyncConnection, "notifies", broken)
    queue.handle("Report", lambda args: None)
    async with running(queue):
        await eventually(lambda: queue.worker is not None)
        await eventually(lambda: "listener failing" in (queue.worker.trouble(0.0) or ""))
        job_id = await queue.enqueue("Report", {})
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")


async def test_a_stop_ends_a_background_task_that_lost_its_first_cancellation(
    make_queue, monkeypatch
) -> None:
    # Python 3.10/3.11's asyncio.wait_for, inside psycopg_pool's wait for a connection,
    # drops a cancellation that arrives as the connection is handed over; the task then
    # goes on as if nothing happened. Here the housekeeping pass does the same.
    queue = await make_queue(shutdown_grace=1)
    inside = asyncio.Event()

    async def run_once(*args: Any, **kwargs: Any) -> None:
        try:
            inside.set()
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            pass  # lost
        await asyncio.sleep(600)

    monkeypatch.setattr(maintenance, "run_once", run_once)
    stop = asyncio.Event()
    task = asyncio.create_task(queue.run(stop))
    await asyncio.wait_for(inside.wait(), 30)
    stop.set()
    done, _ = await asyncio.wait({task}, timeout=30)  # a liveness bound, not a threshold
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=30)
    assert done, "the stop waited for a task that had lost its cancellation"
    await task


async def test_a_stop_ends_every_housekeeping_loop_and_its_transaction_before_run_returns(
    make_queue, admin, monkeypatch
) -> None:
    # A round in the middle of a transaction (as one making or dropping the history's
    # partitions is) when the stop comes, and slow to end (here it loses its first
    # cancellation, as psycopg_pool's wait may). The gather of the housekeeping loops
    # ended at the first loop's cancellation (the give-backs', asleep), and the stop went
    # on: this one kept running, its connection in a transaction, after run() and close()
    # had returned.
    queue = await make_queue(shutdown_grace=1)
    inside = asyncio.Event()
    ended = asyncio.Event()

    async def run_once(pool: Any, *args: Any, **kwargs: Any) -> None:
        try:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("SELECT 1")
                inside.set()
                with contextlib.suppress(asyncio.CancelledError):  # lost
                    await asyncio.sleep(600)
                await asyncio.sleep(600)
        finally:
            ended.set()

    monkeypatch.setattr(maintenance, "run_once", run_once)
    stop = asyncio.Event()
    task = asyncio.create_task(queue.run(stop))
    await asyncio.wait_for(inside.wait(), 30)
    stop.set()
    await asyncio.wait_for(task, 30)  # a liveness bound, not a threshold
    assert ended.is_set()  # the round ended before run() returned
    await queue.close()
    left = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = current_setting("
        "'application_name') AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%%'"
    ).fetchone()
    assert left == (0,)


# --- a handler's own CancelledError ----------------------------------------------------


async def test_an_async_handler_raising_cancelled_error_fails_its_attempt_and_is_retried(
    make_queue, admin, caplog
) -> None:
    queue = await make_queue(max_attempts=2)
    calls: list[int] = []

    @queue.handler("Flaky")
    async def flaky(args: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise asyncio.CancelledError()

    job_id = await queue.enqueue("Flaky", {})
    with caplog.at_level(logging.WARNING, logger="axa_queue"):
        async with running(queue):
            await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert status_of(admin, job_id) == ("completed", None, 2)
    retried = [r for r in caplog.records if r.getMessage().startswith("job failed, will retry:")]
    assert [r.__dict__["error"] for r in retried] == ["CancelledError raised by the handler"]


async def test_a_sync_handler_raising_cancelled_error_fails_its_last_attempt(
    make_queue, admin
) -> None:
    queue = await make_queue()

    @queue.handler("Doomed")
    def doomed(args: Any) -> None:
        raise asyncio.CancelledError()

    job_id = await queue.enqueue("Doomed", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "failed")
        other = await queue.enqueue("Doomed", {})  # the loop still works
        await eventually(lambda: status_of(admin, other)[0] == "failed")
    assert status_of(admin, job_id) == ("failed", "CancelledError raised by the handler", 1)


# --- one signal stops a worker ---------------------------------------------------------

WORKER_MODULE = """
import asyncio
import time

from axa_queue import NewJob, Queue, QueueOptions, Schedule
from axa_queue.schedules import schedule as schedules

queue = Queue(options=QueueOptions(
    poll_interval=0.05, heartbeat_interval=0.2, stale_after=5, shutdown_grace=2,
    maintenance_interval=0.05,
))

async def broken(conn, schedule, now=None):
    raise TypeError("the arguments of job 'Quick' cannot be queued")

schedules.tick_one = broken
queue.schedule(Schedule.every("broken", 1, NewJob("Quick", {})))

@queue.handler("Quick")
async def quick(args):
    pass

@queue.handler("Stuck")
async def stuck(args):
    await asyncio.sleep(600)

@queue.handler("StuckInThread")
def stuck_in_thread(args):
    time.sleep(600)
"""


def test_one_sigterm_stops_a_worker_within_its_grace_whatever_its_jobs_and_schedules_do(
    dsn: str, admin, tmp_path: Path
) -> None:
    module = f"jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(WORKER_MODULE))
    env = {
        **os.environ,
        "AXA_QUEUE_DSN": dsn,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DATABASE_URL", None)
    subprocess.run(
        [sys.executable, "-m", "axa_queue.cli", "setup"], env=env, check=True, capture_output=True
    )
    for name in ("Stuck", "StuckInThread"):
        admin.execute(
            "INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), %s, '{}')", (name,)
        )
    # A row past retention: its going shows a housekeeping pass ran.
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, status, updated_at) VALUES "
        "(gen_random_uuid(), 'Old', '{}', 'completed', now() - interval '1000 days')"
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "axa_queue.cli",
            "worker",
            f"{module}:queue",
            "--log-format",
            "json",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr or ()), daemon=True)
    reader.start()

    def wait_for(what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30
        while not done():
            assert process.poll() is None, "the worker exited before it was told to stop"
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    try:
        wait_for(
            "the jobs never started",
            lambda: (
                admin.execute("SELECT count(*) FROM axa_queue WHERE status = 'running'").fetchone()
                == (2,)
            ),
        )
        # The failing schedule has ticked (and said so), and housekeeping has run.
        wait_for(
            "the schedule never failed",
            lambda: any("could not queue its job" in line for line in list(lines)),
        )
        wait_for(
            "housekeeping never ran",
            lambda: admin.execute("SELECT 1 FROM axa_queue WHERE name = 'Old'").fetchone() is None,
        )
        assert process.poll() is None, "a failing schedule brought the worker down"
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(30)  # a liveness bound: the grace is 2 s
        except subprocess.TimeoutExpired:
            raise AssertionError("one SIGTERM did not stop the worker") from None
        reader.join(30)
        events = [json.loads(line) for line in lines if line.startswith("{")]
        assert code == 0, events
        assert any(e["message"] == "worker stopped" for e in events)
        # The jobs still running were aborted: left `running`, for stale recovery.
        assert admin.execute(
            "SELECT count(*) FROM axa_queue WHERE status = 'running'"
        ).fetchone() == (2,)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_a_workers_first_round_and_first_move_wait_a_random_part_of_their_interval(
    make_queue, monkeypatch
) -> None:
    # The processes one deploy starts spread their first housekeeping, and a process
    # starting on a backlog gives its first moments to jobs: the first round of
    # maintenance and the first move to the history each wait a random part of their
    # interval, at most `FIRST_ROUND_SPREAD`.
    from types import SimpleNamespace

    from axa_queue.worker import housekeeping

    assert housekeeping.first_wait(3600.0, 0.5) == housekeeping.FIRST_ROUND_SPREAD / 2
    assert housekeeping.first_wait(0.3, 0.5) == 0.15  # a short interval: part of it
    assert housekeeping.first_wait(3600.0, 0.0) == 0.0
    waits: list[float] = []
    both = asyncio.Event()
    rounds = asyncio.Event()

    first_wait = housekeeping.first_wait

    def recorded(every: float, draw: float) -> float:
        waits.append(first_wait(every, draw))
        if len(waits) == 2:
            both.set()
        return waits[-1]

    async def round_run(*args: Any, **kwargs: Any) -> None:
        rounds.set()

    monkeypatch.setattr(housekeeping, "random", SimpleNamespace(random=lambda: 0.5))
    monkeypatch.setattr(housekeeping, "first_wait", recorded)
    monkeypatch.setattr(housekeeping.maintenance, "run_once", round_run)
    queue = await make_queue(maintenance_interval=3600, keep_recent=60)
    async with running(queue):
        await asyncio.wait_for(both.wait(), 10)
    assert sorted(waits) == [15.0, 15.0]  # rounds: min(3600, 30) / 2; moves: min(30, 30) / 2
    assert not rounds.is_set(), "no round before its first wait was over"
