"""Waiting for a job to finish: `wait()` is woken by a notification sent only while
someone waits, from any process, and never misses an ending that commits while it sets
itself up."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from axa_queue import (
    JobNotFoundError,
    JobState,
    NewJob,
    NotOpenError,
    SyncQueue,
    WaitTimeoutError,
    cancel,
)
from axa_queue.jobs import waits
from axa_queue.jobs.waits import woken
from conftest import eventually, later, lock_waits, running, status_of

ENDING_LOCK = "(1635213687, 'axa_queue'::regclass::oid::int4)"
"""Held shared by every statement finishing jobs until it commits (see `sql.EXCHANGE`)."""
HOLD_ENDING = f"SELECT pg_advisory_xact_lock_shared{ENDING_LOCK}"
"""Hold that lock as a statement finishing jobs does."""
WAITING_LOCK = "(1635213688, 'axa_queue'::regclass::oid::int4)"
"""Held shared by every waiting connection; tried by every statement finishing jobs."""


def oid_of(admin: psycopg.Connection[Any]) -> str:
    row = admin.execute("SELECT 'axa_queue'::regclass::oid::text").fetchone()
    assert row is not None
    return str(row[0])


async def test_a_job_run_by_another_queue_wakes_its_waiter_with_the_finished_job(
    make_queue,
) -> None:
    waiting = await make_queue()
    working = await make_queue()  # its own pool and connections, as another service's

    @working.handler("Report")
    async def report(args: dict[str, int]) -> dict[str, int]:
        return {"rows": args["n"]}

    job_id = await waiting.enqueue("Report", {"n": 7})
    waiter = asyncio.create_task(waiting.wait(job_id, timeout=30))
    await eventually(lambda: waiting.waiters.ready is not None and waiting.waiters.ready.done())
    assert not waiter.done()
    async with running(working):
        info = await waiter
    assert info.id == job_id and info.state is JobState.COMPLETED
    assert await waiting.result(job_id) == {"rows": 7}


WORKER_MODULE = """
from axa_queue import Queue, QueueOptions

queue = Queue(options=QueueOptions(poll_interval=0.05))

@queue.handler("Square")
def square(args):
    return {"square": args["n"] * args["n"]}
"""


async def test_a_job_run_by_a_worker_process_wakes_a_waiter_in_this_one(
    make_queue, dsn: str, tmp_path: Path
) -> None:
    queue = await make_queue()
    module = f"jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(WORKER_MODULE))
    env = {
        **os.environ,
        "AXA_QUEUE_DSN": dsn,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    job_ids = [await queue.enqueue("Square", {"n": n}) for n in range(5)]
    worker = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "axa_queue.cli", "worker", f"{module}:queue", "--no-setup"],
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        infos = await asyncio.gather(*(queue.wait(one, timeout=60) for one in job_ids))
    finally:
        worker.terminate()
        await asyncio.wait_for(worker.wait(), 30)
    assert [info.state for info in infos] == [JobState.COMPLETED] * 5
    assert [await queue.result(one) for one in job_ids] == [{"square": n * n} for n in range(5)]


async def test_waiting_for_a_job_already_finished_returns_it_without_listening(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.handle("Quick", lambda args: None)
    job_id = await queue.enqueue("Quick", {})
    async with running(queue):
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    info = await queue.wait(job_id, timeout=0)
    assert info.state is JobState.COMPLETED
    assert queue.waiters.task is None  # no connection listened: the first read said so


async def test_a_wait_that_runs_out_of_time_raises_a_timeout_error_and_leaves_the_job(
    make_queue, admin
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Nobody", {})
    with pytest.raises(WaitTimeoutError, match=f"job {job_id} did not finish within 0.2 s") as got:
        await queue.wait(job_id, timeout=0.2)
    assert isinstance(got.value, TimeoutError) and got.value.state == "queued"
    assert "it is still queued" in str(got.value)
    assert status_of(admin, job_id)[0] == "queued"
    with SyncQueue(queue.dsn) as jobs, pytest.raises(WaitTimeoutError):
        jobs.wait(job_id, timeout=0.2)


async def test_waiting_for_no_such_job_says_so(make_queue) -> None:
    queue = await make_queue()
    missing = uuid4()
    with pytest.raises(JobNotFoundError, match=f"no job {missing}"):
        await queue.wait(missing, timeout=1)
    with SyncQueue(queue.dsn) as jobs, pytest.raises(JobNotFoundError):
        jobs.wait(str(missing), timeout=1)


async def test_a_sync_waiter_is_woken_by_a_worker_like_an_async_one(make_queue) -> None:
    queue = await make_queue()
    release = asyncio.Event()

    @queue.handler("Gated")
    async def gated(args: Any) -> str:
        await release.wait()
        return "done"

    job_id = await queue.enqueue("Gated", {})
    with SyncQueue(queue.dsn) as jobs:
        async with running(queue):
            waiter = asyncio.create_task(asyncio.to_thread(jobs.wait, job_id, 30))
            await eventually(lambda: waits_listening(queue) == 1)
            release.set()
            info = await waiter
        assert info.state is JobState.COMPLETED and jobs.result(job_id) == "done"


def waits_listening(queue: Any) -> int:
    """How many sessions hold the waiters' lock (each one listening)."""
    with psycopg.connect(queue.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1635213688 "
            "AND objid = 'axa_queue'::regclass::oid AND mode = 'ShareLock' AND granted"
        ).fetchone()
        assert row is not None
        return int(row[0])


