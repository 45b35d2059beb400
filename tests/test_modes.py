"""Modes (`QueueOptions.mode`, `AXA_QUEUE_MODE`): every way a Queue, a SyncQueue or a
handler queues a job on the queue's own connection honours them the same way, with a
`JobContext` for the run and its id returned; `enqueue_on` always stores its job."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import psycopg
import pytest

import axa_queue
from axa_queue import (
    JobContext,
    JobHandler,
    NewJob,
    OptionsError,
    Queue,
    QueueOptions,
    SyncQueue,
    current_job,
    enqueue_on,
)
from conftest import FAST, set_up

AsyncWay = Callable[[Queue, JobHandler[Any], Any], Awaitable[UUID]]


async def _enqueue(queue: Queue, handler: JobHandler[Any], args: Any) -> UUID:
    return await queue.enqueue("Report", args, max_attempts=4)


async def _enqueue_all(queue: Queue, handler: JobHandler[Any], args: Any) -> UUID:
    (job_id,) = await queue.enqueue_all([NewJob("Report", args, max_attempts=4)])
    return job_id


async def _perform_later(queue: Queue, handler: JobHandler[Any], args: Any) -> UUID:
    return await handler.perform_later(args, max_attempts=4)


ASYNC_WAYS: dict[str, AsyncWay] = {
    "enqueue": _enqueue,
    "enqueue_all": _enqueue_all,
    "perform_later": _perform_later,
}

SyncWay = Callable[[SyncQueue, Any], UUID]
SYNC_WAYS: dict[str, SyncWay] = {
    "enqueue": lambda jobs, args: jobs.enqueue("Report", args, max_attempts=4),
    "enqueue_all": lambda jobs, args: jobs.enqueue_all([NewJob("Report", args, max_attempts=4)])[0],
}


def stored(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM axa_queue").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("way", ASYNC_WAYS)
async def test_inline_mode_runs_the_handler_in_the_caller_for_every_way_to_queue(
    make_queue, admin, way
) -> None:
    queue = await make_queue(mode="inline", max_attempts=2)
    caller = asyncio.current_task()
    runs: list[tuple[Any, JobContext, Any]] = []

    @queue.handler("Report")
    async def report(args: dict[str, int]) -> None:
        runs.append((args, current_job(), asyncio.current_task()))
        if args["id"] < 0:
            raise ValueError("no negative reports")

    run_id = await ASYNC_WAYS[way](queue, report, {"id": 1})
    assert runs == [({"id": 1}, JobContext(run_id, "Report", 1, 4), caller)]
    with pytest.raises(ValueError, match="no negative reports"):
        await ASYNC_WAYS[way](queue, report, {"id": -1})
    assert stored(admin) == 0


@pytest.mark.parametrize("way", ASYNC_WAYS)
async def test_background_mode_runs_the_handler_as_a_task_for_every_way_to_queue(
    make_queue, admin, way
) -> None:
    queue = await make_queue(mode="background")
    caller = asyncio.current_task()
    runs: list[tuple[JobContext, Any]] = []

    @queue.handler("Report")
    async def report(args: dict[str, int]) -> None:
        runs.append((current_job(), asyncio.current_task()))
        if args["id"] < 0:
            raise ValueError("told to fail")

    failing = await ASYNC_WAYS[way](queue, report, {"id": -1})
    run_id = await ASYNC_WAYS[way](queue, report, {"id": 2})
    await queue.close()  # waits for the tasks
    assert [context.id for context, _ in runs] == [failing, run_id]
    assert all(task is not caller for _, task in runs)
    assert stored(admin) == 0


async def test_an_inline_sync_handler_sees_its_job_in_its_thread(make_queue) -> None:
    queue = await make_queue(mode="inline")
    seen: list[tuple[JobContext, threading.Thread]] = []

    @queue.handler("Report")
    def report(args: Any) -> None:
        seen.append((current_job(), threading.current_thread()))

    run_id = await queue.enqueue("Report", {}, timeout=30)
    ((context, thread),) = seen
    assert context.id == run_id and context.deadline is not None
    assert context.max_attempts == queue.options.max_attempts
    assert thread is not threading.current_thread()


async def test_the_inline_mode_with_no_handler_for_the_job_says_what_to_do(make_queue) -> None:
    queue = await make_queue(mode="inline")
    with pytest.raises(OptionsError, match=r"no handler for job 'Report': register one"):
        await queue.enqueue("Report", {})


async def test_enqueue_on_stores_its_job_whatever_the_mode(make_queue, dsn, admin) -> None:
    queue = await make_queue(mode="inline")
    ran: list[Any] = []
    queue.handle("Report", ran.append)
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await enqueue_on(conn, NewJob("Report", {"id": 1}))
    assert stored(admin) == 1 and ran == []
    assert await queue.drain() == axa_queue.DrainResult(completed=1), "a test drains it"
    assert ran == [{"id": 1}]


@pytest.mark.parametrize("way", SYNC_WAYS)
def test_a_sync_queue_in_inline_mode_runs_handlers_in_the_callers_thread(
    dsn, admin, way, monkeypatch
) -> None:
    set_up(admin)
    monkeypatch.setenv("AXA_QUEUE_MODE", "inline")
    queue = Queue(dsn, QueueOptions(**FAST))
    runs: list[tuple[str, JobContext, threading.Thread]] = []

    @queue.handler("Report")
    def report(args: dict[str, int]) -> None:
        runs.append(("sync", current_job(), threading.current_thread()))
        if args["id"] < 0:
            raise ValueError("no negative reports")

    with queue.sync() as jobs:
        run_id = SYNC_WAYS[way](jobs, {"id": 1})
        assert runs == [("sync", JobContext(run_id, "Report", 1, 4), threading.current_thread())]
        with pytest.raises(ValueError, match="no negative reports"):
            SYNC_WAYS[way](jobs, {"id": -1})

        @queue.handler("Report", replace=True)
        async def async_report(args: dict[str, int]) -> None:
            runs.append(("async", current_job(), threading.current_thread()))

        other = SYNC_WAYS[way](jobs, {"id": 2})
        assert runs[-1][:2] == ("async", JobContext(other, "Report", 1, 4))
    assert stored(admin) == 0


@pytest.mark.parametrize("way", SYNC_WAYS)
def test_a_sync_queue_in_background_mode_runs_handlers_in_threads_close_waits_for(
    dsn, admin, way
) -> None:
    set_up(admin)
    queue = Queue(dsn, QueueOptions(**{**FAST, "mode": "background"}))
    release = threading.Event()
    runs: list[tuple[JobContext, threading.Thread]] = []

    @queue.handler("Report")
    def report(args: dict[str, int]) -> None:
        release.wait()
        runs.append((current_job(), threading.current_thread()))
        if args["id"] < 0:
            raise ValueError("told to fail")

    jobs = queue.sync()
    failing = SYNC_WAYS[way](jobs, {"id": -1})
    run_id = SYNC_WAYS[way](jobs, {"id": 2})
    assert runs == [], "the caller did not wait"
    release.set()
    jobs.close()
    assert sorted(str(context.id) for context, _ in runs) == sorted([str(failing), str(run_id)])
    assert all(thread is not threading.current_thread() for _, thread in runs)
    assert stored(admin) == 0


def test_a_sync_queue_made_on_its_own_refuses_to_run_a_job_inline(dsn) -> None:
    with pytest.raises(OptionsError, match=r"a SyncQueue from queue.sync\(\)"):
        SyncQueue(dsn, QueueOptions(mode="inline")).enqueue("Report", {})


def test_a_sync_queue_in_queue_mode_stores_the_job(dsn, admin) -> None:
    set_up(admin)
    queue = Queue(dsn, QueueOptions(mode="queue"))
    queue.handle("Report", lambda args: None)
    with queue.sync() as jobs:
        job_id = jobs.enqueue("Report", {"id": 1})
    row = admin.execute("SELECT id FROM axa_queue").fetchone()
    assert row == (job_id,)
