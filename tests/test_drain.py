"""queue.drain(): the ready jobs run in the calling process, through a real worker,
until none is ready; counted by how each run ended."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

from axa_queue import (
    DrainError,
    DrainResult,
    JobContext,
    NewJob,
    OptionsError,
    Queue,
    QueueOptions,
    current_job,
    enqueue_on,
)
from conftest import FAST, eventually, running, set_up, status_of


async def test_a_drain_runs_the_ready_jobs_and_counts_how_each_run_ended(make_queue, admin) -> None:
    queue = await make_queue(retry_backoff=3600)
    outcomes: list[tuple[str, str]] = []
    queue.observe(lambda name, outcome, _seconds: outcomes.append((name, outcome)))

    @queue.handler("Fine")
    async def fine(args: Any) -> None:
        pass

    @queue.handler("Flaky")
    def flaky(args: Any) -> None:  # a sync handler, in a thread, as a worker runs it
        raise RuntimeError("the lookup failed")

    ids = {
        "fine": await queue.enqueue("Fine", {}),
        "retried": await queue.enqueue("Flaky", {}, max_attempts=2),
        "failed": await queue.enqueue("Flaky", {}),
    }
    result = await queue.drain()
    assert result == DrainResult(completed=1, retried=1, failed=1, needs_review=0)
    assert result.total == 3
    assert status_of(admin, ids["fine"])[0] == "completed"
    assert status_of(admin, ids["retried"]) == ("queued", "RuntimeError: the lookup failed", 1)
    assert status_of(admin, ids["failed"])[0] == "failed"
    assert sorted(outcomes) == [("Fine", "completed"), ("Flaky", "failed"), ("Flaky", "retried")]
    assert await queue.drain() == DrainResult(), "the retry waits for its backoff"


async def test_a_job_queued_by_a_job_is_run_in_the_same_drain(make_queue) -> None:
    queue = await make_queue(poll_interval=3600)  # no poll: the drain itself looks again
    seen: list[int] = []

    @queue.handler("Step")
    async def step(args: dict[str, int]) -> None:
        seen.append(args["n"])
        if args["n"] < 3:
            await queue.enqueue("Step", {"n": args["n"] + 1})

    await queue.enqueue("Step", {"n": 0})
    assert await queue.drain() == DrainResult(completed=4)
    assert seen == [0, 1, 2, 3]


async def test_a_delayed_job_and_a_waiting_retry_are_left_unless_include_delayed(
    make_queue, admin
) -> None:
    queue = await make_queue(retry_backoff=3600)
    ran: list[str] = []

    @queue.handler("Later")
    async def later(args: Any) -> None:
        ran.append("later")

    @queue.handler("Flaky")
    async def flaky(args: Any) -> None:
        ran.append("flaky")
        raise RuntimeError("down")

    later_id = await queue.enqueue("Later", {}, run_in=3600)
    flaky_id = await queue.enqueue("Flaky", {}, max_attempts=3)
    assert await queue.drain() == DrainResult(retried=1)
    assert status_of(admin, later_id)[0] == "queued" and ran == ["flaky"]
    result = await queue.drain(include_delayed=True)
    assert result == DrainResult(completed=1, retried=1, failed=1)
    assert status_of(admin, later_id)[0] == "completed"
    assert status_of(admin, flaky_id) == ("failed", "RuntimeError: down", 3)


async def test_a_drain_runs_only_the_names_it_is_given(make_queue, admin) -> None:
    queue = await make_queue()
    queue.handle("A", lambda args: None)
    queue.handle("B", lambda args: None)
    a, b = await queue.enqueue("A", {}), await queue.enqueue("B", {})
    assert await queue.drain("A") == DrainResult(completed=1)
    assert (status_of(admin, a)[0], status_of(admin, b)[0]) == ("completed", "queued")
    assert await queue.drain(["A", "B"]) == DrainResult(completed=1)


async def test_a_drain_of_a_name_with_no_handler_or_with_no_handlers_is_refused(
    make_queue,
) -> None:
    queue = await make_queue()
    with pytest.raises(OptionsError, match="no handlers to run"):
        await queue.drain()
    queue.handle("A", lambda args: None)
    with pytest.raises(OptionsError, match=r"no handler for: \['Nope'\]; it handles \['A'\]"):
        await queue.drain(["A", "Nope"])


async def test_a_run_in_a_drain_is_held_to_its_timeout(make_queue, admin) -> None:
    queue = await make_queue()

    @queue.handler("Hang")
    async def hang(args: Any) -> None:
        await asyncio.Event().wait()  # never set: only its timeout ends it

    job_id = await queue.enqueue("Hang", {}, timeout=0.2, max_attempts=1)
    assert await queue.drain() == DrainResult(failed=1)
    assert status_of(admin, job_id)[:2] == ("failed", "timed out after 0.2 s")


async def test_a_run_in_a_drain_gets_its_job_context(make_queue, admin) -> None:
    queue = await make_queue()
    contexts: list[JobContext] = []

    @queue.handler("Known")
    async def known(args: Any) -> None:
        contexts.append(current_job())

    job_id = await queue.enqueue("Known", {}, timeout=60, max_attempts=1)
    assert await queue.drain() == DrainResult(completed=1)
    (context,) = contexts
    assert (context.id, context.attempt, context.is_last_attempt) == (job_id, 1, True)
    assert context.deadline is not None


async def test_a_drain_gives_up_after_its_timeout_and_says_what_ran_so_far(
    make_queue, admin
) -> None:
    queue = await make_queue()
    started = asyncio.Event()

    @queue.handler("Stuck")
    async def stuck(args: Any) -> None:
        started.set()
        await asyncio.Event().wait()

    queue.handle("Fine", lambda args: None)
    await queue.enqueue("Fine", {})
    job_id = await queue.enqueue("Stuck", {})
    with pytest.raises(DrainError) as failure:
        await queue.drain(timeout=0.5)
    assert str(failure.value) == (
        "drain() gave up after 0.5 s with jobs still ready or running (1 completed, "
        "0 retried, 0 failed so far): a handler may be stuck, or jobs keep queuing jobs; "
        "pass a longer timeout= if they need more time"
    )
    assert started.is_set()
    assert status_of(admin, job_id)[0] == "running", "left for stale recovery, as an abort"


async def test_a_run_that_lost_its_claim_while_draining_is_counted_as_needing_review(
    make_queue, dsn, admin
) -> None:
    queue = await make_queue()

    @queue.handler("Taken")
    def taken(args: Any) -> None:
        # Another worker takes the claim while this run goes on (its attempt moves on).
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("UPDATE axa_queue SET attempts = attempts + 1 WHERE name = 'Taken'")

    job_id = await queue.enqueue("Taken", {}, max_attempts=5)
    assert await queue.drain() == DrainResult(needs_review=1)
    assert status_of(admin, job_id)[0] == "needs_review"


async def test_a_drain_while_the_queues_worker_runs_here_is_refused(make_queue) -> None:
    queue = await make_queue()
    queue.handle("A", lambda args: None)
    async with running(queue):
        await eventually(lambda: queue.worker is not None)
        with pytest.raises(DrainError, match="run\\(\\) is working in this process"):
            await queue.drain()
        with pytest.raises(DrainError, match="run\\(\\) is working in this process"):
            queue.drain_sync()
    assert await queue.drain() == DrainResult(), "once it stopped, a drain may run"


async def test_a_synchronous_drain_on_a_running_event_loop_is_refused(make_queue) -> None:
    queue = await make_queue()
    queue.handle("A", lambda args: None)
    with pytest.raises(DrainError, match=r"use `await queue.drain\(\)` there"):
        queue.drain_sync()
    with pytest.raises(DrainError, match=r"use `await queue.drain\(\)` there"):
        queue.sync().drain()


def test_drain_sync_runs_jobs_queued_from_synchronous_code_without_an_event_loop(
    dsn, admin
) -> None:
    queue = Queue(dsn, QueueOptions(**FAST))  # defined at import time, never opened here
    threads: list[threading.Thread] = []
    sent: list[int] = []

    @queue.handler("SendReceipt")
    def send(args: dict[str, int]) -> None:
        threads.append(threading.current_thread())
        sent.append(args["order"])

    @queue.handler("Audit")
    async def audit(args: dict[str, int]) -> None:
        sent.append(-args["order"])

    with queue.sync() as jobs:
        set_up(admin)
        jobs.enqueue("SendReceipt", {"order": 7})
        with jobs.connection() as conn:  # a view's transaction
            enqueue_on(conn, NewJob("Audit", {"order": 7}))
        assert queue.drain_sync() == DrainResult(completed=2)
        assert sorted(sent) == [-7, 7]
        assert threads[0] is not threading.current_thread(), "a sync handler runs in a thread"
        jobs.enqueue("SendReceipt", {"order": 8})
        assert jobs.drain("SendReceipt") == DrainResult(completed=1)
    assert sent[-1] == 8


def test_a_sync_queue_made_on_its_own_has_no_handlers_to_drain(dsn) -> None:
    from axa_queue import SyncQueue

    with pytest.raises(OptionsError, match=r"made from \(queue.sync\(\)\)"):
        SyncQueue(dsn).drain()