async def test_failed_cancelled_and_stale_jobs_wake_their_waiters_too(make_queue, admin) -> None:
    queue = await make_queue(max_attempts=1)

    @queue.handler("Boom")
    async def boom(args: Any) -> None:
        raise RuntimeError("told to fail")

    failing = await queue.enqueue("Boom", {})
    cancelled = await queue.enqueue("Later", {}, run_in=3600)
    stale = await queue.enqueue("Stale", {})
    admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = 1, started_at = now() WHERE id = %s",
        (stale,),
    )
    waiters = [
        asyncio.create_task(queue.wait(one, timeout=30)) for one in (failing, cancelled, stale)
    ]
    await eventually(lambda: len(queue.waiters.events) == 3)
    await eventually(lambda: waits_listening(queue) == 1)
    with psycopg.connect(queue.dsn) as conn:  # the caller's transaction: told at commit
        cancel(conn, cancelled, by="ops:test", reason="not_needed")
        await asyncio.sleep(0)
    assert (await waiters[1]).state is JobState.CANCELLED
    assert await queue.recover_stale(now=later(admin, 3600))
    assert (await waiters[2]).state is JobState.FAILED
    async with running(queue):
        info = await waiters[0]
    assert info.state is JobState.FAILED and info.error == "RuntimeError: told to fail"


async def test_a_job_in_review_ends_a_wait_it_waits_for_a_person(make_queue, admin) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Lost", {})
    admin.execute(
        "UPDATE axa_queue SET status = 'needs_review', attempts = 1, started_at = now(), "
        "error = 'lost its claim' WHERE id = %s",
        (job_id,),
    )
    info = await queue.wait(job_id, timeout=5)
    assert info.state is JobState.NEEDS_REVIEW


async def test_a_waiter_setting_up_while_an_ending_is_being_written_sees_it_once_committed(
    make_queue, admin, dsn: str
) -> None:
    # An ending is written by a statement that holds the ending lock until its commit
    # and found no one waiting, so it will not notify (as `sql.EXCHANGE` does). A waiter
    # starting then waits for that commit before it reads the row: it sees the ending,
    # it does not miss it.
    queue = await make_queue()
    job_id = await queue.enqueue("Any", {})
    with psycopg.connect(dsn) as ending:
        ending.execute(
            "UPDATE axa_queue SET status = 'completed', attempts = 1 WHERE id = %s", (job_id,)
        )
        ending.execute(HOLD_ENDING)
        row = ending.execute(
            f"SELECT pg_try_advisory_lock{WAITING_LOCK} AND pg_advisory_unlock{WAITING_LOCK}"
        ).fetchone()
        assert row == (True,)  # nobody waits: this ending will not notify
        waiter = asyncio.create_task(queue.wait(job_id, timeout=30))
        await eventually(lambda: lock_waits(admin, "pg_advisory_lock(1635213687") == 1)
        assert waits_listening(queue) == 1  # it said it waits before it waited for the ending
        assert not waiter.done()
        ending.commit()
    assert (await waiter).state is JobState.COMPLETED


