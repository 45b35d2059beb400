"""Inside a worker's run of an async handler, `queue.pool.connection()` hands out the
connection lent to the run's loop (no checkout): it comes back clean or not at all, is
never shared by two blocks at once, and goes back to the pool once the worker idles."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from axa_queue import cancel, current_job
from axa_queue.db.lending import LEND_SPARE, Lender
from axa_queue.worker import shelf
from conftest import eventually, running, status_of


async def finished(admin: psycopg.Connection[Any], job_id: UUID, status: str = "completed") -> None:
    await eventually(lambda: status_of(admin, job_id)[0] == status)


def checkouts(queue: Any) -> list[asyncio.Task[Any] | None]:
    """The task of each checkout of the queue's pool from now on (`getconn`), so a test
    counts its own run's and not those the worker's housekeeping makes meanwhile."""
    tasks: list[asyncio.Task[Any] | None] = []
    getconn = queue.pool.getconn

    async def noted(*args: Any, **kwargs: Any) -> Any:
        tasks.append(asyncio.current_task())
        return await getconn(*args, **kwargs)

    queue.pool.getconn = noted
    return tasks


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lent connections stay with the worker while the test runs (no idle timer fires)."""
    monkeypatch.setattr(shelf, "LEND_IDLE", 3600.0)


async def test_blocks_of_one_run_get_the_same_lent_connection_with_no_checkout(
    make_queue, admin
) -> None:
    queue = await make_queue(workers=1)
    seen: list[Any] = []
    taken = checkouts(queue)

    @queue.handler("twice")
    async def twice(args: dict[str, Any]) -> None:
        async with queue.pool.connection() as conn:
            await conn.execute("SELECT 1")
            seen.append(conn)
        before = len(taken)
        async with queue.pool.connection() as conn:
            await conn.execute("SELECT 1")
            seen.append(conn)
        seen.append(taken[before:].count(asyncio.current_task()))  # none by this run

    job = await queue.enqueue("twice", {})
    async with running(queue):
        await finished(admin, job)
    assert seen[0] is seen[1]
    assert seen[2] == 0


async def test_runs_one_after_another_reuse_the_loops_lent_connection(
    make_queue, admin, kept
) -> None:
    queue = await make_queue(workers=1)
    pids: list[int] = []

    @queue.handler("pid")
    async def pid(args: dict[str, Any]) -> None:
        async with queue.pool.connection() as conn:
            pids.append(conn.info.backend_pid)

    async with running(queue):
        for _ in range(3):
            await finished(admin, await queue.enqueue("pid", {}))
    assert len(pids) == 3 and len(set(pids)) == 1


async def test_an_idle_worker_gives_its_lent_connections_back(
    make_queue, admin, monkeypatch
) -> None:
    monkeypatch.setattr(shelf, "LEND_IDLE", 0.05)
    queue = await make_queue(workers=2)
    lenders: list[Lender] = []

    @queue.handler("use")
    async def use(args: dict[str, Any]) -> None:
        lenders.append(current_job()._lender)
        async with queue.pool.connection() as conn:
            await conn.execute("SELECT 1")

    async with running(queue):
        await finished(admin, await queue.enqueue("use", {}))
        await eventually(lambda: lenders[0].conn is None and lenders[0].lending.out == 0)
        # and lends again on the next run
        await finished(admin, await queue.enqueue("use", {}))


async def test_a_transaction_left_open_commits_on_success_and_the_connection_comes_back_idle(
    make_queue, admin, kept
) -> None:
    queue = await make_queue(workers=1)
    admin.execute("CREATE TABLE lent_rows (k text)")
    states: list[TransactionStatus] = []

    @queue.handler("open")
    async def left_open(args: dict[str, Any]) -> None:
        async with queue.pool.connection() as conn:
            states.append(conn.info.transaction_status)
            await conn.execute("BEGIN")
            await conn.execute("INSERT INTO lent_rows VALUES (%s)", (args["k"],))

    async with running(queue):
        await finished(admin, await queue.enqueue("open", {"k": "a"}))
        await finished(admin, await queue.enqueue("open", {"k": "b"}))
    assert states == [TransactionStatus.IDLE, TransactionStatus.IDLE]
    assert admin.execute("SELECT k FROM lent_rows ORDER BY k").fetchall() == [("a",), ("b",)]


