"""Crashes and stops: a killed worker process, a cancelled `run()`, a graceful stop, and
several processes draining one queue, each job exactly once."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from axa_queue import JobState, NewJob, QueueOptions, Recovered, sql
from conftest import eventually, exchange_waits, later, running, status_of

WORKER_SCRIPT = '''
"""A worker process for the tests: python worker.py DSN WORKERS PREFETCH STALE_AFTER."""
import asyncio
import os
import signal
import sys

from axa_queue import Queue, QueueOptions


async def main() -> None:
    dsn, workers = sys.argv[1], int(sys.argv[2])
    prefetch = "auto" if sys.argv[3] == "auto" else int(sys.argv[3])
    stale_after = float(sys.argv[4])
    queue = Queue(
        dsn,
        QueueOptions(
            workers=workers,
            prefetch=prefetch,
            poll_interval=0.05,
            heartbeat_interval=0.1,
            stale_after=stale_after,
            maintenance_interval=0.2,
            retry_backoff=0.05,
        ),
    )

    @queue.handler("Sleep")
    async def sleep(args):
        await asyncio.sleep(600)

    @queue.handler("Block")
    async def block(args):
        async with queue.pool.connection() as conn:
            await conn.execute("INSERT INTO began (n) VALUES (%s)", (args["n"],))
        await asyncio.sleep(600)

    @queue.handler("Quick")
    async def quick(args):
        return None

    @queue.handler("Record")
    async def record(args):
        await asyncio.sleep(args.get("sleep", 0))
        async with queue.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO ran (n, pid) VALUES (%s, %s)", (args["n"], os.getpid())
            )

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with queue:
        print("ready", flush=True)
        await queue.run(stop)
    print("stopped", flush=True)


asyncio.run(main())
'''


DEFAULT_PREFETCH = QueueOptions().prefetch
"""Worker processes claim ahead as the default says unless a test says otherwise."""


class Worker:
    """A worker subprocess and where its output went."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