async def test_endings_notify_only_while_someone_waits(make_queue, admin, dsn: str) -> None:
    queue = await make_queue()
    queue.handle("Quick", lambda args: None)
    tag = oid_of(admin)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN axa_queue_done")
        first = await queue.enqueue_all(NewJob("Quick", {}) for _ in range(5))
        async with running(queue):
            for one in first:
                await eventually(lambda one=one: status_of(admin, one)[0] == "completed")
            ours = [n for n in listener.notifies(timeout=0.2) if n.payload.split()[0] == tag]
            assert ours == []  # no one waited: no NOTIFY (other tests' tables may send theirs)
            held = admin.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid IN (1635213687, 1635213688) AND objid = 'axa_queue'::regclass::oid"
            ).fetchone()
            assert held == (0,)  # the waiting lock was let go at once, the ending lock at commit
            job_id = await queue.enqueue("Gate", {}, run_in=3600)
            waiter = asyncio.create_task(queue.wait(job_id, timeout=30))
            await eventually(lambda: waits_listening(queue) == 1)
            second = await queue.enqueue("Quick", {})
            await eventually(lambda: status_of(admin, second)[0] == "completed")
            told: list[str] = []
            for note in listener.notifies(timeout=2):
                if note.payload.split()[0] == tag and str(second) in note.payload.split():
                    told.append(note.payload)
                    break  # told: no need to wait out the 2 s
            assert told
        waiter.cancel()


def test_a_notification_names_its_table_and_jobs_or_every_job() -> None:
    assert woken("16384 a b", "16384") == {"a", "b"}
    assert woken("16384 *", "16384") is None
    assert woken("99 a", "16384") == set()


async def test_more_jobs_finished_at_once_than_a_notification_names_wake_every_waiter(
    make_queue,
) -> None:
    queue = await make_queue(workers=20, prefetch=200)
    gate = asyncio.Event()

    @queue.handler("Batch")
    async def batch(args: Any) -> None:
        await gate.wait()

    ids = await queue.enqueue_all(NewJob("Batch", {}) for _ in range(400))
    async with running(queue):
        waits = [asyncio.create_task(queue.wait(one, timeout=60)) for one in ids]
        gate.set()
        infos = await asyncio.gather(*waits)
    assert {info.state for info in infos} == {JobState.COMPLETED}


async def test_without_listen_a_waiter_reads_the_row_every_poll_interval(make_queue) -> None:
    queue = await make_queue(listen=False, poll_interval=0.05)
    queue.handle("Quick", lambda args: 1)
    job_id = await queue.enqueue("Quick", {})
    async with running(queue):
        info = await queue.wait(job_id, timeout=30)
    assert info.state is JobState.COMPLETED and queue.waiters.task is None
    with SyncQueue(queue.dsn, queue.options) as jobs:
        assert jobs.wait(job_id, timeout=1).state is JobState.COMPLETED


async def test_the_waiters_connection_closes_when_the_queue_closes(make_queue) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Nobody", {})
    with pytest.raises(WaitTimeoutError):
        await queue.wait(job_id, timeout=0.1)
    assert queue.waiters.task is not None
    assert waits_listening(queue) == 1
    await queue.close()
    assert queue.waiters.task is None
    await eventually(lambda: waits_listening(queue) == 0)


def test_the_waiters_channel_and_lock_are_the_ones_every_ending_statement_uses() -> None:
    from axa_queue import sql

    assert f"LISTEN {sql.DONE_CHANNEL}" == sql.LISTEN_DONE
    for statement in (sql.EXCHANGE, sql.CANCEL, sql.MARK_LOST, sql.RECOVER_STALE):
        assert f"pg_notify('{sql.DONE_CHANNEL}', 'axa_queue'::regclass::oid::text" in statement
    assert f"pg_advisory_lock_shared{WAITING_LOCK}" in sql.WAITING
    assert f"pg_advisory_lock{ENDING_LOCK}" in sql.WAITING
    assert f"pg_advisory_unlock{ENDING_LOCK}" in sql.WAITING
    assert f"pg_try_advisory_xact_lock_shared{ENDING_LOCK}" in sql.EXCHANGE
    assert f"pg_try_advisory_lock{WAITING_LOCK}" in sql.EXCHANGE
    assert f"pg_advisory_unlock{WAITING_LOCK}" in sql.EXCHANGE