async def test_a_handler_that_raises_in_a_transaction_has_it_rolled_back(
    make_queue, admin, kept
) -> None:
    queue = await make_queue(workers=1, max_attempts=1)
    admin.execute("CREATE TABLE lent_rows (k text)")
    states: list[TransactionStatus] = []

    @queue.handler("raise")
    async def raises(args: dict[str, Any]) -> None:
        async with queue.pool.connection() as conn:
            states.append(conn.info.transaction_status)
            await conn.execute("BEGIN")
            await conn.execute("INSERT INTO lent_rows VALUES ('no')")
            if args["fail"] == "sql":
                await conn.execute("SELECT 1/0")
            raise RuntimeError("on purpose")

    async with running(queue):
        await finished(admin, await queue.enqueue("raise", {"fail": "raise"}), "failed")
        await finished(admin, await queue.enqueue("raise", {"fail": "sql"}), "failed")
        await finished(admin, await queue.enqueue("raise", {"fail": "raise"}), "failed")
    assert states == [TransactionStatus.IDLE] * 3
    assert admin.execute("SELECT count(*) FROM lent_rows").fetchone() == (0,)


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_a_run_stopped_in_a_transaction_or_a_statement_leaves_a_clean_connection(
    make_queue, admin, kept, how: str
) -> None:
    queue = await make_queue(workers=1, max_attempts=1)
    admin.execute("CREATE TABLE lent_rows (k text)")
    inside = asyncio.Event()
    seen: list[tuple[int, TransactionStatus]] = []

    @queue.handler("stuck")
    async def stuck(args: dict[str, Any]) -> None:
        async with queue.pool.connection() as conn:
            seen.append((conn.info.backend_pid, conn.info.transaction_status))
            await conn.execute("BEGIN")
            await conn.execute("INSERT INTO lent_rows VALUES ('no')")
            inside.set()
            if args["in"] == "statement":
                await conn.execute("SELECT pg_sleep(60)")
            else:
                await asyncio.Event().wait()

    @queue.handler("after")
    async def after(args: dict[str, Any]) -> None:
        async with queue.pool.connection() as conn:
            seen.append((conn.info.backend_pid, conn.info.transaction_status))
            await conn.execute("SELECT 1")

    options: dict[str, Any] = {"timeout": 0.3} if how == "timeout" else {}
    async with running(queue):
        for where in ("transaction", "statement"):
            inside.clear()
            job = await queue.enqueue("stuck", {"in": where}, **options)
            if how == "cancel":
                await inside.wait()
                async with queue.connection() as conn:
                    assert await cancel(conn, job, "ops:test", "stop")
                await finished(admin, job, "cancelled")
            else:
                await finished(admin, job, "failed")
            await finished(admin, await queue.enqueue("after", {}))
    assert [status for _, status in seen] == [TransactionStatus.IDLE] * 4
    assert admin.execute("SELECT count(*) FROM lent_rows").fetchone() == (0,)


async def test_a_broken_lent_connection_is_replaced(make_queue, admin, kept) -> None:
    queue = await make_queue(workers=1, max_attempts=1)
    pids: list[int] = []

    @queue.handler("break")
    async def breaks(args: dict[str, Any]) -> None:
        async with queue.pool.connection() as conn:
            pids.append(conn.info.backend_pid)
            if args["kill"]:
                admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
                await conn.execute("SELECT 1")  # fails: the server ended the session

    async with running(queue):
        await finished(admin, await queue.enqueue("break", {"kill": False}))
        await finished(admin, await queue.enqueue("break", {"kill": True}), "failed")
        await finished(admin, await queue.enqueue("break", {"kill": False}))
    assert pids[0] == pids[1] != pids[2]


async def test_a_lent_connection_is_never_held_by_two_blocks_at_once(
    make_queue, admin, kept
) -> None:
    queue = await make_queue(workers=2)
    arrived: list[int] = []
    go = asyncio.Event()
    held: dict[str, list[Any]] = {}

    @queue.handler("hold")
    async def hold(args: dict[str, Any]) -> None:
        async with queue.pool.connection() as outer, queue.pool.connection() as nested:
            child: list[Any] = []
            in_block = asyncio.Event()

            async def in_a_task() -> None:
                async with queue.pool.connection() as conn:
                    child.append(conn)
                    in_block.set()
                    await go.wait()

            task = asyncio.create_task(in_a_task())
            await in_block.wait()
            held[args["k"]] = [outer, nested, *child]
            arrived.append(1)
            if len(arrived) == 2:
                go.set()
            await go.wait()  # both runs (and their tasks) hold their connections at once
            await task

    async with running(queue):
        first = await queue.enqueue("hold", {"k": "a"})
        second = await queue.enqueue("hold", {"k": "b"})
        await finished(admin, first)
        await finished(admin, second)
    conns = [conn for group in held.values() for conn in group]
    assert len(conns) == 6 and len({id(conn) for conn in conns}) == 6


async def test_past_the_pools_spare_connections_runs_check_out_as_before(
    make_queue, admin, kept
) -> None:
    queue = await make_queue(workers=3, pool_size=LEND_SPARE + 1)
    arrived: list[int] = []
    go = asyncio.Event()
    outs: list[int] = []

    @queue.handler("hold")
    async def hold(args: dict[str, Any]) -> None:
        async with queue.pool.connection() as conn:
            await conn.execute("SELECT 1")
            outs.append(current_job()._lender.lending.out)
            arrived.append(1)
            if len(arrived) == 3:
                go.set()
            await go.wait()

    async with running(queue):
        jobs = [await queue.enqueue("hold", {}) for _ in range(3)]
        for job in jobs:
            await finished(admin, job)
    assert max(outs) == 1


async def test_sync_handlers_are_lent_nothing(make_queue, admin) -> None:
    queue = await make_queue()
    lenders: list[Any] = []

    @queue.handler("sync")
    def in_a_thread(args: dict[str, Any]) -> None:
        lenders.append(current_job()._lender)

    async with running(queue):
        await finished(admin, await queue.enqueue("sync", {}))
    assert lenders == [None]


async def test_a_lent_run_shows_no_connection_in_its_context(make_queue, admin, kept) -> None:
    queue = await make_queue()
    texts: list[str] = []

    @queue.handler("secret")
    async def secret(args: dict[str, Any]) -> None:
        async with queue.pool.connection() as conn:
            await conn.execute("SELECT 1")
            texts.append(repr(current_job()))

    async with running(queue):
        await finished(admin, await queue.enqueue("secret", {"card": "4111-1111-1111-1111"}))
    assert "4111" not in texts[0] and "Lender" not in texts[0] and "Connection" not in texts[0]