async def spawn(dsn: str, tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Worker]]]:
    """Start worker processes on this test's schema; each is killed if still alive."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    started: list[Worker] = []

    async def start(
        workers: int = 1, prefetch: int | str = DEFAULT_PREFETCH, stale_after: float = 1.0
    ) -> Worker:
        log = tmp_path / f"worker-{len(started)}.log"
        with log.open("wb") as errors:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(script),
                dsn,
                str(workers),
                str(prefetch),
                str(stale_after),
                stdout=asyncio.subprocess.PIPE,
                stderr=errors,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        worker = Worker(process, log)
        started.append(worker)
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), 30)
        except asyncio.TimeoutError:
            raise AssertionError(f"the worker did not start:\n{worker.output()}") from None
        assert line.strip() == b"ready", f"{line!r}\n{worker.output()}"
        return worker

    yield start
    for worker in started:
        if worker.process.returncode is None:
            worker.process.kill()
            await worker.process.wait()


async def stop_gracefully(worker: Worker) -> None:
    worker.process.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.wait_for(worker.process.wait(), 30)
    except asyncio.TimeoutError:
        raise AssertionError(f"the worker did not stop:\n{worker.output()}") from None
    assert code == 0, worker.output()


# --- a killed process ------------------------------------------------------------------


async def test_a_job_whose_worker_process_is_killed_is_recovered_by_another_and_completes(
    spawn, make_queue, admin
) -> None:
    job_id = await (await make_queue()).enqueue("Sleep", {}, max_attempts=2)
    doomed = await spawn()
    await eventually(lambda: status_of(admin, job_id)[0] == "running")
    doomed.process.kill()  # SIGKILL: no cleanup, no final write
    assert await asyncio.wait_for(doomed.process.wait(), 10) == -signal.SIGKILL
    assert status_of(admin, job_id) == ("running", None, 1)

    rescuer = await make_queue(stale_after=1.0, maintenance_interval=0.1)
    assert await rescuer.recover_stale() == [], "not stale until stale_after has passed"
    ran: list[Any] = []
    rescuer.handle("Sleep", ran.append)
    async with running(rescuer):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert ran == [{}]
    assert status_of(admin, job_id) == ("completed", None, 2)


async def test_jobs_claimed_ahead_by_a_killed_process_are_recovered_and_each_run_once(
    spawn, make_queue, admin
) -> None:
    queue = await make_queue()
    ids = [await queue.enqueue("Sleep", {"n": n}, max_attempts=2) for n in range(4)]
    doomed = await spawn(workers=1, prefetch=3)  # one running, three waiting for its loop
    await eventually(
        lambda: (
            admin.execute("SELECT count(*) FROM axa_queue WHERE status = 'running'").fetchone()
            == (4,)
        )
    )
    doomed.process.kill()
    assert await asyncio.wait_for(doomed.process.wait(), 10) == -signal.SIGKILL

    rescuer = await make_queue(workers=4, stale_after=1.0, maintenance_interval=0.1)
    ran: list[int] = []
    rescuer.handle("Sleep", lambda args: ran.append(args["n"]))
    async with running(rescuer):
        await eventually(lambda: all(status_of(admin, i)[0] == "completed" for i in ids))
    assert sorted(ran) == [0, 1, 2, 3]
    assert {status_of(admin, i) for i in ids} == {("completed", None, 2)}


async def test_jobs_a_killed_process_claimed_ahead_and_never_started_run_later_with_their_attempts(
    spawn, make_queue, admin
) -> None:
    # Two loops, three jobs claimed ahead. A quick job of a higher priority starts with
    # the first block; when it ends, its loop takes the best job waiting, whose start
    # the next exchange marks. So two blocks run (their handlers wrote `began`), two
    # wait, unstarted, when the process is killed.
    admin.execute("CREATE TABLE began (n INTEGER PRIMARY KEY)")
    queue = await make_queue()
    quick = await queue.enqueue("Quick", {}, priority=10, max_attempts=1)
    blocks = {n: await queue.enqueue("Block", {"n": n}, max_attempts=1) for n in range(4)}
    doomed = await spawn(workers=2, prefetch=3)

    def marked() -> bool:
        began = admin.execute("SELECT count(*) FROM began").fetchone()
        waiting = admin.execute(
            "SELECT count(*) FROM axa_queue WHERE status = 'running' AND ahead = attempts"
        ).fetchone()
        started = admin.execute(
            "SELECT count(*) FROM axa_queue WHERE status = 'running' AND ahead IS NULL"
        ).fetchone()
        return began == (2,) and waiting == (2,) and started == (2,)

    await eventually(marked)
    assert status_of(admin, quick)[0] == "completed"
    doomed.process.kill()
    assert await asyncio.wait_for(doomed.process.wait(), 10) == -signal.SIGKILL
    started = {n for (n,) in admin.execute("SELECT n FROM began").fetchall()}
    assert len(started) == 2

    rescuer = await make_queue(stale_after=1.0)
    recovered = await rescuer.recover_stale(now=later(admin, 3600))
    assert sorted((r.id, r.attempts, r.state) for r in recovered) == sorted(
        [(blocks[n], 1, JobState.FAILED) for n in started]
        + [(blocks[n], 1, JobState.QUEUED) for n in set(blocks) - started]
    )
    for n, job_id in blocks.items():
        row = admin.execute(
            "SELECT status, error, attempts, max_attempts, given_back FROM axa_queue WHERE id = %s",
            (job_id,),
        ).fetchone()
        if n in started:  # its handler ran: its only attempt is spent, as before
            assert row == ("failed", "abandoned by its worker", 1, 1, 0)
        else:  # never started: queued again with its attempt given back
            assert row == ("queued", None, 1, 2, 1)

    ran: list[int] = []
    rescuer.handle("Block", lambda args: ran.append(args["n"]))
    async with running(rescuer):
        await eventually(
            lambda: all(
                status_of(admin, blocks[n])[0] == "completed" for n in set(blocks) - started
            )
        )
    assert sorted(ran) == sorted(set(blocks) - started)
    for n in set(blocks) - started:
        assert status_of(admin, blocks[n]) == ("completed", None, 2)


CLAIM_AHEAD = """UPDATE axa_queue SET status = 'running', started_at = now(), updated_at = now(),
    attempts = attempts + 1, ahead = attempts + 1 WHERE id = %s"""
"""Claim a job ahead, as `sql.EXCHANGE` does for a process that then dies before
marking its start."""


async def test_a_job_that_kills_its_process_before_its_start_is_marked_gets_its_attempt_back_at_most_a_few_times(
    make_queue, admin
) -> None:
    # A run taken for not started (its start unmarked) is given back at most
    # GIVE_BACK_LIMIT times: a job killing its process at once cannot loop for ever.
    queue = await make_queue(stale_after=1.0)
    job_id = await queue.enqueue("Doom", {}, max_attempts=1)
    for _ in range(sql.GIVE_BACK_LIMIT):
        admin.execute(CLAIM_AHEAD, (job_id,))
        [back] = await queue.recover_stale(now=later(admin, 3600))
        assert back.state is JobState.QUEUED
    admin.execute(CLAIM_AHEAD, (job_id,))
    assert await queue.recover_stale(dry_run=True, now=later(admin, 3600)) == [
        Recovered(job_id, "Doom", sql.GIVE_BACK_LIMIT + 1, JobState.FAILED)
    ]
    [burned] = await queue.recover_stale(now=later(admin, 3600))
    assert burned.state is JobState.FAILED
    row = admin.execute(
        "SELECT attempts, max_attempts, given_back FROM axa_queue WHERE id = %s", (job_id,)
    ).fetchone()
    assert row == (sql.GIVE_BACK_LIMIT + 1, 1 + sql.GIVE_BACK_LIMIT, sql.GIVE_BACK_LIMIT)


async def test_a_killed_job_with_no_attempts_left_is_failed_by_another_process(
    spawn, make_queue, admin
) -> None:
    job_id = await (await make_queue()).enqueue("Sleep", {})  # one attempt
    doomed = await spawn()
    await eventually(lambda: status_of(admin, job_id)[0] == "running")
    doomed.process.kill()
    await asyncio.wait_for(doomed.process.wait(), 10)

    other = await spawn()
    await eventually(lambda: status_of(admin, job_id)[0] == "failed")
    assert status_of(admin, job_id) == ("failed", "abandoned by its worker", 1)
    await stop_gracefully(other)
    assert status_of(admin, job_id) == ("failed", "abandoned by its worker", 1)


# --- cancelling and stopping run() -----------------------------------------------------


def blocking_handler() -> tuple[Callable[[Any], Awaitable[None]], dict[str, asyncio.Event]]:
    events = {k: asyncio.Event() for k in ("started", "release", "cancelled", "finished")}

    async def handler(args: Any) -> None:
        events["started"].set()
        try:
            await events["release"].wait()
        except asyncio.CancelledError:
            events["cancelled"].set()
            raise
        events["finished"].set()

    return handler, events


async def test_cancelling_run_aborts_jobs_in_progress_and_leaves_them_for_stale_recovery(
    make_queue, admin
) -> None:
    queue = await make_queue(stale_after=0.5, heartbeat_interval=0.1)
    handler, events = blocking_handler()
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {}, max_attempts=2)
    task = asyncio.create_task(queue.run(asyncio.Event()))
    await asyncio.wait_for(events["started"].wait(), 15)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(events["cancelled"].wait(), 5)
    assert not events["finished"].is_set()
    assert status_of(admin, job_id) == ("running", None, 1)

    # Not heard from any more: after the stale period, recovery queues it again.
    again = await make_queue(stale_after=0.5, maintenance_interval=0.1)
    assert await again.recover_stale(dry_run=True, now=later(admin, 0.6)) == [
        Recovered(job_id, "Long", 1, JobState.QUEUED)
    ]
    assert status_of(admin, job_id)[0] == "running", "nothing reports in, nothing recovers"
    ran: list[Any] = []
    again.handle("Long", ran.append)
    async with running(again):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert ran == [{}]
    assert status_of(admin, job_id) == ("completed", None, 2)


async def test_setting_the_stop_event_lets_jobs_in_progress_finish_and_records_them(
    make_queue, admin, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="axa_queue")
    # One loop and nothing claimed ahead: a job queued while it runs waits for a claim,
    # which a stopping worker never makes (a job claimed ahead would run: a stop runs
    # what it holds).
    queue = await make_queue(workers=1, prefetch=0)
    handler, events = blocking_handler()
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {})
    stop = asyncio.Event()
    task = asyncio.create_task(queue.run(stop))
    await asyncio.wait_for(events["started"].wait(), 15)
    later = await queue.enqueue("Long", {})
    stop.set()
    # run() has seen the stop (it says it waits), and has not returned or aborted the job.
    await eventually(
        lambda: any(
            "stopping: waiting for jobs in progress" in r.getMessage() for r in caplog.records
        )
    )
    assert not task.done(), "run() returned while a job was in progress"
    assert not events["cancelled"].is_set()
    events["release"].set()
    await asyncio.wait_for(task, 15)
    assert events["finished"].is_set()
    # Recorded before run() returned, with nothing left in flight.
    assert status_of(admin, job_id) == ("completed", None, 1)
    assert status_of(admin, later) == ("queued", None, 0), "no new job starts once stopping"


async def test_a_stop_waits_for_a_result_write_the_database_holds_up(
    make_queue, admin, dsn
) -> None:
    queue = await make_queue(workers=1)
    handler, events = blocking_handler()
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {})
    stop = asyncio.Event()
    task = asyncio.create_task(queue.run(stop))
    await asyncio.wait_for(events["started"].wait(), 15)
    with psycopg.connect(dsn) as locker:
        # Another transaction holds the job's row, so writing the result must wait.
        locker.execute("SELECT 1 FROM axa_queue WHERE id = %s FOR UPDATE", (job_id,))
        stop.set()
        events["release"].set()
        await eventually(lambda: exchange_waits(admin) > 0)
        assert status_of(admin, job_id)[0] == "running"
        locker.rollback()
    await asyncio.wait_for(task, 15)
    assert status_of(admin, job_id) == ("completed", None, 1)


async def test_a_job_claimed_as_the_stop_comes_is_run_to_its_end_too(
    make_queue, admin, dsn, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="axa_queue")
    queue = await make_queue(workers=2)
    first, first_events = blocking_handler()
    second, second_events = blocking_handler()
    queue.handle("First", first)
    queue.handle("Second", second)
    first_id = await queue.enqueue("First", {})
    stop = asyncio.Event()
    task = asyncio.create_task(queue.run(stop))
    await asyncio.wait_for(first_events["started"].wait(), 15)
    with psycopg.connect(dsn) as locker:
        # Hold the table, so the next claim is in flight when the stop comes; it will
        # find the job queued in the same transaction.
        locker.execute("LOCK TABLE axa_queue IN ACCESS EXCLUSIVE MODE")
        locker.execute(
            "INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), 'Second', '{}')"
        )
        # The claim now waits on the lock.
        await eventually(lambda: exchange_waits(admin) > 0)
        stop.set()
        await eventually(
            lambda: any(
                "stopping: waiting for jobs in progress" in r.getMessage() for r in caplog.records
            )
        )
    await asyncio.wait_for(second_events["started"].wait(), 15)
    first_events["release"].set()
    # The first job's result is written; run() must still wait for the second job.
    await eventually(lambda: status_of(admin, first_id)[0] == "completed")
    assert not task.done()
    second_events["release"].set()
    await asyncio.wait_for(task, 15)
    rows = admin.execute("SELECT name, status, attempts FROM axa_queue ORDER BY name").fetchall()
    assert rows == [("First", "completed", 1), ("Second", "completed", 1)]
    assert status_of(admin, first_id)[0] == "completed"


async def test_a_stop_records_every_result_of_a_burst_of_jobs_before_returning(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=8)
    release = asyncio.Event()
    started = 0

    async def handler(args: Any) -> None:
        nonlocal started
        started += 1
        await release.wait()

    queue.handle("Burst", handler)
    ids = await queue.enqueue_all(NewJob("Burst", {"n": n}) for n in range(8))
    stop = asyncio.Event()
    task = asyncio.create_task(queue.run(stop))
    await eventually(lambda: started == 8)
    stop.set()
    release.set()
    await asyncio.wait_for(task, 15)
    rows = admin.execute(
        "SELECT status, count(*) FROM axa_queue WHERE id = ANY(%s) GROUP BY status", (ids,)
    ).fetchall()
    assert rows == [("completed", 8)]


async def test_a_stop_with_a_grace_period_aborts_jobs_still_running_after_it(
    make_queue, admin
) -> None:
    queue = await make_queue(shutdown_grace=0.2)
    handler, events = blocking_handler()
    queue.handle("Long", handler)
    job_id = await queue.enqueue("Long", {})
    stop = asyncio.Event()
    task = asyncio.create_task(queue.run(stop))
    await asyncio.wait_for(events["started"].wait(), 15)
    stop.set()
    await asyncio.wait_for(task, 15)
    assert events["cancelled"].is_set() and not events["finished"].is_set()
    assert status_of(admin, job_id) == ("running", None, 1), "left for stale recovery"


# --- many processes --------------------------------------------------------------------


async def test_three_worker_processes_run_each_of_600_jobs_exactly_once(
    spawn, make_queue, admin
) -> None:
    admin.execute("CREATE TABLE ran (n INTEGER PRIMARY KEY, pid INTEGER NOT NULL)")
    # With and without jobs claimed ahead (their endings gather before they are sent).
    # No process dies here, so the stale period can be long: a heartbeat held up for
    # more than stale_after sends a process's jobs to review by design (once, with 1 s,
    # 8 jobs went there in a CI run; not reproduced in 25 runs since).
    workers = [
        await spawn(workers=4, prefetch=prefetch, stale_after=10.0) for prefetch in (0, 4, 16)
    ]
    queue = await make_queue()
    jobs = [NewJob("Record", {"n": n, "sleep": 0.002}) for n in range(600)]
    for start in range(0, 600, 150):  # in a few batches, as producers would
        await queue.enqueue_all(jobs[start : start + 150])

    def drained() -> bool:
        counts = admin.execute(
            "SELECT count(*) FILTER (WHERE status IN ('queued', 'running')) FROM axa_queue"
        ).fetchone()
        return counts is not None and counts[0] == 0

    await eventually(drained, timeout=60)
    for worker in workers:
        await stop_gracefully(worker)

    counts = await queue.counts()
    assert (counts.completed, counts.failed, counts.needs_review) == (600, 0, 0), [
        (job.state, job.attempt, job.error)
        for state in (JobState.FAILED, JobState.NEEDS_REVIEW)
        for job in await queue.jobs(state)
    ]
    assert admin.execute("SELECT count(*), count(DISTINCT n) FROM ran").fetchone() == (600, 600)
    assert admin.execute("SELECT min(n), max(n) FROM ran").fetchone() == (0, 599)
    attempts = admin.execute("SELECT DISTINCT attempts FROM axa_queue").fetchall()
    assert attempts == [(1,)], "no job was claimed twice"
    pids = {row[0] for row in admin.execute("SELECT DISTINCT pid FROM ran").fetchall()}
    assert pids <= {w.process.pid for w in workers}
    assert len(pids) >= 2, "the work was shared between processes"