async def test_a_wait_in_progress_ends_when_its_queue_closes(make_queue) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Nobody", {})
    waiter = asyncio.create_task(queue.wait(job_id))  # no timeout
    await eventually(lambda: waits_listening(queue) == 1)
    await queue.close()
    with pytest.raises(NotOpenError):
        await waiter
    assert queue.waiters.task is None


async def test_a_wait_whose_connection_is_still_being_made_ends_when_its_queue_closes(
    make_queue, monkeypatch
) -> None:
    # Closed before the waiters' connection listened (in CI: the lock taken, its answer
    # not yet read), the wait waited for ever on a listener that was gone.
    queue = await make_queue()
    job_id = await queue.enqueue("Nobody", {})
    connecting = asyncio.Event()

    async def never(**kwargs: Any) -> Any:
        connecting.set()
        await asyncio.Event().wait()  # cancelled by close

    monkeypatch.setattr(queue.connector, "connect", never)
    waiter = asyncio.create_task(queue.wait(job_id))
    await connecting.wait()
    await queue.close()
    with pytest.raises(NotOpenError):
        await asyncio.wait_for(waiter, 30)  # a bound on a failure, not a wait for success
    assert queue.waiters.task is None


async def test_a_waiter_whose_connection_broke_listens_again_and_still_sees_its_job_finish(
    make_queue, admin, monkeypatch
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Later", {})
    waiter = asyncio.create_task(queue.wait(job_id, timeout=60))
    await eventually(lambda: waits_listening(queue) == 1)
    gate = asyncio.Event()
    connect = queue.connector.connect

    async def held_back(**kwargs: Any) -> Any:
        await gate.wait()
        return await connect(**kwargs)

    monkeypatch.setattr(queue.connector, "connect", held_back)
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
        "AND classid = 1635213688 AND objid = 'axa_queue'::regclass::oid"
    )
    await eventually(lambda: waits_listening(queue) == 0)
    # Finished (with no notification) while no connection listened: seen once it does.
    admin.execute(
        "UPDATE axa_queue SET status = 'completed', attempts = 1 WHERE id = %s", (job_id,)
    )
    gate.set()
    assert (await waiter).state is JobState.COMPLETED
    await eventually(lambda: waits_listening(queue) == 1)


async def test_a_waiter_held_up_behind_a_slow_ending_holds_up_no_worker(
    make_queue, admin, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A statement finishing jobs holds the ending lock and waits (a row lock, say); a
    # waiter arriving waits for it. Workers meanwhile go on: their endings only try the
    # ending lock, and notify when a waiter is taking it.
    monkeypatch.setattr(waits, "LINGER", 0.2)  # the waits that time out let go soon
    queue = await make_queue()
    queue.handle("Quick", lambda args: "done")
    slow = await queue.enqueue("Slow", {}, run_in=3600)
    with psycopg.connect(dsn) as ending:
        ending.execute(HOLD_ENDING)
        waiter = asyncio.create_task(queue.wait(slow, timeout=60))
        await eventually(lambda: lock_waits(admin, "pg_advisory_lock(1635213687") == 1)
        other = await make_queue()
        quick = await other.enqueue("Quick", {})
        async with running(queue):
            await eventually(lambda: status_of(admin, quick)[0] == "completed")
        assert not waiter.done()
        assert (await other.wait(quick, timeout=0)).state is JobState.COMPLETED
        # Waits that run out of time while held up there still end, as timeouts.
        with pytest.raises(WaitTimeoutError, match="it is still queued"):
            await other.wait(slow, timeout=0.2)
        with SyncQueue(dsn) as jobs, pytest.raises(WaitTimeoutError, match="still queued"):
            await asyncio.to_thread(jobs.wait, slow, 0.2)
        ending.rollback()
    await eventually(lambda: waits_listening(queue) == 1)
    cancel(admin, slow, by="ops:test", reason="not_needed")
    assert (await waiter).state is JobState.CANCELLED
