"""Durable steps and sleeps against a real PostgreSQL: a recorded step skipped on the
job's next attempt, refused once the run lost its claim (and the recovery that takes
the claim waiting for a step being recorded), sleep keeping steps and attempts, names
unique, sync handlers' steps, results never shown, and steps read after the job moved
to the history and gone with it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import psycopg
import pytest

from axa_queue import (
    ClaimLostError,
    JobState,
    Retry,
    StepError,
    current_job,
    retry,
    sql,
)
from axa_queue.db.calls import drive, send_sync
from axa_queue.jobs.steps import StepBook
from conftest import eventually, lock_waits, running, set_up

SECRET = "card-4242-secret"


@pytest.fixture
def admin(dsn: str) -> Any:
    """A sync autocommit connection to this test's schema, the tables made."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        set_up(conn)
        yield conn


def status(admin: psycopg.Connection[Any], job_id: UUID) -> tuple[str, int, int | None]:
    row = admin.execute(
        "SELECT status, attempts, max_attempts FROM axa_queue WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def steps_rows(admin: psycopg.Connection[Any], job_id: UUID) -> list[tuple[str, int, Any]]:
    return admin.execute(
        "SELECT name, attempt, result FROM axa_queue_steps WHERE job_id = %s ORDER BY name",
        (job_id,),
    ).fetchall()


def outcomes(admin: psycopg.Connection[Any], job_id: UUID) -> list[tuple[int, str]]:
    return admin.execute(
        "SELECT attempt, outcome FROM axa_queue_attempts WHERE job_id = %s ORDER BY attempt",
        (job_id,),
    ).fetchall()


async def test_a_recorded_step_returns_its_result_on_a_retry_without_running_again(
    make_queue, admin
) -> None:
    queue = await make_queue()
    charged: list[int] = []

    async def charge(order: int) -> dict[str, Any]:
        charged.append(order)
        return {"charge": f"ch_{order}"}

    @queue.handler("Order")
    async def order(args: dict[str, int]) -> Any:
        job = current_job()
        receipt = await job.step("charge", charge, args["order"])
        sent = await job.step("email", lambda: "sent")
        if job.attempt == 1:
            raise Retry(in_=0)
        return [receipt, sent]

    job_id = await queue.enqueue("Order", {"order": 7}, max_attempts=3)
    async with running(queue):
        await eventually(lambda: status(admin, job_id)[0] == "completed")
    assert charged == [7], "the step's function ran once, on the first attempt"
    assert await queue.result(job_id) == [{"charge": "ch_7"}, "sent"]
    assert steps_rows(admin, job_id) == [("charge", 1, {"charge": "ch_7"}), ("email", 1, "sent")]
    info = await queue.job(job_id)
    assert info is not None
    assert [(s.name, s.attempt) for s in info.steps] == [("charge", 1), ("email", 1)]
    assert all(s.duration >= timedelta(0) for s in info.steps)


async def test_a_sync_handlers_steps_are_recorded_and_replayed_in_its_thread(
    make_queue, admin
) -> None:
    queue = await make_queue()
    ran: list[str] = []
    threads: set[str] = set()

    def fetch(n: int) -> int:
        ran.append("fetch")
        threads.add(threading.current_thread().name)
        return n * 10

    @queue.handler("Sync")
    def handler(args: dict[str, int]) -> int:
        job = current_job()
        value: int = job.step("fetch", fetch, args["n"])
        if job.attempt == 1:
            raise Retry(in_=0)
        return value + 1

    job_id = await queue.enqueue("Sync", {"n": 4}, max_attempts=3)
    async with running(queue):
        await eventually(lambda: status(admin, job_id)[0] == "completed")
    assert ran == ["fetch"]
    assert threading.main_thread().name not in threads
    assert await queue.result(job_id) == 41


async def test_a_step_name_given_twice_in_a_run_is_refused_and_says_what_to_do(
    make_queue, admin
) -> None:
    queue = await make_queue()
    said: list[str] = []

    @queue.handler("Twice")
    async def twice(args: Any) -> None:
        job = current_job()
        await job.step("send", lambda: 1)
        try:
            await job.step("send", lambda: 2)
        except StepError as error:
            said.append(str(error))

    job_id = await queue.enqueue("Twice", {})
    async with running(queue):
        await eventually(lambda: status(admin, job_id)[0] == "completed")
    assert len(said) == 1
    assert (
        "'send'" in said[0] and str(job_id) in said[0] and "give each step its own name" in said[0]
    )
    assert steps_rows(admin, job_id) == [("send", 1, 1)]


async def test_a_step_whose_function_raised_records_nothing_and_its_name_may_be_tried_again(
    make_queue, admin
) -> None:
    queue = await make_queue()

    def flaky(tries: list[int]) -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("try again")
        return "ok"

    @queue.handler("Flaky")
    async def handler(args: Any) -> str:
        job, tries = current_job(), []
        with contextlib.suppress(ConnectionError):
            await job.step("call", flaky, tries)
        return str(await job.step("call", flaky, tries))

    job_id = await queue.enqueue("Flaky", {})
    async with running(queue):
        await eventually(lambda: status(admin, job_id)[0] == "completed")
    assert await queue.result(job_id) == "ok"
    assert steps_rows(admin, job_id) == [("call", 1, "ok")]


async def test_sleep_queues_the_job_again_keeping_its_steps_and_spending_no_attempt(
    make_queue, admin
) -> None:
    queue = await make_queue()
    calls: list[int] = []

    @queue.handler("Nap")
    async def nap(args: Any) -> int:
        job = current_job()
        value: int = await job.step("first", lambda: calls.append(job.attempt) or 5)
        if job.attempt == 1:
            await job.sleep(timedelta(0))
        if job.attempt == 2:
            await job.sleep_until(datetime.now(timezone.utc) - timedelta(seconds=1))
        return value

    job_id = await queue.enqueue("Nap", {}, max_attempts=1)
    async with running(queue):
        await eventually(lambda: status(admin, job_id)[0] == "completed")
    assert calls == [1], "the step ran once, across two sleeps"
    assert status(admin, job_id) == ("completed", 3, 3), "attempts numbered on, none spent"
    assert outcomes(admin, job_id) == [(1, "slept"), (2, "slept")]
    assert steps_rows(admin, job_id) == [("first", 1, 5)]
    info = await queue.job(job_id)
    assert info is not None and [a.outcome for a in info.attempts] == [
        "slept",
        "slept",
        "completed",
    ]


async def test_a_sync_handlers_sleep_is_a_sleep_too(make_queue, admin) -> None:
    queue = await make_queue()

    @queue.handler("SyncNap")
    def nap(args: Any) -> None:
        job = current_job()
        job.step("once", lambda: None)
        if job.attempt == 1:
            job.sleep(0)

    job_id = await queue.enqueue("SyncNap", {})
    async with running(queue):
        await eventually(lambda: status(admin, job_id)[0] == "completed")
    assert outcomes(admin, job_id) == [(1, "slept")]
    assert steps_rows(admin, job_id) == [("once", 1, None)]


def _claim(admin: psycopg.Connection[Any], job_id: UUID) -> int:
    row = admin.execute(
        "UPDATE axa_queue SET status = 'running', attempts = attempts + 1, started_at = now() "
        "WHERE id = %s AND status = 'queued' RETURNING attempts",
        (job_id,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _recover(admin: psycopg.Connection[Any], job_id: UUID) -> None:
    """Take the run's claim as stale recovery does: queued again, attempts kept."""
    admin.execute(
        "UPDATE axa_queue SET status = 'queued', started_at = NULL WHERE id = %s", (job_id,)
    )


def _step(conn: psycopg.Connection[Any], book: StepBook, name: str, value: Any) -> Any:
    """A step of `book` on `conn`, as `JobContext.step` drives it."""
    found, got = drive(lambda call: send_sync(conn, call), book.look(name))
    if found:
        return got
    call, got = book.record(name, value, 0.01)
    send_sync(conn, call)
    return got


async def test_a_run_that_lost_its_claim_cannot_record_a_step_and_the_next_attempt_reads_the_rest(
    make_queue, admin
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Any", {})
    first = _claim(admin, job_id)
    book = StepBook(job_id, first)
    assert _step(admin, book, "a", 1) == 1
    _recover(admin, job_id)
    with pytest.raises(ClaimLostError) as lost:
        _step(admin, book, "b", 2)
    assert "lost its claim" in str(lost.value) and "'b'" in str(lost.value)
    assert steps_rows(admin, job_id) == [("a", first, 1)]
    second = StepBook(job_id, _claim(admin, job_id))
    assert _step(admin, second, "a", "not run") == 1, "recorded by the first attempt"
    assert _step(admin, second, "b", 2) == 2
    assert [(n, a) for n, a, _ in steps_rows(admin, job_id)] == [("a", 1), ("b", 2)]


async def test_recovery_waits_for_a_step_being_recorded_so_no_later_attempt_misses_it(
    make_queue, admin, dsn
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Any", {})
    book = StepBook(job_id, _claim(admin, job_id))
    with psycopg.connect(dsn) as recording:  # a transaction held open across the recovery
        _step(recording, book, "charge", "ch_1")
        recovered = threading.Event()

        def recover() -> None:
            with psycopg.connect(dsn, autocommit=True) as other:
                _recover(other, job_id)
            recovered.set()

        thread = threading.Thread(target=recover)
        thread.start()
        await eventually(lambda: lock_waits(admin, "UPDATE axa_queue SET status") == 1)
        assert not recovered.is_set(), "the recovery waits for the step's row lock"
        recording.commit()
    thread.join(10)
    assert recovered.is_set()
    later = StepBook(job_id, _claim(admin, job_id))
    assert _step(admin, later, "charge", "ch_2") == "ch_1"


async def test_a_steps_result_is_never_logged_shown_or_in_an_error(
    make_queue, admin, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    queue = await make_queue()

    @queue.handler("Secret")
    async def handler(args: Any) -> None:
        job = current_job()
        await job.step("card", lambda: {"number": SECRET})
        if job.attempt == 1:
            await job.sleep(0)
        raise RuntimeError("failed after the step")

    job_id = await queue.enqueue("Secret", {}, max_attempts=1)
    async with running(queue):
        await eventually(lambda: status(admin, job_id)[0] == "failed")
    info = await queue.job(job_id)
    assert info is not None and info.state is JobState.FAILED
    assert SECRET not in repr(info) and SECRET not in str(info.error)
    assert SECRET not in caplog.text
    assert [s.name for s in info.steps] == ["card"]
    assert SECRET not in repr(info.steps)


async def test_steps_stay_readable_after_the_job_moved_to_the_history_and_leave_with_it(
    make_queue, admin, monkeypatch
) -> None:
    from axa_queue import history

    monkeypatch.setattr(history, "STEPS_BATCH", 2)  # the batches before the drop walk on
    queue = await make_queue()

    @queue.handler("Kept")
    async def handler(args: Any) -> None:
        await current_job().step("only", lambda: "x")
        await current_job().step("more", lambda: "y")

    ids = [await queue.enqueue("Kept", {}) for _ in range(5)]
    async with running(queue):
        await eventually(lambda: all(status(admin, i)[0] == "completed" for i in ids))
    moved = await queue.move_history(0, now=datetime.now(timezone.utc) + timedelta(seconds=5))
    assert moved.moved == 5
    job_id = ids[0]
    gone = admin.execute("SELECT count(*) FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert gone == (0,)
    info = await queue.job(job_id)
    assert info is not None and sorted(s.name for s in info.steps) == ["more", "only"]
    assert steps_rows(admin, job_id) == [("more", 1, "y"), ("only", 1, "x")]
    later = datetime.now(timezone.utc) + timedelta(days=2)
    first = {"older_than": 0, "now": later, "batch": 2, "after": str(UUID(int=0))}
    jobs, last = admin.execute(sql.STEPS_DROP_BATCH, first).fetchone() or (0, None)
    assert (jobs, last) == (2, sorted(str(i) for i in ids)[1]), "one bounded batch"
    assert admin.execute("SELECT count(*) FROM axa_queue_steps").fetchone() == (6,)
    assert await queue.purge(0, now=later) == 5
    assert admin.execute("SELECT count(*) FROM axa_queue_steps").fetchone() == (0,)


async def test_purge_deletes_a_purged_jobs_steps(make_queue, admin) -> None:
    queue = await make_queue()

    @queue.handler("Purged")
    async def handler(args: Any) -> None:
        await current_job().step("s", lambda: json.dumps({"n": 1}))

    job_id = await queue.enqueue("Purged", {})
    async with running(queue):
        await eventually(lambda: status(admin, job_id)[0] == "completed")
    assert len(steps_rows(admin, job_id)) == 1
    assert await queue.purge(0, now=datetime.now(timezone.utc) + timedelta(seconds=5)) == 1
    assert steps_rows(admin, job_id) == []


async def test_a_run_without_a_row_just_calls_a_steps_function(make_queue) -> None:
    from axa_queue.context import fresh, running_job

    with running_job(fresh("Inline", 1)) as job:
        assert await job.step("x", lambda a: a + 1, 1) == 2
    with running_job(fresh("Inline", 1)) as job, pytest.raises(StepError):
        await job.step("", lambda: 1)


async def test_a_drain_runs_steps_of_async_and_sync_handlers_on_its_side_connection(
    make_queue, admin
) -> None:
    queue = await make_queue()

    @queue.handler("AsyncDrained")
    async def first(args: Any) -> int:
        job = current_job()
        value: int = await job.step("a", lambda: 1)
        if job.attempt == 1:
            await job.sleep(0)
        return value

    @queue.handler("SyncDrained")
    def second(args: Any) -> int:
        return int(current_job().step("b", lambda: 2)) + 1

    ids = [await queue.enqueue("AsyncDrained", {}), await queue.enqueue("SyncDrained", {})]
    await queue.drain()
    assert [await queue.result(job_id) for job_id in ids] == [1, 3]
    assert steps_rows(admin, ids[0]) == [("a", 1, 1)]
    assert steps_rows(admin, ids[1]) == [("b", 1, 2)]


async def test_a_worker_run_whose_claim_was_taken_gets_claim_lost_and_the_next_attempt_goes_on(
    make_queue, admin
) -> None:
    queue = await make_queue(heartbeat_interval=30, stale_after=90)  # no heartbeat meddles
    reached, go_on = asyncio.Event(), asyncio.Event()
    lost: list[ClaimLostError] = []
    ran: list[str] = []

    @queue.handler("Taken")
    async def taken(args: Any) -> str:
        job = current_job()
        await job.step("a", lambda: ran.append("a") or 1)
        reached.set()
        await go_on.wait()
        try:
            await job.step("b", lambda: ran.append("b") or 2)
        except ClaimLostError as error:
            lost.append(error)
            raise
        return "done"

    job_id = await queue.enqueue("Taken", {}, max_attempts=3)
    async with running(queue):
        await reached.wait()
        _recover(admin, job_id)  # as stale recovery would: the run's claim is gone
        go_on.set()
        # A started run that lost its claim sends its job to review (docs/design.md).
        await eventually(lambda: status(admin, job_id)[0] == "needs_review")
        assert retry(admin, job_id, "ops:alice", "checked")  # released: runs again
        await eventually(lambda: status(admin, job_id)[0] == "completed")
    assert len(lost) == 1 and lost[0].attempt == 1 and lost[0].step == "b"
    # `a` ran once; `b` ran in the run that lost its claim (its result refused) and again
    # in the next: at least once, recorded once.
    assert ran == ["a", "b", "b"]
    assert [(n, a) for n, a, _ in steps_rows(admin, job_id)] == [("a", 1), ("b", 2)]


async def test_a_parent_that_sleeps_releases_its_dependent_only_once_completed_with_its_result(
    make_queue, admin
) -> None:
    from axa_queue import NewJob, chain

    queue = await make_queue()
    seen: list[Any] = []
    parent_states: list[str] = []

    @queue.handler("Parent")
    async def parent(args: Any) -> str:
        job = current_job()
        await job.step("before", lambda: "kept")
        if job.attempt == 1:
            await job.sleep(0)
        return "p"

    @queue.handler("Child")
    async def child(args: Any) -> None:
        seen.append(await current_job().parent_results())

    flow = await queue.enqueue(chain(NewJob("Parent"), NewJob("Child")))
    first, second = flow.jobs
    async with running(queue):
        await eventually(lambda: status(admin, second)[0] == "completed")
    parent_states.append(status(admin, first)[0])
    assert seen == [["p"]], "its parent's result, never a sleep's"
    assert parent_states == ["completed"]
    assert outcomes(admin, first) == [(1, "slept")]
